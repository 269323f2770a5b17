"""Record when RQ jobs start, for ``delayq spark audit``: one ``executed`` record per run.

Run workers with the audit worker class and an audit log in the environment::

    DELAYQ_AUDIT_DIR=/var/log/delayq rq worker --worker-class delayq_backends.rq.audit.AuditWorker \\
        --queue-class delayq_backends.rq.Queue default
"""

from __future__ import annotations

import time
from typing import Any

from rq import Worker
from rq.job import Job

from ..audit import EXECUTED, AuditRecord, AuditSink, audit_from_env
from .jobs import KIND

__all__ = ["AuditWorker"]


class AuditWorker(Worker):
    """An ``rq.Worker`` that logs each job as it hands it to a work horse.

    The record is written by the long-lived worker process, before the fork, so a work horse
    that exits at once loses nothing. Without ``DELAYQ_AUDIT_DIR``/``DELAYQ_AUDIT_STREAM`` it is
    a plain worker.
    """

    audit: AuditSink | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.audit is None:
            self.audit = audit_from_env(stem="executed")

    def execute_job(self, job: Job, queue: Any) -> Any:
        if self.audit is not None:
            now = time.time_ns() // 1_000_000
            left = int(job.retries_left or 0)  # differs between retries: that is all audits need
            self.audit.record([AuditRecord(EXECUTED, job.id, KIND, str(job.origin), None, now, left, self.name)])
        return super().execute_job(job, queue)
