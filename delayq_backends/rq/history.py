"""RQ's side of periodic entries' history (:mod:`delayq_backends.periodic.history`).

A run of a periodic entry carries ``job.meta["delayq_periodic"]`` (its entry and period). A
worker with :class:`PeriodicReports` mixed in records its start and its end::

    rq worker --worker-class delayq_backends.rq.history.PeriodicWorker

(or ``class MyWorker(PeriodicReports, SlotWorker)`` for a worker class of your own). The start
is recorded when RQ prepares the job's execution; the end as ``success``, ``failure`` (final)
or ``retry`` (RQ scheduled or queued it again). A report that cannot be written (the store away)
is logged and the job runs on: history never gates a run.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from rq.job import Job, JobStatus

from ..periodic.history import RUN_HEADER, RunMark, record_finished, record_started, reported
from .queue import store_of_connection
from .slots import SlotSimpleWorker, SlotWorker

__all__ = ["PeriodicReports", "PeriodicSimpleWorker", "PeriodicWorker"]

log = logging.getLogger("delayq.rq.history")


class PeriodicReports:
    """The history reports of periodic entries' runs, mixed into a worker class before RQ's."""

    connection: Any

    def prepare_job_execution(self, job: Job, *args: Any, **kwargs: Any) -> Any:
        result = super().prepare_job_execution(job, *args, **kwargs)  # type: ignore[misc]
        mark = _mark(job)
        if mark is not None:
            with reported(f"start of run {job.id} of {mark.name!r}"):
                record_started(store_of_connection(self.connection), mark, job.id)
        return result

    def handle_job_success(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().handle_job_success(job, queue, *args, **kwargs)  # type: ignore[misc]
        self._report_run_end(job, "success")
        return result

    def handle_job_failure(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().handle_job_failure(job, queue, *args, **kwargs)  # type: ignore[misc]
        if _mark(job) is not None:
            try:  # RQ marked it: failed (final), or scheduled/queued again (a retry)
                final = job.get_status(refresh=True) in (JobStatus.FAILED, JobStatus.STOPPED)
            except RedisError:
                final = True
            self._report_run_end(job, "failure" if final else "retry")
        return result

    def _report_run_end(self, job: Job, outcome: str) -> None:
        mark = _mark(job)
        if mark is not None:
            with reported(f"end of run {job.id} of {mark.name!r}"):
                record_finished(store_of_connection(self.connection), mark, job.id, outcome)


def _mark(job: Job) -> RunMark | None:
    return RunMark.parse((job.meta or {}).get(RUN_HEADER))


class PeriodicWorker(PeriodicReports, SlotWorker):
    """``rq.Worker`` (forking) that records periodic runs' starts and ends, holds its jobs'
    concurrency slots and reports its batch sub-jobs' ends."""


class PeriodicSimpleWorker(PeriodicReports, SlotSimpleWorker):
    """``rq.SimpleWorker`` (no fork) that records periodic runs' starts and ends, holds its jobs'
    concurrency slots and reports its batch sub-jobs' ends."""
