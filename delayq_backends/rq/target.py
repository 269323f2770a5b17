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
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import redis
from rq import Queue as RQQueue
from rq.job import Job, JobStatus
from rq.utils import utcformat

from ..models import DeliveryFailure
from ..outages import gives_back
from ..scripts import RqFields, RqMove, RqMoved, ScriptRunner
from ..scripts.store import Ack
from ..store.lease import Lease
from ..targets import Buried, Delivery, PublishReport, Skipped
from ..timeutil import Clock, now_ms
from .allowlist import NOT_ALLOWED_WAIT_S, ClassAllowlist, ClassImportError, ClassNotAllowedError
from .enqueue import EnqueueWrites
from .failed import MARK, DeadJob, record_failed
from .jobs import (
    FIELDS,
    KIND,
    SCHEDULER_FLAG,
    SLOT_TOKEN_TTL_MS,
    JobFields,
    MoveBatch,
    QueueKeys,
    is_legacy_scheduler,
    job_id_of,
    slot_token_key,
    text,
)
from .registry import registry_key
from .repeats import apply_overlap, give_back, is_periodic, plan_next, read_schedule, rearm

__all__ = ["RQTarget"]

log = logging.getLogger("delayq.rq")

_SCHEDULED, _CANCELED = JobStatus.SCHEDULED.value, JobStatus.CANCELED.value


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
        self.writes = EnqueueWrites(connection, self.scripts)
        #: the allowlist refusals already logged (one warning each)
        self._warned: set[str] = set()

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        """Move jobs with no lease at hand: acked by the caller, periodic jobs are not re-armed."""
        return self._publish(deliveries, None)

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        """Move a claimed batch; on the store's own server the ack commits with the enqueue."""
        return self._publish(deliveries, lease)

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

    def _now_ms(self, lease: Lease | None) -> int:
        """The batch's "now": ``clock`` if given, else the store's clock (the lease's)."""
        if self.clock is not None:
            return self.clock()
        return lease.now_ms() if lease is not None else now_ms()

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
                keys = QueueKeys(
                    name, self._class("queue_class", queue_path, RQQueue), self._class("job_class", job_path, Job)
                )
            except ClassNotAllowedError as exc:
                self._wait_for_allowlist(exc, group, report, now)
                continue
            except ClassImportError as exc:
                self._fail_unless_requeued(group, exc, report)
                continue
            try:
                batch = MoveBatch(keys, {job_id_of(d): d for d in group}, now)
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

    def _hand_slot_tokens(self, batch: MoveBatch) -> None:
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

    def _move_usual(self, batch: MoveBatch, lease: Lease | None, report: PublishReport) -> MoveBatch | None:
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
        return MoveBatch(keys, {j: batch.deliveries[j] for j in rest}, batch.now_ms) if rest else None

    def _move(self, batch: MoveBatch, lease: Lease | None, report: PublishReport) -> None:
        """Enqueue one queue's jobs in one transaction, retried while WATCHed keys change."""
        if lease is not None:
            batch = apply_overlap(batch, lease, report)
            if not batch.deliveries:
                return
        moved: list[str] = []
        try:
            moved = self._transact(batch, lease, report)
        finally:
            if batch.granted and lease is not None:
                give_back(lease, [j for j in batch.granted if j not in moved])
        # the periods passed over by runs that waited, once moved
        report.skipped += [Skipped(batch.deliveries[j].id, j, batch.granted[j]) for j in moved if batch.granted.get(j)]

    def _transact(self, batch: MoveBatch, lease: Lease | None, report: PublishReport) -> list[str]:
        """The move's WATCHed transaction; the jobs moved."""
        shared = lease if lease is not None and lease.shares_server(self.connection) else None
        job_keys = list(batch.job_keys.values())
        with self.connection.pipeline() as pipe:
            for _ in range(self.max_watch_retries):
                try:
                    pipe.watch(*job_keys, *([shared.watch_key] if shared else []))
                    self._read(batch, pipe, shared)
                    pipe.multi()
                    self.writes.queue(batch, pipe, shared)
                    pipe.execute()
                    break
                except redis.WatchError:
                    pipe.reset()
            else:
                report.failed += [
                    DeliveryFailure(
                        batch.deliveries[i].id,
                        f"job keys or lease changed {self.max_watch_retries} times while being enqueued",
                        waits=is_periodic(batch.deliveries[i]),
                    )
                    for i in batch.ids
                ]
                return []
        moved = list(batch.jobs)
        if shared is None:
            rearm(batch, moved, None, lease)
        report.published += batch.items(batch.skipped + moved)
        report.failed += [DeliveryFailure(batch.deliveries[i].id, error, permanent=True) for i, error in batch.broken]
        if shared is not None:
            report.acked += batch.items(batch.skipped + moved)
        return moved

    def _read(self, batch: MoveBatch, pipe: Any, shared: Lease | None) -> None:
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
        results = self.scripts.run(RqFields.call(job_keys, FIELDS)) if batch.held else []
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
        batch: MoveBatch,
        job_id: str,
        values: Any,
        old_meta: Mapping[str, bytes | None],
        waiting: dict[str, tuple[str, ...]],
    ) -> None:
        """Sort one job into the batch: skipped, to move (its dependencies into ``waiting``), and
        its next run planned. Raises ValueError naming what cannot be read."""
        if not isinstance(values, list):
            raise ValueError(f"its key holds a {text(values)}, not a hash (written by another tool)")
        job = JobFields.parse(values)
        schedule = read_schedule(batch, job_id, old_meta) if job is not None else None
        scheduler = batch.from_scheduler(job_id)
        if job is None:
            log.info("job %s was deleted while scheduled: skipped", job_id)
            batch.skipped.append(job_id)
        elif not self._due(job_id, job, scheduler):
            batch.skipped.append(job_id)
        else:
            if schedule is not None:
                plan_next(batch, job_id, schedule, batch.now_ms)
            batch.jobs[job_id] = job
            if scheduler and job.dependency_ids:
                waiting[job_id] = job.dependency_ids

    def _unmet(self, batch: MoveBatch, pipe: Any, waiting: Mapping[str, tuple[str, ...]]) -> set[str]:
        """Jobs whose dependencies are not all finished (or failed, when allowed), as RQ's
        ``setup_dependencies`` decides; the dependencies' keys are WATCHed so the answer holds
        at EXEC. A deleted dependency counts as met, as in RQ."""
        dep_ids = sorted({d for deps in waiting.values() for d in deps})
        pipe.watch(*(batch.keys.job(d) for d in dep_ids), *(batch.keys.dependencies(j) for j in waiting))
        with self.connection.pipeline(transaction=False) as reads:
            for dep in dep_ids:
                reads.hget(batch.keys.job(dep), "status")
            status = dict(zip(dep_ids, (text(s) for s in reads.execute())))
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
