"""The forwarder's RQ target: put a due job into its queue the way RQ's own scheduler does.

The job hash stays where RQ keeps it (``rq:job:<id>``); the delay store only holds the job id,
the queue name, the classes to use and (for a :class:`~delayq_backends.rq.Scheduler` job) its
repeat or cron schedule, so the forwarder needs none of the application's code.

**Nothing in a job hash is deserialized here.** The move reads only the plain text and integer
fields that RQ's enqueue decides by (status, timeout, ttl, at-front flags, dependency ids,
rate-limit key) and writes what ``Queue._enqueue_job`` writes (status ``queued``, ``origin``,
``enqueued_at``, the default timeout, the TTL, the push onto the queue, ``rq:queues``); it never
calls ``Job.fetch``, ``Job.restore``, ``Job.save`` or a serializer, so a pickle planted in
``data`` or ``meta`` runs, if anywhere, in an RQ worker, never in the forwarder. The only code
the forwarder imports from an envelope is a queue or job class on its allowlist
(:class:`ClassAllowlist`), and only to read its key prefixes.

The usual job (a Queue's, status ``scheduled``, no TTL, dependency, rate limit or dead-letter
mark) moves by one ``rq_move`` script call per batch, which reads, writes and pushes in one
atomic step; when RQ's Redis is the delay store's own server the script also checks the claim's
lease and acks (an exactly-once hand-off). From the first job it cannot take on, the rest of the
batch moves in one MULTI/EXEC on RQ's Redis, with every job key (and each dependency's)
WATCHed, so a job cancelled or deleted while it is being moved is never resurrected; on the
store's own server the store's ack joins that transaction (see
:class:`~delayq_backends.store.Lease`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from types import ModuleType
from typing import Any

import redis
from rq import Queue as RQQueue
from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry
from rq.serializers import DefaultSerializer
from rq.utils import import_attribute, utcformat

from ..envelope import Envelope
from ..errors import DelayqError
from ..forwarder.slots import RUN_RECHECK_MS
from ..keys import MAX_RANK, RANK_SPAN
from ..models import DeliveryFailure
from ..outages import gives_back
from ..overlap_policy import ALLOW, BUFFER_ONE, SKIP, Fire, OverlapAsk, fire_runs, overlap_slot
from ..scripts import RqEnqueue, RqFields, RqMove, RqMoved, ScriptRunner
from ..scripts.store import Ack
from ..store import DelayStore
from ..store.lease import Lease
from ..targets import SLOT_TOKEN, Buried, Delivery, PublishReport
from ..timeutil import Clock, now_ms
from .failed import MARK, DeadJob, failed_key, record_failed
from .periodic import advance, due_between
from .registry import forget_scheduled, registry_key

__all__ = [
    "ALLOW_CLASS_ENV",
    "AT_FRONT_RANK",
    "DEFAULT_ALLOWED_CLASSES",
    "JOB_KEY",
    "KIND",
    "OVERLAP_FIELD",
    "SKIPPED_FIELD",
    "ClassAllowlist",
    "ClassImportError",
    "ClassNotAllowedError",
    "RQTarget",
    "UPGRADE_COMMAND",
    "dotted_path",
    "is_legacy_scheduler",
    "job_envelope",
    "job_id_of",
    "job_rank",
    "schedule_of",
    "slot_token_key",
]

log = logging.getLogger("delayq.rq")

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

#: Module prefixes whose queue and job classes every forwarder may import: RQ's and ours.
DEFAULT_ALLOWED_CLASSES = ("rq", "delayq_backends")
#: Env var adding prefixes (space- or comma-separated), as ``delayq forward --rq-allow-class``.
ALLOW_CLASS_ENV = "DELAYQ_RQ_ALLOW_CLASS"

#: The job hash fields the move reads: text and integers only, never ``data``, ``meta`` or ``result``.
_FIELDS = (
    "status", "created_at", "timeout", "ttl", "enqueue_at_front", "enqueue_at_front_on_retry", "ended_at",
    "dependency_ids", "dependency_id", "allow_dependency_failures", "rate_limit_key", "rate_limit_concurrency", MARK,
)  # fmt: skip


_SCHEDULED, _CANCELED, _DEFERRED = JobStatus.SCHEDULED.value, JobStatus.CANCELED.value, JobStatus.DEFERRED.value


class ClassImportError(DelayqError):
    """A queue or job class named in an envelope is not allowed or cannot be imported here."""


class ClassNotAllowedError(ClassImportError):
    """A queue or job class named in an envelope is off the forwarder's allowlist: its jobs wait
    (:data:`NOT_ALLOWED_WAIT_S` by default) rather than die, since the usual cause is a user's own
    ``Queue``/``Job`` subclass and a forwarder started without ``--rq-allow-class``."""


#: How long jobs naming a class off the allowlist wait before the forwarder looks again
#: (``delayq forward --rq-class-retry``).
NOT_ALLOWED_WAIT_S = 30.0


@dataclass(frozen=True)
class ClassAllowlist:
    """Dotted-path prefixes the forwarder may import a queue or job class from.

    A prefix matches whole components: ``myapp.jobs`` allows ``myapp.jobs.MyJob`` and
    ``myapp.jobs.sub.Other``, not ``myapp.jobsx.Evil``. A path with a ``__dunder__`` component
    (``rq.cli.__main__``) is never allowed: no class a job names lives there.
    """

    prefixes: tuple[str, ...] = DEFAULT_ALLOWED_CLASSES

    @classmethod
    def configured(cls, extra: Iterable[str] = (), env: Mapping[str, str] | None = None) -> ClassAllowlist:
        """The defaults, plus ``extra`` (``--rq-allow-class``) and :data:`ALLOW_CLASS_ENV`."""
        from_env = (os.environ if env is None else env).get(ALLOW_CLASS_ENV, "").replace(",", " ").split()
        added = [p.strip().strip(".") for p in (*extra, *from_env) if p.strip().strip(".")]
        return cls(tuple(dict.fromkeys((*DEFAULT_ALLOWED_CLASSES, *added))))

    def allows(self, path: str) -> bool:
        parts = path.split(".")
        if any(p.startswith("__") or not p for p in parts):
            return False
        return any(parts[: len(q)] == q for q in (p.split(".") for p in self.prefixes))

    def load(self, what: str, path: Any, base: type | None = None) -> Any:
        """What an envelope's ``what`` (``queue_class``, ...) names, imported if allowed; with
        ``base``, it must be a subclass of it (``base`` itself when ``path`` is None).

        Raises:
            ClassImportError: not allowed, not importable, or not a ``base``.
        """
        if path is None and base is not None:
            return base
        if not isinstance(path, str) or not self.allows(path):
            raise ClassNotAllowedError(
                f"{what} {path!r} is not on this forwarder's allowlist ({', '.join(self.prefixes)}): "
                f"if you trust it, start `delayq forward` with --rq-allow-class {_module_of(path)} "
                f"(or {ALLOW_CLASS_ENV}); an envelope cannot make the forwarder import anything else"
            )
        found = _import(path)
        if base is not None and not (isinstance(found, type) and issubclass(found, base)):
            raise ClassImportError(f"{what} {path!r} is not a subclass of {dotted_path(base)}: name an RQ {what}")
        return found


def dotted_path(obj: type | ModuleType | object) -> str:
    """The import path of a class or module, as ``rq worker --job-class`` takes it."""
    if isinstance(obj, ModuleType):
        return obj.__name__
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


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


def _text(raw: bytes | None) -> str | None:
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
        """From HMGET of :data:`_FIELDS`; None when the hash is gone. Raises ValueError naming a bad field.

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
        raw = dict(zip(_FIELDS, values))
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
            deps = json.loads(raw["dependency_ids"]) if raw["dependency_ids"] else [_text(raw["dependency_id"])]
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps if d is not None):
                raise ValueError("not a JSON list of job ids")
            name = "allow_dependency_failures"
            allow = _flag(raw["allow_dependency_failures"])
            name = "rate_limit_concurrency"
            concurrency = int(raw["rate_limit_concurrency"]) if raw["rate_limit_concurrency"] else None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"field {name!r} is {raw.get(name)!r}, which RQ cannot read either ({exc})") from exc
        return cls(
            status=_text(raw["status"]) or "created",  # as RQ reads a hash without one (JobStatus.CREATED)
            timeout=raw["timeout"],
            ttl=ttl,
            at_front=front,
            dependency_ids=tuple(d for d in deps if d),
            allow_dependency_failures=allow,
            rate_limit_key=_text(raw["rate_limit_key"]),
            rate_limit_concurrency=concurrency,
            dead_letter=None if raw[MARK] is None else raw["status"] == b"failed" and raw[MARK] == raw["ended_at"],
        )


