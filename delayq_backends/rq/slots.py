"""RQ's side of concurrency slots (:mod:`delayq_backends.slots`): the worker holds a job's slot
while the job runs and gives it back when it ends.

    rq worker --worker-class delayq_backends.rq.SlotWorker --queue-class delayq_backends.rq.Queue

(:class:`SlotSimpleWorker` for ``SimpleWorker``; the dedupe workers hold slots too.)
``DELAYQ_SLOT_HOLD`` sets how long a hold lasts after the job's start or the last heartbeat, in
seconds (default 60; a heartbeat every third of it): what a worker killed mid-job costs. A job with
``meta["delayq_slot"]`` (``Queue.enqueue(..., delayq_slot=...)``) is held from just before the
work horse is forked until ``execute_job`` returns (success, failure, a retry scheduled, a job
timeout), kept by a heartbeat thread of the worker process meanwhile. A worker process that dies
gives its slots back when their holds lapse. A slot's member is the job id: the forwarder's RQ
target names no run, so a retry released before its first run's ``execute_job`` has returned
shares that run's slot for the moment between the two. The forwarder's token for the slot waits
beside the job hash (:func:`~delayq_backends.rq.jobs.slot_token_key`); the worker reads it at the
start and reports with it (a report without it does not count). A job's groups
(``meta["delayq_group"]``, ``Queue.enqueue(..., delayq_group=...)``) are held the same way, each
by its key with that token (one report per group): a slot is a group. A rate key is a group too,
but one that paces starts, not running jobs, so the worker reports nothing for it.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from rq import SimpleWorker, Worker, get_current_job
from rq.job import Job

from ..envelope import Group, Slot
from ..errors import DelayqError, InvalidGroupPolicyError
from ..slots import SlotGuard, held_groups
from ..store import RUN_HOLD_MS, SlotRun, slot_member
from .batches import BatchReports
from .jobs import slot_token_key
from .queue import GROUP_META, SLOT_META, env_int, store_of_connection
from .tracing import TracedJobs

__all__ = ["SLOT_HOLD_ENV", "SlotSimpleWorker", "SlotWorker", "Slots", "throttle"]

log = logging.getLogger("delayq.rq.slots")

SLOT_HOLD_ENV = "DELAYQ_SLOT_HOLD"
_MAX_HOLD = 3600
#: The grouped jobs this process runs: job id -> (guard, group keys, run). Set by the worker
#: before it forks the work horse, which inherits it: what :func:`throttle` proves its job by.
_running: dict[str, tuple[SlotGuard, tuple[str, ...], SlotRun]] = {}


def throttle(group: str, retry_after: float = 30) -> None:
    """From inside a job of ``group``: stop the group releasing for ``retry_after`` seconds (at
    most an hour) at every forwarder, say when an upstream API answers "429, retry after 30 s".
    Jobs already released run; the waiting ones are not counted as attempts (what to do with the
    current job is yours). Needs a slot worker (``SlotWorker``, ``SlotSimpleWorker``, the dedupe
    workers): the report carries proof of the job's slot token, so a worker throttles only a
    group whose job it runs; it takes effect at the group's next release by any forwarder.

    Raises:
        InvalidGroupPolicyError: called outside a job, from a job not of ``group`` (or not run
            by a slot worker, or released without a token), or with ``retry_after`` out of
            range; nothing was reported.
    """
    job = get_current_job()
    running = None if job is None else _running.get(job.id)
    if running is None or group not in running[1] or not running[2].token:
        where = "outside a job" if job is None else f"in job {job.id}"
        raise InvalidGroupPolicyError(
            f"throttle({group!r}) {where}: a worker throttles only the group of the job it runs, from inside that "
            "job, on a slot worker (delayq_backends.rq.SlotWorker), released with the group's slot token"
        )
    guard, _, run = running
    guard.throttle(group, run, retry_after)


def _hold_ms() -> int:
    seconds = env_int(
        SLOT_HOLD_ENV, str(RUN_HOLD_MS // 1000), "seconds a killed worker's slots stay taken", low=1, high=_MAX_HOLD
    )
    return seconds * 1000


class Slots:
    """The slot holds, mixed into a worker class before RQ's."""

    connection: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slot_hold_ms = _hold_ms()  # a bad setting stops the worker at start, not each job
        self._slot_guard: SlotGuard | None = None
        super().__init__(*args, **kwargs)

    def execute_job(self, job: Job, queue: Any) -> Any:
        groups = self._groups_of(job)
        guard = None if not groups else self._slots_guard(queue)
        if guard is None:
            return super().execute_job(job, queue)  # type: ignore[misc]
        run, keys = SlotRun(slot_member(job.id, None), self._slot_token(job)), tuple(g.key for g in groups)
        guard.start(keys, run)
        _running[job.id] = (guard, keys, run)
        try:
            return super().execute_job(job, queue)  # type: ignore[misc]
        finally:
            _running.pop(job.id, None)
            guard.end(keys, run)

    def _slot_token(self, job: Job) -> str:
        """The token the forwarder took the job's slot with ("" when none waits: a job released
        by an earlier forwarder, or a periodic run's tokenless overlap hold)."""
        try:
            raw = self.connection.getdel(slot_token_key(job.key))
        except (RedisError, OSError) as exc:
            log.warning("job %s: could not read its slot token (%s); its slot lapses by itself", job.id, exc)
            return ""
        return raw.decode("ascii", "replace") if isinstance(raw, bytes) else ""

    @classmethod
    def _groups_of(cls, job: Job) -> tuple[Group, ...]:
        """The job's groups that hold slots while it runs: its meta's groups, then its slot."""
        return held_groups((job.meta or {}).get(GROUP_META), cls._slot_of(job), f"job {job.id}: meta {GROUP_META}")

    @staticmethod
    def _slot_of(job: Job) -> Slot | None:
        value = (job.meta or {}).get(SLOT_META)
        if value is None:
            return None
        try:
            return Slot.parse(value)
        except DelayqError as exc:
            log.warning("job %s: %s", job.id, exc)
            return None

    def _slots_guard(self, queue: Any) -> SlotGuard | None:
        if self._slot_guard is None:
            try:
                store = getattr(queue, "delay_store", None) or store_of_connection(self.connection)
            except (DelayqError, RedisError, OSError) as exc:
                log.warning("slots: no delay store (%s); the job's slot lapses by itself", exc)
                return None
            self._slot_guard = SlotGuard(store, hold_ms=self._slot_hold_ms)
        return self._slot_guard


class SlotWorker(BatchReports, Slots, TracedJobs, Worker):
    """``rq.Worker`` (forking) that holds its jobs' concurrency slots while they run, reports its
    batch sub-jobs' ends and runs each job in its producer's trace when tracing is on."""


class SlotSimpleWorker(BatchReports, Slots, TracedJobs, SimpleWorker):
    """``rq.SimpleWorker`` (no fork) that holds its jobs' concurrency slots while they run, reports
    its batch sub-jobs' ends and runs each job in its producer's trace when tracing is on."""
