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
beside the job hash (:func:`~delayq_backends.rq.target.slot_token_key`); the worker reads it at the
start and reports with it (a report without it does not count). A job's groups
(``meta["delayq_group"]``, ``Queue.enqueue(..., delayq_group=...)``) are held the same way, each
by its key with that token (one report per group): a slot is a group. A rate key is a group too,
but one that paces starts, not running jobs, so the worker reports nothing for it.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from rq import SimpleWorker, Worker
from rq.job import Job

from ..envelope import Group, Slot
from ..errors import DelayqError
from ..slots import SlotGuard, held_groups
from ..store import RUN_HOLD_MS, SlotRun, slot_member
from .batches import BatchReports
from .queue import GROUP_META, SLOT_META, env_int, store_of_connection
from .target import slot_token_key
from .tracing import TracedJobs

__all__ = ["SLOT_HOLD_ENV", "SlotSimpleWorker", "SlotWorker", "Slots"]

log = logging.getLogger("delayq.rq.slots")

SLOT_HOLD_ENV = "DELAYQ_SLOT_HOLD"
_MAX_HOLD = 3600


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
        run, keys = SlotRun(slot_member(job.id, None), self._slot_token(job)), [g.key for g in groups]
        guard.start(keys, run)
        try:
            return super().execute_job(job, queue)  # type: ignore[misc]
        finally:
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