@dataclass(frozen=True)
class _Keys:
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


@dataclass(frozen=True)
class _JobRef:
    """What RQ's registries take of a job: its id."""

    id: str


@dataclass
class _Pushes:
    """A batch's pushes onto one queue, sent as one RPUSH and one LPUSH.

    The list ends up as with one push per job, in order (RQ's own scheduler): RPUSH a, c equals
    RPUSH a; RPUSH c, and LPUSH b, d equals LPUSH b; LPUSH d, whatever the interleaving.
    """

    queue: str
    back: list[str] = field(default_factory=list)
    front: list[str] = field(default_factory=list)

    def add(self, job_id: str, at_front: bool) -> None:
        (self.front if at_front else self.back).append(job_id)

    def flush(self, pipe: Any) -> None:
        if self.back:
            pipe.rpush(self.queue, *self.back)
        if self.front:
            pipe.lpush(self.queue, *self.front)
        self.back, self.front = [], []


@lru_cache(maxsize=256)
def _import(path: str) -> Any:
    try:
        return import_attribute(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ClassImportError(
            f"cannot import {path!r} on this forwarder ({exc}): install the package that defines it "
            "where `delayq forward` runs, or schedule with RQ's default classes"
        ) from exc


@dataclass
class _Batch:
    """One queue's share of a claimed batch, sorted into what to do with each job."""

    keys: _Keys
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


class RQTarget:
    """Delivers ``"rq"`` envelopes: moves each due job into its RQ queue.

    Args:
        connection: RQ's Redis (``decode_responses=False``, as RQ requires). Pass the delay
            store's own client, or one to the same server and database, for the exactly-once
            hand-off.
        clock: "now" in ms, for the next run of periodic and cron jobs and retry times. By
            default the store's clock, read through the claim's lease: the one its forwarder
            reads (the wall clock for :meth:`publish_many`, which has no lease). A test on a
            real store may pass another.
        max_watch_retries: how often a batch is re-tried when a WATCHed key changes under it
            (a cancel, another claim on the shard) before its items are retried later instead.
        allow_classes: queue/job classes the forwarder may import from envelopes (by default
            RQ's and this package's; see :meth:`ClassAllowlist.configured`).
        class_retry: seconds the jobs naming a class off the allowlist wait before the
            forwarder looks again.
    """

    kind = KIND

    def __init__(
        self,
        connection: redis.Redis,
        *,
        clock: Clock | None = None,
        max_watch_retries: int = 20,
        allow_classes: ClassAllowlist | None = None,
        class_retry: float = NOT_ALLOWED_WAIT_S,
    ) -> None:
        self.connection = connection
        self.clock = clock
        self.max_watch_retries = max_watch_retries
        self.allow_classes = ClassAllowlist.configured() if allow_classes is None else allow_classes
        self.class_retry = class_retry
        self.scripts = ScriptRunner(connection)
        #: told (job id, periods) of the periods an overlap policy skipped: the metrics' counter
        self.on_skipped: Callable[[str, int], None] | None = None
        #: the allowlist refusals already logged (one warning each)
        self._warned: set[str] = set()

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        """Move jobs with no lease at hand: acked by the caller, periodic jobs are not re-armed."""
        return self._publish(deliveries, None)

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        """Move a claimed batch; on the store's own server the ack commits with the enqueue."""
        return self._publish(deliveries, lease)

    def _now_ms(self, lease: Lease | None) -> int:
        """The batch's "now": ``clock`` if given, else the store's clock (the lease's)."""
        if self.clock is not None:
            return self.clock()
        return lease.now_ms() if lease is not None else now_ms()

    def buried(self, letters: Sequence[Buried]) -> None:
        """Put the jobs of dead-lettered items into RQ's FailedJobRegistry (see :mod:`.failed`).

        A job class off the allowlist is not imported for its key prefix: RQ's default is used."""
        by_queue: dict[tuple[str, Any], list[DeadJob]] = {}
        for letter in letters:
            d = letter.delivery
            try:
                job = DeadJob(d.id, job_id_of(d), letter.error, bool(d.envelope.meta.get(SCHEDULER_FLAG)))
            except ValueError:  # no job id to fail
                continue
            by_queue.setdefault((d.envelope.destination, d.envelope.meta.get("job_class")), []).append(job)
        for (queue_name, job_path), jobs in by_queue.items():
            job_class = Job
            if isinstance(job_path, str) and self.allow_classes.allows(job_path):
                with contextlib.suppress(ClassImportError):
                    job_class = self._class("job_class", job_path, Job)
            moved = record_failed(self.scripts, queue_name, job_class.key_for, jobs)
            log.info("%d of %d dead-lettered jobs of %r put in RQ's FailedJobRegistry", moved, len(jobs), queue_name)

    def check(self) -> None:
        """PING RQ's Redis: connects and authenticates."""
        self.connection.ping()

    def queue_depth(self, queue: str) -> int:
        """Jobs waiting in RQ queue ``queue``: LLEN of its list (what ``Queue.count`` reads)."""
        return int(self.connection.llen(RQQueue.redis_queue_namespace_prefix + queue))

    def close(self) -> None:
        self.connection.close()

    # -- one batch ----------------------------------------------------------------------------

    def _publish(self, deliveries: Sequence[Delivery], lease: Lease | None) -> PublishReport:
        report, now = PublishReport(), self._now_ms(lease)
        groups: dict[tuple[Any, ...], list[Delivery]] = {}
        for d in deliveries:  # the serializer is not needed: nothing is deserialized
            try:
                job_id_of(d)
            except ValueError as exc:
                report.failed.append(DeliveryFailure(d.id, f"RQ item {d.id!r} cannot be moved: {exc}", permanent=True))
                continue
            key = (d.envelope.destination, d.envelope.meta.get("queue_class"), d.envelope.meta.get("job_class"))
            groups.setdefault(key, []).append(d)
        for (name, queue_path, job_path), group in groups.items():
            try:
                keys = _Keys(
                    name, self._class("queue_class", queue_path, RQQueue), self._class("job_class", job_path, Job)
                )
            except ClassNotAllowedError as exc:
                self._wait_for_allowlist(exc, group, report, now)
                continue
            except ClassImportError as exc:
                self._fail_unless_requeued(group, exc, report)
                continue
            try:
                batch = _Batch(keys, {job_id_of(d): d for d in group}, now)
                self._hand_slot_tokens(batch)
                rest = self._move_usual(batch, lease, report)
                if rest is not None:
                    self._move(rest, lease, report)
            except Exception as exc:
                if not gives_back(exc):
                    raise
                done = set(report.published) | {f.id for f in report.failed}
                report.unsent += [d.id for d in group if d.id not in done]
                report.broker_error = exc
        return report

    def _fail_unless_requeued(self, group: Sequence[Delivery], exc: ClassImportError, report: PublishReport) -> None:
        """Fail ``group`` (its classes cannot be imported here: ``exc``) but the items whose dead
        letter RQ's requeue spent: their job hash (at RQ's default key, the class named being
        unimportable) carries an outdated dead-letter mark (:mod:`.failed`). A ``delayq dlq
        requeue`` of one after ``rq requeue`` ran it is skipped and acked, as :meth:`_due` skips it
        when its classes import, instead of being dead-lettered again for a cause RQ went past."""
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                for d in group:
                    pipe.hmget(Job.key_for(job_id_of(d)), "status", "ended_at", MARK)
                replies = pipe.execute()
        except Exception as error:
            if not gives_back(error):
                raise
            report.unsent += [d.id for d in group]
            report.broker_error = error
            return
        for d, (status, ended, mark) in zip(group, replies):
            if mark is not None and not (status == b"failed" and mark == ended):
                log.info("job %s is %s since it was dead-lettered (RQ requeued it): skipped", job_id_of(d), status)
                report.published.append(d.id)
            else:
                report.failed.append(DeliveryFailure(d.id, str(exc), permanent=True))

    def _hand_slot_tokens(self, batch: _Batch) -> None:
        """Write the slot token of each slotted job (``Delivery.slot_token``) where its worker
        reads it at the job's start (:func:`slot_token_key`), before the job moves: a key of
        its own with a TTL, not a field of the job hash, which a job deleted meanwhile would
        leave behind as a stub."""
        tokens = {j: d.slot_token for j, d in batch.deliveries.items() if d.slot_token}
        if tokens:
            with self.connection.pipeline(transaction=False) as pipe:
                for job_id, token in tokens.items():
                    pipe.set(slot_token_key(batch.job_keys[job_id]), token, px=SLOT_TOKEN_TTL_MS)
                pipe.execute()

    def _wait_for_allowlist(
        self, exc: ClassNotAllowedError, group: list[Delivery], report: PublishReport, now: int
    ) -> None:
        """Jobs naming a class off the allowlist wait in the store (not imported, not
        dead-lettered), with one warning per class per forwarder: a user's own subclass moves
        once the forwarder is restarted with the ``--rq-allow-class`` the warning names."""
        if str(exc) not in self._warned:
            self._warned.add(str(exc))
            log.warning("RQ jobs wait, not moved (retried every %g s): %s", self.class_retry, exc)
        not_before = now + int(self.class_retry * 1000)
        report.later += [(d.id, not_before) for d in group]

    def _class(self, what: str, path: Any, base: type) -> Any:
        return self.allow_classes.load(what, path, base)

    def _move_usual(self, batch: _Batch, lease: Lease | None, report: PublishReport) -> _Batch | None:
        """Move the batch's leading Queue jobs in one ``rq_move`` call (with the store's ack on
        its own server), as long as each is a usual scheduled job; returns the batch of the jobs
        left (None: none), which :meth:`_move` takes in order after them.

        A Scheduler job (periodic, dependencies checked when due) and any job with a TTL,
        dependencies, a rate limit or a dead-letter mark take the general path: reading and
        writing those is what the WATCHed transaction is for. A lease in lossless mode does too
        (its ack keeps items, which the script does not)."""
        ids = batch.ids
        lead = next((n for n, job_id in enumerate(ids) if batch.from_scheduler(job_id)), len(ids))
        if lead == 0:
            return batch
        shared = lease if lease is not None and lease.shares_server(self.connection) else None
        if shared is not None and shared.keep_windows:
            return batch
        keys, store_keys = batch.keys, ()
        if shared is not None:
            shard_keys = shared.store.keys(shared.shard)
            store_keys = tuple(getattr(shard_keys, name) for name in Ack.key_names)
        call = RqMove.call(
            (keys.queue_class.redis_queues_keys, keys.queue, registry_key(keys.name)),
            store_keys,
            [(batch.deliveries[j].id, j, batch.job_keys[j]) for j in ids[:lead]],
            lease="" if shared is None else shared.claim.lease,
            origin=keys.name,
            enqueued_at=utcformat(datetime.now(timezone.utc)),
            timeout=str(keys.default_timeout),
        )
        outcomes = self.scripts.run(call).outcomes
        settled = []
        for job_id, outcome in zip(ids, outcomes):
            if outcome == RqMoved.NOT_HELD:
                continue
            if outcome == RqMoved.GONE:
                log.info("job %s was deleted while scheduled: skipped", job_id)
            elif outcome != RqMoved.MOVED:
                log.info("job %s is %s, no longer scheduled: skipped", job_id, outcome)
            settled.append(job_id)
        report.published += batch.items(settled)
        if shared is not None:
            report.acked += batch.items(settled)
        rest = ids[len(outcomes) :]
        return _Batch(keys, {j: batch.deliveries[j] for j in rest}, batch.now_ms) if rest else None

    def _move(self, batch: _Batch, lease: Lease | None, report: PublishReport) -> None:
        """Enqueue one queue's jobs in one transaction, retried while WATCHed keys change."""
        if lease is not None:
            batch = self._overlap(batch, lease, report)
            if not batch.deliveries:
                return
        moved: list[str] = []
        try:
            moved = self._transact(batch, lease, report)
        finally:
            if batch.granted and lease is not None:
                _give_back(lease, [j for j in batch.granted if j not in moved])
        if self.on_skipped is not None:  # the periods passed over by runs that waited, once moved
            for job_id in moved:
                if batch.granted.get(job_id):
                    self.on_skipped(job_id, batch.granted[job_id])

    def _transact(self, batch: _Batch, lease: Lease | None, report: PublishReport) -> list[str]:
        """The move's WATCHed transaction; the jobs moved."""
        shared = lease if lease is not None and lease.shares_server(self.connection) else None
        job_keys = list(batch.job_keys.values())
        with self.connection.pipeline() as pipe:
            for _ in range(self.max_watch_retries):
                try:
                    pipe.watch(*job_keys, *([shared.watch_key] if shared else []))
                    self._read(batch, pipe, shared)
                    pipe.multi()
                    self._queue_writes(batch, pipe, shared)
                    pipe.execute()
                    break
                except redis.WatchError:
                    pipe.reset()
            else:
                report.failed += [
                    DeliveryFailure(
                        batch.deliveries[i].id,
                        f"job keys or lease changed {self.max_watch_retries} times while being enqueued",
                        waits=_periodic(batch.deliveries[i]),
                    )
                    for i in batch.ids
                ]
                return []
        moved = list(batch.jobs)
        if shared is None:
            self._rearm(batch, moved, None, lease)
        report.published += batch.items(batch.skipped + moved)
        report.failed += [DeliveryFailure(batch.deliveries[i].id, error, permanent=True) for i, error in batch.broken]
        if shared is not None:
            report.acked += batch.items(batch.skipped + moved)
        return moved

    def _overlap(self, batch: _Batch, lease: Lease, report: PublishReport) -> _Batch:
        """Apply the overlap policies of periodic jobs (one slot call per job, before the move):
        a run whose previous one holds the job's slot is skipped (its next period scheduled, the
        skip counted in its envelope) or, under ``buffer_one``, waits in the slot's line (the
        item asks again soon, neither moved nor re-armed: the periods meanwhile are passed over
        and counted when it moves). The batch of the jobs that move."""
        asks: dict[str, OverlapAsk] = {}
        for job_id, d in batch.deliveries.items():
            policy = _policy(d)
            if policy != ALLOW:
                asks[job_id] = OverlapAsk(policy, job_id, MAX_RANK * RANK_SPAN + d.ready_ms)
        if not asks:
            return batch
        store = lease.store if isinstance(lease.store, DelayStore) else None
        outcomes = fire_runs(store, asks) if store is not None else {}
        now = batch.now_ms
        moving: dict[str, Delivery] = {}
        for job_id, d in batch.deliveries.items():
            outcome = outcomes.get(job_id, Fire.RUN)
            if isinstance(outcome, Exception) or (job_id in asks and store is None):
                why = f"its overlap policy could not be applied ({outcome if store else 'no slot role on this store'})"
                report.failed.append(DeliveryFailure(d.id, why, waits=True))
            elif outcome is Fire.WAIT:
                report.later.append((d.id, now + RUN_RECHECK_MS))
            elif outcome is Fire.SKIP:
                self._skip(d, lease, now)
                report.published.append(d.id)
            else:
                if job_id in asks:
                    batch.granted[job_id] = _passed_over(d, now)
                moving[job_id] = d
        left = _Batch(batch.keys, moving, batch.now_ms)
        left.granted = batch.granted
        return left

    def _skip(self, d: Delivery, lease: Lease, now: int) -> None:
        """Schedule the period after a skipped one, the skip counted (not a run: ``repeat`` is
        not counted down)."""
        schedule = _schedule_of(d)
        skipped = _skipped(schedule) + 1
        following = advance({k: v for k, v in schedule.items() if k != "repeat"}, now=max(now, d.ready_ms) / 1000)
        if self.on_skipped is not None:
            self.on_skipped(job_id_of(d), 1)
        log.info("periodic job %s: period skipped, its last run still running (skipped %d so far)", d.id, skipped)
        if following is not None:
            meta = {**d.envelope.meta, SCHEDULE_KEY: {**schedule, SKIPPED_FIELD: skipped}}
            lease.schedule(d.id, following, Envelope(KIND, d.envelope.destination, meta=meta))

    def _read(self, batch: _Batch, pipe: Any, shared: Lease | None) -> None:
        """After WATCH: which items are still ours, their jobs' fields, whether a Scheduler job's
        dependencies are met (their keys WATCHed too), and the next run of periodic ones."""
        if shared:
            held = set(shared.held(pipe, batch.items(batch.ids)))
            batch.held = [j for j in batch.ids if batch.deliveries[j].id in held]
        else:
            batch.held = batch.ids
        batch.jobs, batch.deferred, batch.skipped, batch.broken, batch.following = {}, set(), [], [], {}
        legacy = [i for i in batch.held if is_legacy_scheduler(batch.deliveries[i].envelope)]
        old_meta: dict[str, bytes | None] = {}
        if legacy:
            with self.connection.pipeline(transaction=False) as reads:
                for job_id in legacy:
                    reads.hget(batch.keys.job(job_id), "meta")
                # a key that is not a hash: rq_fields below names its type
                old_meta = {i: None if isinstance(m, Exception) else m
                            for i, m in zip(legacy, reads.execute(raise_on_error=False))}  # fmt: skip
        job_keys = [batch.job_keys[i] for i in batch.held]
        results = self.scripts.run(RqFields.call(job_keys, _FIELDS)) if batch.held else []
        waiting: dict[str, tuple[str, ...]] = {}
        for job_id, values in zip(batch.held, results):
            try:  # whatever one job's fields or schedule raise, it fails alone
                self._sort(batch, job_id, values, old_meta, waiting)
            except Exception as exc:
                batch.jobs.pop(job_id, None)
                waiting.pop(job_id, None)
                why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                batch.broken.append((job_id, f"RQ job hash {job_id!r} cannot be moved: {why}"))
        if waiting:
            batch.deferred = self._unmet(batch, pipe, waiting)

    def _sort(
        self,
        batch: _Batch,
        job_id: str,
        values: Any,
        old_meta: Mapping[str, bytes | None],
        waiting: dict[str, tuple[str, ...]],
    ) -> None:
        """Sort one job into the batch: skipped, to move (its dependencies into ``waiting``), and
        its next run planned. Raises ValueError naming what cannot be read."""
        if not isinstance(values, list):
            raise ValueError(f"its key holds a {_text(values)}, not a hash (written by another tool)")
        job = JobFields.parse(values)
        schedule = self._schedule(batch, job_id, old_meta) if job is not None else None
        scheduler = batch.from_scheduler(job_id)
        if job is None:
            log.info("job %s was deleted while scheduled: skipped", job_id)
            batch.skipped.append(job_id)
        elif not self._due(job_id, job, scheduler):
            batch.skipped.append(job_id)
        else:
            if schedule is not None:
                self._plan_next(batch, job_id, schedule)
            batch.jobs[job_id] = job
            if scheduler and job.dependency_ids:
                waiting[job_id] = job.dependency_ids

    @staticmethod
    def _meta(batch: _Batch, job_id: str) -> Mapping[str, Any]:
        return batch.deliveries[job_id].envelope.meta

    def _schedule(self, batch: _Batch, job_id: str, old_meta: Mapping[str, bytes | None]) -> dict[str, Any] | None:
        """A Scheduler job's schedule: from its envelope, or (scheduled by delayq 0.1) from a JSON
        ``job.meta``, upgraded as it moves (the re-armed run carries it). A pickled ``meta`` is
        never loaded: ValueError names the operator's command that upgrades it."""
        if not batch.from_scheduler(job_id):
            return None
        meta = self._meta(batch, job_id)
        if SCHEDULE_KEY in meta:
            schedule = meta[SCHEDULE_KEY]
            if not isinstance(schedule, dict):
                raise ValueError(f"its envelope's schedule is {schedule!r}, not an object")
            return dict(schedule)
        raw = old_meta.get(job_id)
        if not raw:
            return {}
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = None
        if not isinstance(loaded, dict):
            raise ValueError(
                "it was scheduled by delayq_backends 0.1's rq.Scheduler, whose envelope does not carry the "
                "repeat/cron schedule, and its job.meta is not JSON (the forwarder never unpickles job data): "
                f"on a machine trusted to run the jobs, run `{UPGRADE_COMMAND} --url <store> --prefix <prefix> "
                "--rq-redis <RQ's Redis>` (it upgrades every such job, these dead letters included), then "
                f"`delayq dlq requeue {job_id}`"
            )
        return schedule_of(loaded)

    def _plan_next(self, batch: _Batch, job_id: str, schedule: dict[str, Any]) -> None:
        """The next run of a periodic or cron job, with its schedule counted down in the envelope."""
        delivery = batch.deliveries[job_id]
        waited = batch.granted.get(job_id, 0)
        if waited:
            schedule[SKIPPED_FIELD] = _skipped(schedule) + waited
        following = advance(schedule, now=max(batch.now_ms, delivery.ready_ms) / 1000)
        if following is not None:
            meta = {**delivery.envelope.meta, SCHEDULE_KEY: schedule}
            batch.following[job_id] = (following, Envelope(KIND, delivery.envelope.destination, meta=meta))
        elif schedule.get("cron_string") and schedule.get("repeat") != 0:
            log.warning(
                "cron job %s: %r has no later match; this is its last run and its schedule ends",
                job_id,
                schedule["cron_string"],
            )

    def _unmet(self, batch: _Batch, pipe: Any, waiting: Mapping[str, tuple[str, ...]]) -> set[str]:
        """Jobs whose dependencies are not all finished (or failed, when allowed), as RQ's
        ``setup_dependencies`` decides; the dependencies' keys are WATCHed so the answer holds
        at EXEC. A deleted dependency counts as met, as in RQ."""
        dep_ids = sorted({d for deps in waiting.values() for d in deps})
        pipe.watch(*(batch.keys.job(d) for d in dep_ids), *(batch.keys.dependencies(j) for j in waiting))
        with self.connection.pipeline(transaction=False) as reads:
            for dep in dep_ids:
                reads.hget(batch.keys.job(dep), "status")
            status = dict(zip(dep_ids, (_text(s) for s in reads.execute())))
        unmet = set()
        for job_id, deps in waiting.items():
            met = {JobStatus.FINISHED.value} | (
                {JobStatus.FAILED.value} if batch.jobs[job_id].allow_dependency_failures else set()
            )
            if any(status[d] is not None and status[d] not in met for d in deps):
                unmet.add(job_id)
        return unmet

    @staticmethod
    def _due(job_id: str, job: JobFields, from_scheduler: bool) -> bool:
        """Whether the job still waits for this run: not cancelled, and (for a Queue's job) still
        ``scheduled``: any other status means it was cancelled or moved already (a re-delivery
        after a crash, or RQ's own scheduler during a migration), so it is not queued twice.
        A Scheduler's periodic job keeps the status of its last run, as with rq-scheduler. A job
        a forwarder failed when it dead-lettered it moves if still so (``delayq dlq requeue``),
        not once RQ's requeue has run it (see :mod:`.failed`)."""
        if job.status == _SCHEDULED or job.dead_letter:
            return True
        if job.dead_letter is False:
            log.info("job %s is %s since it was dead-lettered (RQ requeued it): skipped", job_id, job.status)
            return False
        if job.status == _CANCELED or not from_scheduler:
            log.info("job %s is %s, no longer scheduled: skipped", job_id, job.status)
            return False
        return True

    def _queue_writes(self, batch: _Batch, pipe: Any, shared: Lease | None) -> None:
        """Queue the enqueues (and, when shared, the ack and re-arms) on the MULTI."""
        keys = batch.keys
        pipe.sadd(keys.queue_class.redis_queues_keys, keys.queue)
        pushes = _Pushes(keys.queue)
        plain: list[tuple[str, JobFields]] = []  # their hash writes go in one script call
        for job_id, job in batch.jobs.items():
            if job.dead_letter:  # off RQ's Failed registry: RQ's requeue then finds it gone
                pipe.zrem(failed_key(keys.name), job_id)
            if job.dead_letter is not None:  # spent: a later schedule of this id moves as usual
                pipe.hdel(batch.job_keys[job_id], MARK)
            if job_id in batch.deferred:
                self._defer(pipe, keys, job_id, job)
            elif job.rate_limit_key and job.rate_limit_concurrency:
                pushes.flush(pipe)  # its promotion may push too: keep the order
                self._enqueue_rate_limited(pipe, keys, job_id, job)
            else:
                if job.status == _DEFERRED or (job.ttl is not None and job.ttl > 0):
                    self._enqueue_extra(pipe, keys, job_id, job)
                plain.append((job_id, job))
                pushes.add(job_id, job.at_front)
        self._enqueue(pipe, keys, batch.job_keys, plain)
        pushes.flush(pipe)
        forget_scheduled(pipe, keys.name, [*batch.jobs, *batch.skipped])  # the registry's mirror entries
        if shared is not None:
            moved = list(batch.jobs)
            shared.ack(batch.items(batch.skipped + moved), pipeline=pipe)
            self._rearm(batch, moved, pipe, shared)

    def _enqueue(
        self, pipe: Any, keys: _Keys, job_keys: Mapping[str, str], jobs: Sequence[tuple[str, JobFields]]
    ) -> None:
        """The job hash fields ``Queue._enqueue_job`` writes for due jobs (rq 1.16 to 3.x):
        status ``queued``, ``origin``, ``enqueued_at``, and the queue's default timeout for a job
        without one; one ``rq_enqueue`` script call for the batch rather than an HSET per job
        (see rq_enqueue.lua). The push onto the queue is the caller's (:class:`_Pushes`)."""
        if not jobs:
            return
        enqueued_at = utcformat(datetime.now(timezone.utc))
        mask = "".join("1" if job.timeout is None else "0" for _, job in jobs)
        call = RqEnqueue.call(
            [job_keys[job_id] for job_id, _ in jobs],
            status=JobStatus.QUEUED.value,
            origin=keys.name,
            enqueued_at=enqueued_at,
            timeout=str(keys.default_timeout),
            mask=mask,
        )
        self.scripts.queue(call, pipe)

    def _enqueue_extra(self, pipe: Any, keys: _Keys, job_id: str, job: JobFields) -> None:
        """The rest of ``Queue._enqueue_job`` for the jobs that need it: out of the deferred
        registry (a job whose dependencies held it), and the TTL on its keys."""
        if job.status == JobStatus.DEFERRED.value:
            self._deferred(keys).remove(job_id, pipeline=pipe)
        self._expire(pipe, keys, job_id, job.ttl)

    def _defer(self, pipe: Any, keys: _Keys, job_id: str, job: JobFields) -> None:
        """What ``Queue.setup_dependencies`` writes for a job waiting on unfinished dependencies."""
        pipe.hset(keys.job(job_id), mapping={"status": JobStatus.DEFERRED.value, "origin": keys.name})
        self._deferred(keys).add(_JobRef(job_id), pipeline=pipe)  # type: ignore[arg-type]
        for dep in job.dependency_ids:
            pipe.sadd(keys.dependents(dep), job_id)
            pipe.sadd(keys.dependencies(job_id), dep)
        self._expire(pipe, keys, job_id, job.ttl)

    def _deferred(self, keys: _Keys) -> DeferredJobRegistry:
        return DeferredJobRegistry(keys.name, connection=self.connection, job_class=keys.job_class)

    def _enqueue_rate_limited(self, pipe: Any, keys: _Keys, job_id: str, job: JobFields) -> None:
        """What rq 3's ``Queue._enqueue_rate_limited_job`` writes with a pipeline."""
        from rq.rate_limit import RateLimitRegistry  # rq 3 only, as are rate-limited jobs

        assert job.rate_limit_key and job.rate_limit_concurrency
        registry = RateLimitRegistry(job.rate_limit_key, self.connection)
        registry.register(job.rate_limit_concurrency, pipe)
        fields = {"status": JobStatus.RATE_LIMITED.value, "origin": keys.name}
        if job.timeout is None:
            fields["timeout"] = str(keys.default_timeout)
        if job.at_front:
            fields["enqueue_at_front"] = "1"
        pipe.hset(keys.job(job_id), mapping=fields)
        self._expire(pipe, keys, job_id, job.ttl)
        registry.add_to_rate_limited(job_id, pipe)
        registry.acquire_and_enqueue(job.rate_limit_concurrency, pipeline=pipe)

    @staticmethod
    def _expire(pipe: Any, keys: _Keys, job_id: str, ttl: int | None) -> None:
        """``Job.cleanup(ttl)`` as the enqueue calls it: a positive TTL expires the job's keys."""
        if ttl is not None and ttl > 0:
            for key in (keys.job(job_id), keys.dependents(job_id), keys.dependencies(job_id)):
                pipe.expire(key, ttl)

    def _rearm(self, batch: _Batch, ids: list[str], pipe: Any, lease: Lease | None) -> None:
        """Schedule the next run of periodic and cron jobs under the same id.

        Re-scheduling drops the lease, so the forwarder's ack (in this transaction or after it)
        cannot delete the next run; one forwarder moves each run, so there is no double run.
        """
        for job_id in ids:
            if job_id not in batch.following:
                continue
            following, envelope = batch.following[job_id]
            rank = AT_FRONT_RANK if batch.jobs[job_id].at_front else 0
            if lease is None:
                log.warning("periodic job %s moved without a lease: its next run is not scheduled", job_id)
            else:
                lease.schedule(job_id, following, envelope, rank=rank, pipeline=pipe)


def _give_back(lease: Lease, job_ids: Sequence[str]) -> None:
    """The slots taken for runs that did not move go back (else held for their start hold, and
    the periods meanwhile skipped)."""
    if not job_ids or not isinstance(lease.store, DelayStore):
        return
    try:
        lease.store.give_back_slots({overlap_slot(j).key: [j] for j in job_ids})
    except Exception as exc:  # the holds lapse by themselves
        log.warning("periodic jobs %s: could not give back their slots (%s)", job_ids, exc)


#: How long a job's slot token waits for its worker (a day: far above any broker wait).
SLOT_TOKEN_TTL_MS = 86_400_000


def slot_token_key(job_key: str) -> str:
    """The key in RQ's Redis holding the slot token of the job whose hash is ``job_key``."""
    return f"{job_key}:{SLOT_TOKEN}"


def _passed_over(delivery: Delivery, now: float) -> int:
    """The periods of a periodic job that fell due while its run waited (0 if its schedule
    cannot be read: the move reports that)."""
    try:
        return due_between(_schedule_of(delivery), delivery.ready_ms / 1000, now)
    except (ValueError, TypeError, OverflowError):
        return 0


def _skipped(schedule: Mapping[str, Any]) -> int:
    """The periods a job's overlap policy skipped so far; a count that is none (a hand write)
    starts again from 0."""
    value = schedule.get(SKIPPED_FIELD)
    return value if type(value) is int and value >= 0 else 0


def _schedule_of(delivery: Delivery) -> dict[str, Any]:
    """A Scheduler job's schedule from its envelope (``{}`` when it has none)."""
    schedule = delivery.envelope.meta.get(SCHEDULE_KEY)
    return dict(schedule) if isinstance(schedule, dict) else {}


def _policy(delivery: Delivery) -> str:
    """A periodic job's overlap policy (``allow`` for any other item, or a value no release wrote)."""
    policy = _schedule_of(delivery).get(OVERLAP_FIELD, ALLOW)
    return policy if policy in (SKIP, BUFFER_ONE) and _periodic(delivery) else ALLOW


def _periodic(delivery: Delivery) -> bool:
    """Whether ``delivery`` is a Scheduler job with a next run (an interval or a cron string)."""
    schedule = delivery.envelope.meta.get(SCHEDULE_KEY)
    return isinstance(schedule, dict) and bool(schedule.get("interval") or schedule.get("cron_string"))


def _module_of(path: Any) -> str:
    """The module part of a dotted class path, as an allowlist prefix to suggest."""
    return str(path).rpartition(".")[0] or str(path)
