"""Jobs the benches' ``rq worker`` processes run (importable as ``lib.rq_jobs`` with ``bench/``
on the path): each records its start on ``<queue>:runs``."""

from __future__ import annotations

import json
import time
from typing import Any

from rq import get_current_job

__all__ = ["record", "runs_key"]


def runs_key(queue_name: str) -> str:
    return f"{queue_name}:runs"


def record(tag: Any) -> str:
    """Record this run (id, tag, start time) on the job's queue's runs list."""
    job = get_current_job()
    assert job is not None
    job.connection.rpush(runs_key(job.origin), json.dumps({"id": job.id, "tag": tag, "at": time.time()}))
    return str(tag)
