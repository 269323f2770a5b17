"""An RQ job as the delay store keeps it (its envelope) and as RQ's job hash holds it (the
plain fields the move reads), and one queue's share of a batch being moved (see :mod:`.target`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rq import Queue as RQQueue
from rq.job import Job
from rq.serializers import DefaultSerializer

from ..envelope import Envelope
from ..targets import SLOT_TOKEN, Delivery
from .allowlist import dotted_path
from .failed import MARK

__all__ = [
    "AT_FRONT_RANK",
    "FIELDS",
    "JOB_KEY",
    "KIND",
    "OVERLAP_FIELD",
    "SCHEDULE_KEY",
    "SCHEDULER_FLAG",
    "SKIPPED_FIELD",
    "SLOT_TOKEN_TTL_MS",
    "UPGRADE_COMMAND",
    "JobFields",
    "MoveBatch",
    "QueueKeys",
    "is_legacy_scheduler",
    "job_envelope",
    "job_id_of",
    "job_rank",
    "schedule_of",
    "slot_token_key",
    "text",
]

KIND = "rq"

#: Envelope meta key of the job id when the store item has another id: a debounced or throttled
#: job is item ``debounce:<key>`` (``throttle:<key>``), and each run of it is a job of its own.
JOB_KEY = "job"
#: Envelope meta keys naming the classes a job was scheduled with (omitted when RQ's default).
_CLASS_KEYS = ("queue_class", "job_class", "serializer")
#: Envelope meta flag: the job came from :class:`~delayq_backends.rq.Scheduler` (rq-scheduler
#: semantics: dependencies are checked when it is due, and it may be periodic).
SCHEDULER_FLAG = "scheduler"
#: Envelope meta key of a Scheduler job's schedule: rq-scheduler's ``job.meta`` keys
#: (``interval``, ``repeat``, ``cron_string``, ``use_local_timezone``), ``{}`` for a one-off run.
#: The forwarder counts ``repeat`` down here, in JSON, because it never reads ``job.meta``.
SCHEDULE_KEY = "schedule"
#: Schedule keys of a periodic job's overlap policy (:mod:`delayq_backends.overlap_policy`) and
#: of the periods it skipped so far (counted here, as ``repeat`` is).
OVERLAP_FIELD = "overlap"
SKIPPED_FIELD = "skipped"
_SCHEDULE_FIELDS = ("interval", "repeat", "cron_string", "use_local_timezone")
#: The command that puts the schedule of a 0.1 Scheduler job (in its pickled ``job.meta``) into
#: its envelope, on the operator's side: named by the forwarder's dead-letter reason.
UPGRADE_COMMAND = "delayq rq-upgrade"
#: The store rank of a job that will be enqueued at the front of its queue: under a backlog,
#: the forwarder moves it before the jobs that queue behind (rank 0).
AT_FRONT_RANK = 1

#: The job hash fields the move reads: text and integers only, never ``data``, ``meta`` or ``result``.
FIELDS = (
    "status", "created_at", "timeout", "ttl", "enqueue_at_front", "enqueue_at_front_on_retry", "ended_at",
    "dependency_ids", "dependency_id", "allow_dependency_failures", "rate_limit_key", "rate_limit_concurrency", MARK,
)  # fmt: skip


def schedule_of(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The repeat/cron schedule in a job's ``meta`` (rq-scheduler's keys), for its envelope."""
    return {k: meta[k] for k in _SCHEDULE_FIELDS if meta.get(k) is not None}


def is_legacy_scheduler(envelope: Envelope) -> bool:
    """An RQ envelope of a Scheduler job written by delayq_backends 0.1: no schedule in it (the
    schedule is in the job's ``meta``). See :mod:`delayq_backends.rq.upgrade`."""
    return envelope.target == KIND and bool(envelope.meta.get(SCHEDULER_FLAG)) and SCHEDULE_KEY not in envelope.meta


