"""The forwarder's RQ target: put a due job into its queue the way RQ's own scheduler does.

The job hash stays where RQ keeps it (``rq:job:<id>``); the delay store only holds the job id,
the queue name and the classes to use, so the forwarder needs none of the application's code.

A batch is moved in one MULTI/EXEC on RQ's Redis, with every job key WATCHed, so a job cancelled
or deleted while it is being moved is never resurrected. When RQ's Redis is the delay store's
own server, the store's ack joins that transaction (see :class:`~delayq_backends.targets.Lease`):
the enqueue and the ack commit together, an exactly-once hand-off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import Any, Callable, Optional, Sequence, Union

import redis
from rq import Queue as RQQueue
from rq.job import Job, JobStatus
from rq.serializers import DefaultSerializer
from rq.utils import import_attribute

from ..envelope import Envelope
from ..errors import DelayqError
from ..outages import is_transient
from ..targets import Delivery, Lease, PublishReport
from .periodic import advance

__all__ = [
    "AT_FRONT_RANK",
    "KIND",
    "RQTarget",
    "dotted_path",
    "enqueue_due",
    "enqueues_at_front",
    "job_envelope",
    "job_rank",
]

log = logging.getLogger("delayq.rq")

KIND = "rq"

#: Envelope meta keys naming the classes a job was scheduled with (omitted when RQ's default).
_CLASS_KEYS = ("queue_class", "job_class", "serializer")
#: Envelope meta flag: the job came from :class:`~delayq_backends.rq.Scheduler` (rq-scheduler
#: semantics: dependencies are checked when it is due, and ``job.meta`` may make it periodic).
SCHEDULER_FLAG = "scheduler"
#: The store rank of a job that will be enqueued at the front of its queue: under a backlog,
#: the forwarder moves it before the jobs that queue behind (rank 0).
AT_FRONT_RANK = 1


class ClassImportError(DelayqError):
    """A queue class, job class or serializer named in an envelope cannot be imported here."""


def dotted_path(obj: Union[type, ModuleType, object]) -> str:
    """The import path of a class or module, as ``rq worker --job-class`` takes it."""
    if isinstance(obj, ModuleType):
        return obj.__name__
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def job_envelope(
    queue_name: str,
    *,
    queue_class: Optional[type] = None,
    job_class: Optional[type] = None,
    serializer: Any = None,
    scheduler: bool = False,
) -> Envelope:
    """What the delay store keeps for one RQ job: its queue and the classes to move it with."""
    meta: dict[str, Any] = {}
    defaults = (RQQueue, Job, DefaultSerializer)
    for key, value, default in zip(_CLASS_KEYS, (queue_class, job_class, serializer), defaults):
        if value is not None and value is not default:
            meta[key] = dotted_path(value)
    if scheduler:
        meta[SCHEDULER_FLAG] = True
    return Envelope(target=KIND, destination=queue_name, meta=meta)


def enqueues_at_front(job: Job) -> bool:
    """Whether RQ puts ``job`` at the front of its queue when it is enqueued (a retry may too)."""
    return job.should_enqueue_at_front() if hasattr(job, "should_enqueue_at_front") else bool(job.enqueue_at_front)


def job_rank(job: Job) -> int:
    """The delay store rank of ``job``: :data:`AT_FRONT_RANK` when it goes to the front, else 0."""
    return AT_FRONT_RANK if enqueues_at_front(job) else 0


def enqueue_due(queue: RQQueue, job: Job, pipeline: Optional[Any], *, check_dependencies: bool = False) -> bool:
    """Put a due job into ``queue``: the one place that touches RQ internals.

    With a ``pipeline`` (a MULTI in progress), this queues what RQ's own scheduler does for a
    due job in rq 1.16 to 3.x (``RQScheduler.enqueue_scheduled_jobs``): ``queue._enqueue_job``
    (status ``queued``, ``origin``, ``enqueued_at``, default timeout, TTL, RPUSH or LPUSH),
    or ``queue._enqueue_rate_limited_job`` for an rq 3 rate-limited job; plus the queue's
    ``rq:queues`` membership. Without one, it calls the public ``queue.enqueue_job``, which
    checks ``depends_on`` in a WATCH transaction of its own, as rq-scheduler does.

    Returns False, doing nothing, when ``check_dependencies`` is set, the job has dependencies
    and a pipeline was given: RQ's dependency check cannot run inside another transaction, so
    the caller calls again with ``pipeline=None`` after its own EXEC. (RQ's own scheduler does
    not check dependencies of a due job; rq-scheduler does. Each of our classes keeps the
    behaviour of the one it replaces.)
    """
    at_front = enqueues_at_front(job)
    if pipeline is None:
        queue.enqueue_job(job, at_front=at_front)
        return True
    if check_dependencies and job._dependency_ids:
        return False
    pipeline.sadd(queue.redis_queues_keys, queue.key)
    if getattr(job, "has_rate_limit", False):
        queue._enqueue_rate_limited_job(job, pipeline=pipeline, at_front=at_front)
    else:
        queue._enqueue_job(job, pipeline=pipeline, at_front=at_front)
    return True


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

    queue: RQQueue
    deliveries: dict[str, Delivery]
    held: list[str] = field(default_factory=list)
    jobs: dict[str, Job] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    broken: list[tuple[str, str]] = field(default_factory=list)
    following: dict[str, float] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return list(self.deliveries)

    def from_scheduler(self, job_id: str) -> bool:
        return bool(self.deliveries[job_id].envelope.meta.get(SCHEDULER_FLAG))


class RQTarget:
    """Delivers ``"rq"`` envelopes: moves each due job into its RQ queue.

    Args:
        connection: RQ's Redis (``decode_responses=False``, as RQ requires). Pass the delay
            store's own client, or one to the same server and database, for the exactly-once
            hand-off.
        clock: "now" in epoch seconds, for the next run of periodic and cron jobs. Tests pass
            a fake one.
        max_watch_retries: how often a batch is re-tried when a WATCHed key changes under it
            (a cancel, another claim on the shard) before its items are retried later instead.
    """

    kind = KIND

    def __init__(
        self, connection: redis.Redis, *, clock: Callable[[], float] = time.time, max_watch_retries: int = 20
    ) -> None:
        self.connection = connection
        self.clock = clock
        self.max_watch_retries = max_watch_retries

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        """Move jobs with no lease at hand: acked by the caller, periodic jobs are not re-armed."""
        return self._publish(deliveries, None)

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        """Move a claimed batch; on the store's own server the ack commits with the enqueue."""
        return self._publish(deliveries, lease)

    def queue_depth(self, queue: str) -> int:
        """Jobs waiting in RQ queue ``queue``: LLEN of its list (what ``Queue.count`` reads)."""
        return int(self.connection.llen(RQQueue.redis_queue_namespace_prefix + queue))

    def close(self) -> None:
        self.connection.close()

    # -- one batch ----------------------------------------------------------------------------

    def _publish(self, deliveries: Sequence[Delivery], lease: Optional[Lease]) -> PublishReport:
        report = PublishReport()
        groups: dict[tuple[Any, ...], list[Delivery]] = {}
        for d in deliveries:
            key = (d.envelope.destination, *(d.envelope.meta.get(k) for k in _CLASS_KEYS))
            groups.setdefault(key, []).append(d)
        for (name, *paths), group in groups.items():
            try:
                queue = self._queue(name, *paths)
            except ClassImportError as exc:
                report.failed += [(d.id, str(exc), True) for d in group]
                continue
            try:
                self._move(_Batch(queue, {d.id: d for d in group}), lease, report)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                done = set(report.published) | {i for i, *_ in report.failed}
                report.unsent += [d.id for d in group if d.id not in done]
                report.broker_error = exc
        return report

    def _queue(self, name: str, queue_path: Optional[str], job_path: Optional[str], ser_path: Optional[str]) -> RQQueue:
        queue_class = _import(queue_path) if queue_path else RQQueue
        job_class = _import(job_path) if job_path else Job
        serializer = _import(ser_path) if ser_path else None
        queue: RQQueue = queue_class(name, connection=self.connection, job_class=job_class, serializer=serializer)
        return queue

    def _move(self, batch: _Batch, lease: Optional[Lease], report: PublishReport) -> None:
        """Enqueue one queue's jobs in one transaction, retried while WATCHed keys change."""
        shared = lease if lease is not None and lease.shares_server(self.connection) else None
        job_keys = [batch.queue.job_class.key_for(i) for i in batch.ids]
        with self.connection.pipeline() as pipe:
            for _ in range(self.max_watch_retries):
                try:
                    pipe.watch(*job_keys, *([shared.watch_key] if shared else []))
                    self._read(batch, pipe, shared)
                    pipe.multi()
                    solo = self._queue_writes(batch, pipe, shared)
                    pipe.execute()
                    break
                except redis.WatchError:
                    pipe.reset()
            else:
                report.failed += [
                    (i, f"job keys or lease changed {self.max_watch_retries} times while being enqueued", False)
                    for i in batch.ids
                ]
                return
        moved = [i for i in batch.jobs if i not in solo]
        if shared is None:
            self._rearm(batch, moved, None, lease)
        for job_id in solo:  # jobs with dependencies: RQ checks them in its own transaction
            enqueue_due(batch.queue, batch.jobs[job_id], None)
            self._rearm(batch, [job_id], None, lease)
        report.published += batch.skipped + moved + solo
        report.failed += [(i, error, True) for i, error in batch.broken]
        if shared is not None:
            report.acked += batch.skipped + moved

    def _read(self, batch: _Batch, pipe: Any, shared: Optional[Lease]) -> None:
        """After WATCH: which items are still ours, their jobs as they stand, and the next run
        of periodic ones (which counts a repeat down in ``job.meta``, saved by the enqueue)."""
        batch.held = shared.held(pipe, batch.ids) if shared else batch.ids
        batch.jobs, batch.skipped, batch.broken, batch.following = {}, [], [], {}
        for job_id, job in zip(batch.held, self._fetch(batch.queue, batch.held, batch.broken)):
            if job is None:
                if all(job_id != b for b, _ in batch.broken):
                    log.info("job %s was deleted while scheduled: skipped", job_id)
                    batch.skipped.append(job_id)
            elif not self._due(job, batch.from_scheduler(job_id)):
                batch.skipped.append(job_id)
            else:
                batch.jobs[job_id] = job
                if batch.from_scheduler(job_id):
                    ready = batch.deliveries[job_id].ready_ms / 1000
                    following = advance(job.meta, now=max(self.clock(), ready))
                    if following is not None:
                        batch.following[job_id] = following

    @staticmethod
    def _due(job: Job, from_scheduler: bool) -> bool:
        """Whether the job still waits for this run: not cancelled, and (for a Queue's job) still
        ``scheduled``: any other status means it was cancelled or moved already (a re-delivery
        after a crash, or RQ's own scheduler during a migration), so it is not queued twice.
        A Scheduler's periodic job keeps the status of its last run, as with rq-scheduler."""
        status = job.get_status(refresh=False)
        if status == JobStatus.CANCELED or (not from_scheduler and status != JobStatus.SCHEDULED):
            log.info("job %s is %s, no longer scheduled: skipped", job.id, status)
            return False
        return True

    def _fetch(self, queue: RQQueue, ids: list[str], broken: list[tuple[str, str]]) -> list[Optional[Job]]:
        """The jobs of ``ids`` (None if gone); one that cannot be read is recorded in ``broken``."""
        try:
            return list(queue.job_class.fetch_many(ids, connection=self.connection, serializer=queue.serializer))
        except Exception as exc:  # one bad hash must not sink the batch: read them one by one
            if is_transient(exc):  # but an outage must: the batch is released
                raise
            jobs: list[Optional[Job]] = []
            for job_id in ids:
                try:
                    jobs.append(queue.job_class.fetch(job_id, connection=self.connection, serializer=queue.serializer))
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    jobs.append(None)
                    if queue.job_class.exists(job_id, connection=self.connection):
                        broken.append((job_id, f"RQ job hash {job_id!r} cannot be read: {type(exc).__name__}: {exc}"))
            return jobs

    def _queue_writes(self, batch: _Batch, pipe: Any, shared: Optional[Lease]) -> list[str]:
        """Queue the enqueues (and, when shared, the ack and re-arms); returns ids to move alone."""
        solo = [
            job_id
            for job_id, job in batch.jobs.items()
            if not enqueue_due(batch.queue, job, pipe, check_dependencies=batch.from_scheduler(job_id))
        ]
        if shared is not None:
            moved = [i for i in batch.jobs if i not in solo]
            shared.ack_in(pipe, batch.skipped + moved)
            self._rearm(batch, moved, pipe, shared)
        return solo

    def _rearm(self, batch: _Batch, ids: list[str], pipe: Any, lease: Optional[Lease]) -> None:
        """Schedule the next run of periodic and cron jobs under the same id.

        Re-scheduling drops the lease, so the forwarder's ack (in this transaction or after it)
        cannot delete the next run; one forwarder moves each run, so there is no double run.
        """
        for job_id in ids:
            following = batch.following.get(job_id)
            if following is None:
                continue
            envelope, rank = batch.deliveries[job_id].envelope, job_rank(batch.jobs[job_id])
            if lease is None:
                log.warning("periodic job %s moved without a lease: its next run is not scheduled", job_id)
            elif pipe is not None:
                lease.store.schedule_in(pipe, job_id, following, envelope, rank=rank)
            else:
                lease.store.schedule(job_id, following, envelope, rank=rank)
