"""RQ worker-side dedupe: a worker class that drops a second delivery of a started job run.

    rq worker --worker-class delayq_backends.rq.DedupeWorker --queue-class delayq_backends.rq.Queue

(:class:`DedupeSimpleWorker` for ``SimpleWorker``.) The store is the one the worker's queues
use (:func:`~delayq_backends.rq.queue.store_of_connection`: ``DELAYQ_URL``, ``DELAYQ_PREFIX``,
``DELAYQ_SHARDS``); ``DELAYQ_DEDUPE_TTL`` sets how long a run's record is kept, in seconds
(default 86400).

The check runs in the worker process after the job id left the queue and before the work
horse is forked: a duplicate is removed from RQ's intermediate queue (RQ 2+), its job hash is
left untouched (it belongs to the run that started first), and it is logged and counted.

A run is ``(job id, retry number)``: RQ 3 counts ``number_of_retries`` up, RQ 1.16 and 2.x
count ``retries_left`` down, so a retry is a new run either way. Jobs that repeat under one
id (RQ's ``Repeat``, a :class:`~delayq_backends.rq.Scheduler` interval or cron job) are not
deduplicated: their runs cannot be told apart from duplicates, so they always run.

The forwarder's RQ target already skips a job that is no longer ``scheduled`` and, when RQ's
Redis is the store's server, enqueues and acks in one transaction; this worker covers the
rest (a store on another server, a job re-enqueued by hand).
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from rq import SimpleWorker, Worker
from rq.job import Job

from ..dedupe import RunGuard, Verdict
from ..errors import DelayqError
from .batches import BatchReports
from .queue import env_int, store_of_connection
from .slots import Slots
from .tracing import TracedJobs

__all__ = ["DEDUPE_TTL_ENV", "DedupeSimpleWorker", "DedupeWorker", "job_run"]

log = logging.getLogger("delayq.rq.dedupe")

DEDUPE_TTL_ENV = "DELAYQ_DEDUPE_TTL"
_DEFAULT_TTL = 86400


def job_run(job: Job) -> int | None:
    """The run of ``job`` as the dedupe record names it, or None for a job that repeats."""
    meta = job.meta or {}
    if getattr(job, "repeats_left", None) is not None or meta.get("interval") or meta.get("cron_string"):
        return None
    retries = getattr(job, "number_of_retries", None)
    if retries is not None:
        return int(retries)
    return -int(job.retries_left or 0)  # counts down toward 0 with each retry (RQ < 3)


def _ttl_ms() -> int:
    seconds = env_int(DEDUPE_TTL_ENV, str(_DEFAULT_TTL), "seconds a run is remembered", low=1, high=366 * 86400)
    return seconds * 1000


class _Dedupe:
    """The check, shared by both worker classes (mixed in before RQ's)."""

    connection: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ttl_ms = _ttl_ms()  # a bad setting stops the worker at start, not each job
        self._guard: RunGuard | None = None
        super().__init__(*args, **kwargs)

    def execute_job(self, job: Job, queue: Any) -> Any:
        if self._should_run(job, queue):
            return super().execute_job(job, queue)  # type: ignore[misc]
        return None

    def _should_run(self, job: Job, queue: Any) -> bool:
        run = job_run(job)
        if run is None:
            return True
        try:
            if self._guard is None:
                store = getattr(queue, "delay_store", None) or store_of_connection(self.connection)
                self._guard = RunGuard(store, ttl_ms=self._ttl_ms)
        except (DelayqError, RedisError, OSError) as exc:
            log.warning("dedupe: no delay store (%s): job %s runs unchecked (at-least-once)", exc, job.id)
            return True
        decision = self._guard.start(job.id, run)
        if decision.verdict is not Verdict.DUPLICATE:
            return True
        log.warning(
            "dedupe: job %s run %d was started before (%s, record %s): duplicate delivery dropped, not run",
            job.id,
            run,
            decision.first,
            decision.key,
        )
        intermediate = getattr(queue, "intermediate_queue_key", None)
        if intermediate:  # RQ 2+ parks a dequeued id there until the job starts
            self.connection.lrem(intermediate, 1, job.id)
        return False


class DedupeWorker(_Dedupe, BatchReports, Slots, TracedJobs, Worker):
    """``rq.Worker`` (forking) that drops a second delivery of a started job run, holds its
    jobs' concurrency slots (a dropped duplicate holds none: its first run has the slot),
    reports its batch sub-jobs' ends and runs each job in its producer's trace when tracing is on."""


class DedupeSimpleWorker(_Dedupe, BatchReports, Slots, TracedJobs, SimpleWorker):
    """``rq.SimpleWorker`` (no fork) that drops a second delivery of a started job run, holds
    its jobs' concurrency slots, reports its batch sub-jobs' ends and runs each job in its
    producer's trace when tracing is on."""