def job_envelope(
    queue_name: str,
    *,
    queue_class: type | None = None,
    job_class: type | None = None,
    serializer: Any = None,
    scheduler: bool = False,
    schedule: Mapping[str, Any] | None = None,
) -> Envelope:
    """What the delay store keeps for one RQ job: its queue, the classes to move it with and,
    for a Scheduler's job, its schedule (``{}`` when it runs once)."""
    meta: dict[str, Any] = {}
    defaults = (RQQueue, Job, DefaultSerializer)
    for key, value, default in zip(_CLASS_KEYS, (queue_class, job_class, serializer), defaults):
        if value is not None and value is not default:
            meta[key] = dotted_path(value)
    if scheduler:
        meta[SCHEDULER_FLAG] = True
        meta[SCHEDULE_KEY] = dict(schedule or {})
    return Envelope(target=KIND, destination=queue_name, meta=meta)


def job_id_of(delivery: Delivery) -> str:
    """The RQ job a delivery moves: its envelope's ``job``, else the item id (every job that is
    not debounced or throttled).

    Raises:
        ValueError: the envelope's ``job`` is no job id (written by another tool).
    """
    job_id = delivery.envelope.meta.get(JOB_KEY, delivery.id)
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"its envelope's job id {str(job_id)[:40]!r} is not a job id (written by another tool)")
    return job_id


def enqueues_at_front(job: Job) -> bool:
    """Whether RQ puts ``job`` at the front of its queue when it is enqueued (a retry may too)."""
    return job.should_enqueue_at_front() if hasattr(job, "should_enqueue_at_front") else bool(job.enqueue_at_front)


def job_rank(job: Job) -> int:
    """The delay store rank of ``job``: :data:`AT_FRONT_RANK` when it goes to the front, else 0."""
    return AT_FRONT_RANK if enqueues_at_front(job) else 0


def text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


def _flag(raw: bytes | None) -> bool:
    return bool(int(raw)) if raw else False


@dataclass(frozen=True)
class JobFields:
    """What the move knows of a job: the plain fields of its hash RQ's enqueue decides by.

    Parsed as RQ's ``Job.restore`` parses them (``int``, ``json.loads`` of a list of ids), so a
    value RQ could not read either is refused here, with the field named.
    """

    status: str
    timeout: bytes | None
    ttl: int | None
    at_front: bool
    dependency_ids: tuple[str, ...]
    allow_dependency_failures: bool
    rate_limit_key: str | None
    rate_limit_concurrency: int | None
    #: failed by a forwarder that dead-lettered it (see :mod:`.failed`): True while it is as that
    #: left it (``delayq dlq requeue`` moves it), False once RQ's requeue has run it; None: never
    dead_letter: bool | None = None

    @classmethod
    def parse(cls, values: Sequence[bytes | None]) -> JobFields | None:
        """From HMGET of :data:`FIELDS`; None when the hash is gone. Raises ValueError naming a bad field.

        The usual job (a Queue's, with no TTL, dependency or rate limit) takes a short path: this
        runs once per job moved, so it is a visible part of a forwarder's time."""
        status, _, timeout, ttl, front, front_retry, ended, dep_ids, dep_id, allow, limit_key, limit, mark = values
        rare = (ttl, front_retry, dep_ids, dep_id, limit_key, mark)
        if all(v is None for v in rare):
            if status is None and front is None and timeout is None and _ is None and all(v is None for v in values):
                return None
            if front in (None, b"0", b"1") and allow in (None, b"0", b"1") and limit in (None, b""):
                return cls(
                    status=status.decode("utf-8", "replace") if status else "created",
                    timeout=timeout,
                    ttl=None,
                    at_front=front == b"1",
                    dependency_ids=(),
                    allow_dependency_failures=allow == b"1",
                    rate_limit_key=None,
                    rate_limit_concurrency=None,
                )
        return cls._parse_checked(values)

    @classmethod
    def _parse_checked(cls, values: Sequence[bytes | None]) -> JobFields | None:
        raw = dict(zip(FIELDS, values))
        if all(v is None for v in values):
            return None
        name = "?"
        try:
            name = "ttl"
            ttl = int(raw["ttl"]) if raw["ttl"] else None
            name = "enqueue_at_front"
            front = _flag(raw["enqueue_at_front"])
            name = "enqueue_at_front_on_retry"
            front = front or (_flag(raw["enqueue_at_front_on_retry"]) and bool(raw["ended_at"]))
            name = "dependency_ids"
            deps = json.loads(raw["dependency_ids"]) if raw["dependency_ids"] else [text(raw["dependency_id"])]
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps if d is not None):
                raise ValueError("not a JSON list of job ids")
            name = "allow_dependency_failures"
            allow = _flag(raw["allow_dependency_failures"])
            name = "rate_limit_concurrency"
            concurrency = int(raw["rate_limit_concurrency"]) if raw["rate_limit_concurrency"] else None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"field {name!r} is {raw.get(name)!r}, which RQ cannot read either ({exc})") from exc
        return cls(
            status=text(raw["status"]) or "created",  # as RQ reads a hash without one (JobStatus.CREATED)
            timeout=raw["timeout"],
            ttl=ttl,
            at_front=front,
            dependency_ids=tuple(d for d in deps if d),
            allow_dependency_failures=allow,
            rate_limit_key=text(raw["rate_limit_key"]),
            rate_limit_concurrency=concurrency,
            dead_letter=None if raw[MARK] is None else raw["status"] == b"failed" and raw[MARK] == raw["ended_at"],
        )


