"""Job functions the tests' real `rq worker` processes import (as ``tests.test_rq.jobs.*``).

Each run appends ``{"id", "tag", "at"}`` (and a periodic run's ``periodic`` mark) to the Redis
list ``<queue name>:runs``, so a test sees every run, its job id and its start time (the
worker's clock, the same machine's as the test's).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timezone
from typing import Any

from rq import get_current_job
from rq.job import Job

from delayq_backends.rq import Queue as DelayqQueue


def runs_key(queue_name: str) -> str:
    return f"{queue_name}:runs"


def record(tag: Any, *, times: int = 1) -> str:
    """Record this run; return a result the test can check."""
    job = get_current_job()
    assert job is not None
    entry = {"id": job.id, "tag": tag, "at": time.time()}
    if "delayq_group" in job.meta:  # what the worker holds the job's groups by
        entry["group"] = job.meta["delayq_group"]
    if "delayq_periodic" in job.meta:  # a periodic entry's run: its entry, period, kind, and when it was sent
        entry["periodic"] = job.meta["delayq_periodic"]
        sent = job.enqueued_at
        entry["sent"] = None if sent is None else sent.replace(tzinfo=sent.tzinfo or timezone.utc).timestamp()
    job.connection.rpush(runs_key(job.origin), json.dumps(entry))
    return f"{tag}x{times}"


def hold(tag: Any, seconds: float) -> None:
    """Run for ``seconds``; record this run with its own start and end (the slot tests' intervals)."""
    job = get_current_job()
    assert job is not None
    began = time.time()
    time.sleep(seconds)
    entry = {"id": job.id, "tag": tag, "at": began, "ended": time.time()}
    job.connection.rpush(runs_key(job.origin), json.dumps(entry))


def throttles(tag: Any, group: str, seconds: float) -> None:
    """Throttle ``group`` (one of this job's) for ``seconds``, as a job told "429" would; record the run."""
    from delayq_backends.rq import throttle

    throttle(group, retry_after=seconds)
    record(tag)


def started(tag: Any, seconds: float) -> None:
    """Record the start with the pids of this work horse and its worker, then run ``seconds``."""
    job = get_current_job()
    assert job is not None
    entry = {"id": job.id, "tag": tag, "at": time.time(), "pids": [os.getpid(), os.getppid()]}
    job.connection.rpush(runs_key(job.origin), json.dumps(entry))
    time.sleep(seconds)


def span(tag: Any, seconds: float) -> None:
    """Record the start and the end (``tests/slot_proof.py``'s records), with the work horse's pid."""
    job = get_current_job()
    assert job is not None

    def mark(phase: str) -> None:
        entry = {"id": job.id, "tag": tag, "phase": phase, "at_ms": time.time_ns() // 1_000_000, "pid": os.getpid()}
        job.connection.rpush(runs_key(job.origin), json.dumps(entry))

    mark("began")
    time.sleep(seconds)
    mark("ended")


def always_fails(tag: Any) -> None:
    """Record this run, then fail (for retries)."""
    record(tag)
    raise ValueError(f"{tag} fails on purpose")


def batch_done(summary: dict[str, Any]) -> None:
    """A batch's on_complete: record the summary it was called with."""
    job = get_current_job()
    assert job is not None
    entry = {"id": job.id, "tag": "done", "at": time.time(), "summary": summary}
    job.connection.rpush(runs_key(job.origin), json.dumps(entry))


class AuditedJob(Job):
    """A custom job class, as `rq worker --job-class` takes it."""


class MyQueue(DelayqQueue):
    """A user's own subclass of delayq's Queue, in the user's package (first contact: issue 22)."""


def throttling(tag: Any, group: str, seconds: float) -> None:
    """Throttle ``group`` for ``seconds`` (``delayq_backends.rq.throttle``) and record this run
    with the outcome: "throttled", or "refused: <why>"."""
    from delayq_backends.errors import DelayqError
    from delayq_backends.rq import throttle

    job = get_current_job()
    assert job is not None
    try:
        throttle(group, retry_after=seconds)
        outcome = "throttled"
    except DelayqError as exc:
        outcome = f"refused: {exc}"
    entry = {"id": job.id, "tag": tag, "at": time.time(), "outcome": outcome}
    job.connection.rpush(runs_key(job.origin), json.dumps(entry))


def probe(tag: Any) -> str:
    """Record this run with the job options its worker sees (timeout, result_ttl, ttl, meta, the
    retries left and their intervals, the callbacks); the first try fails while two retries are
    left, so a retry runs it again (the periodic entries' run options test)."""
    job = get_current_job()
    assert job is not None
    seen = {
        "timeout": job.timeout, "result_ttl": job.result_ttl, "ttl": job.ttl, "meta": job.meta,
        "retries_left": job.retries_left, "retry_intervals": job.retry_intervals,
        "on_success": job._success_callback_name, "on_failure": job._failure_callback_name,
    }  # fmt: skip
    job.connection.rpush(runs_key(job.origin), json.dumps({"id": job.id, "tag": tag, "at": time.time(), **seen}))
    if job.retries_left == 2:
        raise ValueError("the first try fails on purpose")
    return f"{tag} done"


def on_success(job: Job, connection: Any, result: Any, *args: Any, **kwargs: Any) -> None:
    """An RQ success callback: records the job id and its result."""
    connection.rpush(runs_key(job.origin), json.dumps({"id": job.id, "tag": "success", "result": result}))


def on_failure(job: Job, connection: Any, *exc_info: Any) -> None:
    """An RQ failure callback: records the job id and the error."""
    connection.rpush(runs_key(job.origin), json.dumps({"id": job.id, "tag": "failure", "error": str(exc_info[1])}))
