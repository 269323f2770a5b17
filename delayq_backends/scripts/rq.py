"""The RQ target's scripts as typed calls (see :mod:`delayq_backends.scripts.store`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import ShardKeys
from ..models import ScheduleCounts, ScheduleItem
from .library import ScriptCall
from .store import ScheduleOne, schedule_counts

__all__ = [
    "RqEnqueue",
    "RqFail",
    "RqFailed",
    "RqFields",
    "RqJobWrites",
    "RqMove",
    "RqMoved",
    "RqNewJob",
    "RqRun",
    "RqSchedule",
]

#: Per job hash: its values (None when absent), or the key's type when it is no hash.
JobValues = list[bytes | None] | bytes


class RqFields:
    """rq_fields.lua: the same fields of many RQ job hashes, read in one call."""

    name = "rq_fields"

    @classmethod
    def call(cls, job_keys: Sequence[str], fields: Sequence[str]) -> ScriptCall[list[JobValues]]:
        return ScriptCall(cls.name, tuple(job_keys), tuple(fields), _job_values)


class RqEnqueue:
    """rq_enqueue.lua: the job hash writes of RQ's enqueue for a batch of due jobs of one queue."""

    name = "rq_enqueue"

    @classmethod
    def call(
        cls, job_keys: Sequence[str], *, status: str, origin: str, enqueued_at: str, timeout: str, mask: str
    ) -> ScriptCall[int]:
        """``mask`` has one character per key: "1" writes the queue's ``timeout`` too."""
        return ScriptCall(cls.name, tuple(job_keys), (status, origin, enqueued_at, timeout, mask), int)


@dataclass(frozen=True, slots=True)
class RqJobWrites:
    """The writes RQ's ``schedule_job`` queues for one job, as :class:`RqSchedule` makes them:
    its queue's entry in ``rq:queues``, its job hash, and its mirror entry in ``rq:scheduled:<queue>``.

    Attributes:
        queues_key: ``rq:queues``; queue_key: ``rq:queue:<name>``, the member added there.
        job_key: ``rq:job:<id>``; fields: its field/value pairs, in the order RQ wrote them.
        registry_key: ``rq:scheduled:<queue>``; mirror_score: the job's score there.
    """

    queues_key: str
    queue_key: str
    job_key: str
    fields: tuple[Any, ...]
    registry_key: str
    mirror_score: float


class RqSchedule:
    """rq_schedule.lua: one job's store item and its RQ writes (:class:`RqJobWrites`) in one call."""

    name = "rq_schedule"

    @classmethod
    def call(cls, keys: ShardKeys, item: ScheduleItem, rq: RqJobWrites, *, wake: str) -> ScriptCall[ScheduleCounts]:
        return ScriptCall(
            cls.name,
            (*ScheduleOne.keys_of(keys), rq.queues_key, rq.job_key, rq.registry_key),
            (item.id, item.ready_ms, item.envelope, item.rank, wake, rq.queue_key, rq.mirror_score, *rq.fields),
            schedule_counts,
        )


@dataclass(frozen=True)
class RqMoved:
    """What :class:`RqMove` did with the first ``len(outcomes)`` jobs of its call (the rest are
    the caller's): per job, ``MOVED``, ``GONE``, ``NOT_HELD`` or the status it had instead."""

    MOVED = "="
    GONE = "-"
    NOT_HELD = "~"

    outcomes: list[str]


class RqMove:
    """rq_move.lua: a batch of usual due jobs of one queue moved (and acked) in one call."""

    name = "rq_move"

    @classmethod
    def call(
        cls,
        rq_keys: tuple[str, str, str],
        store_keys: Sequence[str],
        jobs: Sequence[tuple[str, str, str]],
        *,
        lease: str,
        origin: str,
        enqueued_at: str,
        timeout: str,
    ) -> ScriptCall[RqMoved]:
        """``rq_keys``: rq:queues, the queue, its scheduled registry; ``store_keys``: the
        shard's due, items, tries, leased with ``lease``, or none (``lease`` ""); ``jobs``:
        (item id, job id, job key) each."""
        keys = [*rq_keys, *store_keys]
        args = [lease, origin, enqueued_at, timeout]
        for item_id, job_id, job_key in jobs:
            keys.append(job_key)
            args += (item_id, job_id)
        return ScriptCall(cls.name, tuple(keys), tuple(args), _moved)


@dataclass(frozen=True)
class RqFailed:
    """One job for :class:`RqFail`: its keys, and what RQ shows as its failure."""

    job_id: str
    job_key: str
    results_key: str
    #: a Scheduler job (it may wait with its last run's status)
    scheduler: bool
    #: the reason as RQ keeps it in the job hash (zlib) and in a failed Result (base64 of zlib)
    exc_info: bytes
    exc_string: str


class RqFail:
    """rq_fail.lua: dead-lettered jobs of one queue into its FailedJobRegistry."""

    name = "rq_fail"

    @classmethod
    def call(
        cls, failed_key: str, scheduled_key: str, jobs: Sequence[RqFailed], *, now: float, ended_at: str, ttl: int
    ) -> ScriptCall[int]:
        keys: list[str] = [failed_key, scheduled_key]
        args: list[Any] = [now, ended_at, ttl]
        for job in jobs:
            keys += (job.job_key, job.results_key)
            args += (job.job_id, "1" if job.scheduler else "0", job.exc_info, job.exc_string)
        return ScriptCall(cls.name, tuple(keys), tuple(args), int)


@dataclass(frozen=True)
class RqNewJob:
    """One new job for :class:`RqRun`: its id, hash key, hash fields and TTL (None: none)."""

    job_id: str
    job_key: str
    fields: Mapping[str, Any]
    ttl: int | None = None


class RqRun:
    """rq_run.lua: new jobs of one queue written and pushed in one call, each once (a job whose
    hash exists is left alone): per job, True when this call enqueued it."""

    name = "rq_run"

    @classmethod
    def call(cls, queues_key: str, queue_key: str, jobs: Sequence[RqNewJob]) -> ScriptCall[list[bool]]:
        args: list[Any] = []
        for job in jobs:
            args += (job.job_id, "" if job.ttl is None else job.ttl, len(job.fields))
            for name, value in job.fields.items():
                args += (name, value)
        keys = (queues_key, queue_key, *(job.job_key for job in jobs))
        return ScriptCall(cls.name, keys, tuple(args), _written)


def _written(reply: Any) -> list[bool]:
    return [o in (b"=", "=") for o in reply]


def _job_values(reply: Any) -> list[JobValues]:
    return list(reply)


def _moved(reply: Any) -> RqMoved:
    handled, *outcomes = reply
    assert int(handled) == len(outcomes), reply
    return RqMoved([o.decode("utf-8", "replace") if isinstance(o, bytes) else str(o) for o in outcomes])