@dataclass(frozen=True)
class QueueKeys:
    """Where one queue's jobs go, from its (allowed) queue and job classes' key prefixes."""

    name: str
    queue_class: type[RQQueue]
    job_class: type[Job]

    @property
    def queue(self) -> str:
        return self.queue_class.redis_queue_namespace_prefix + self.name

    @property
    def default_timeout(self) -> int:
        return int(getattr(self.queue_class, "DEFAULT_TIMEOUT", 180))

    def job(self, job_id: str) -> str:
        return self.job_class.key_for(job_id)

    def dependents(self, job_id: str) -> str:
        return self.job_class.dependents_key_for(job_id)

    def dependencies(self, job_id: str) -> str:
        return f"{self.job_class.redis_job_namespace_prefix}:{job_id}:dependencies"  # as Job.dependencies_key


@dataclass
class MoveBatch:
    """One queue's share of a claimed batch, sorted into what to do with each job."""

    keys: QueueKeys
    #: by job id (see :func:`job_id_of`); the store knows them by ``deliveries[job_id].id``
    deliveries: dict[str, Delivery]
    #: "now" in ms for the whole batch (:meth:`RQTarget._now_ms`)
    now_ms: int
    held: list[str] = field(default_factory=list)
    jobs: dict[str, JobFields] = field(default_factory=dict)
    deferred: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    broken: list[tuple[str, str]] = field(default_factory=list)
    following: dict[str, tuple[float, Envelope]] = field(default_factory=dict)
    #: jobs whose overlap policy took their slot for this run, and the periods each passed over
    #: while it waited for it (``buffer_one``)
    granted: dict[str, int] = field(default_factory=dict)
    #: each job's hash key, made once per batch (a move reads and writes each several times)
    job_keys: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.job_keys = {i: self.keys.job(i) for i in self.deliveries}

    @property
    def ids(self) -> list[str]:
        return list(self.deliveries)

    def items(self, job_ids: Iterable[str]) -> list[str]:
        """The store's item ids of ``job_ids``."""
        return [self.deliveries[j].id for j in job_ids]

    def from_scheduler(self, job_id: str) -> bool:
        return bool(self.deliveries[job_id].envelope.meta.get(SCHEDULER_FLAG))


#: How long a job's slot token waits for its worker (a day: far above any broker wait).
SLOT_TOKEN_TTL_MS = 86_400_000


def slot_token_key(job_key: str) -> str:
    """The key in RQ's Redis holding the slot token of the job whose hash is ``job_key``."""
    return f"{job_key}:{SLOT_TOKEN}"
