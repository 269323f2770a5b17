"""``delayq_backends.rq.Queue``: an ``rq.Queue`` whose scheduled jobs wait in the delay store.

``Queue.schedule_job`` is the one call behind ``enqueue_at``, ``enqueue_in``, ``Retry(interval=…)``,
``Repeat(interval=…)`` and ``rq enqueue --schedule-in/--schedule-at``, so overriding it catches
them all. Run workers with ``rq worker --queue-class delayq_backends.rq.Queue`` so the worker's
own retries and repeats go through it too; then no ``--with-scheduler`` is needed, because
``delayq forward --rq-redis …`` moves due jobs into their queues.

``enqueue_in``/``enqueue_at`` take ``delayq_debounce=`` (a key, or ``{"key", "mode", "keep"}``:
see :class:`~delayq_backends.collapse.Collapse`) to collapse the schedules of one key into one
run, and a job's ``meta["delayq_rate_key"]`` names who it is for (per-key rate caps).
``delayq_slot=`` (a key, or ``{"key", "limit"}``) on ``enqueue``, ``enqueue_in`` and
``enqueue_at`` gives the job a concurrency slot, kept in ``meta["delayq_slot"]``: it waits in
the store (even with no delay) until fewer than the key's limit of its jobs run (see
:mod:`~delayq_backends.rq.slots`). ``delayq_group=`` (a key, ``{"key", "limit", "rate", "weight",
"cost"}``, or a list of up to 3: see :class:`~delayq_backends.envelope.Group`) on the same calls
names the job's groups, kept in ``meta["delayq_group"]``, of which the slot and rate key are
aliases: the job waits in the store until each admits it.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import redis
from rq import Queue as RQQueue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry as RQScheduledJobRegistry

from ..collapse import Collapse
from ..config import Config
from ..connection import connect, on_store_server
from ..envelope import Envelope, Slot, parse_groups, with_groups, with_rate_key, with_slot
from ..errors import ConfigError, InvalidDebounceError, InvalidTimeError
from ..scripts import RqJobWrites, RqSchedule
from ..store import DelayStore
from ..store.batches import with_batch
from ..storecache import StoreCache
from ..timeutil import to_ms
from ..tracing import FIELDS as TRACE_FIELDS
from ..tracing import TRACE_META, current_carrier
from .jobs import JOB_KEY, job_envelope, job_rank
from .registry import MIRROR_OFFSET_S, is_mirror, mirror_scheduled, mirror_score, registry_key

__all__ = [
    "DEBOUNCE_OPTION",
    "GROUP_META",
    "GROUP_OPTION",
    "RATE_KEY_META",
    "SLOT_META",
    "SLOT_OPTION",
    "Queue",
    "ScheduledJobRegistry",
    "UsesDelayStore",
    "carry_trace",
    "group_options",
    "slot_meta",
    "store_of_connection",
    "with_job_groups",
]

#: The ``enqueue_in``/``enqueue_at`` keyword that debounces or throttles the job by a key.
DEBOUNCE_OPTION = "delayq_debounce"
#: The ``job.meta`` field naming the job's rate key (a tenant) for per-key rate caps.
RATE_KEY_META = "delayq_rate_key"
#: The ``enqueue``/``enqueue_in``/``enqueue_at`` keyword giving the job a concurrency slot.
SLOT_OPTION = "delayq_slot"
#: The ``job.meta`` field holding the job's slot (``{"key", "limit"}``): the worker reads it too.
SLOT_META = "delayq_slot"
#: The ``enqueue``/``enqueue_in``/``enqueue_at`` keyword naming the job's groups.
GROUP_OPTION = "delayq_group"
#: The ``job.meta`` field holding the job's groups (a list of dicts): the worker reads it too.
GROUP_META = "delayq_group"
#: The ``job.meta`` field naming a sub-job's batch (:class:`~delayq_backends.rq.Batch`).
BATCH_META = "delayq_batch"
#: The ``job.meta`` fields that go into a job's envelope (see :meth:`Queue.job_envelope_bytes`).
_ENVELOPE_META = frozenset((RATE_KEY_META, SLOT_META, GROUP_META, BATCH_META, "traceparent"))
#: The collapse of the ``enqueue_at`` running in this context: RQ's enqueue_at builds the job and
#: calls ``schedule_job`` itself, and a retry's ``schedule_job`` must not inherit it.
_collapsing: ContextVar[Collapse | None] = ContextVar("delayq_collapsing", default=None)

_stores: StoreCache[tuple[Any, ...]] = StoreCache()


def store_of_connection(connection: redis.Redis) -> DelayStore:
    """The delay store for queues on ``connection``, from ``DELAYQ_URL``/``DELAYQ_PREFIX``/``DELAYQ_SHARDS``
    and ``DELAYQ_DURABLE_REPLICAS``/``DELAYQ_DURABLE_TIMEOUT_MS`` (each schedule WAITs for replicas).

    Without ``DELAYQ_URL`` the store lives on the queue's own Redis, which makes scheduling and
    forwarding atomic with RQ's writes. Env vars are the one channel that reaches queues that
    ``rq worker --queue-class`` constructs itself. Stores are cached per connection and settings,
    because a worker builds queues often and a store asks its server about cluster mode once.

    Raises:
        ConfigError: a malformed setting or an unreachable ``DELAYQ_URL``.
    """
    url = os.environ.get("DELAYQ_URL") or None
    prefix = os.environ.get("DELAYQ_PREFIX") or "delayq"
    shards = env_int("DELAYQ_SHARDS", "16", "the store's shard count")
    durable = env_int("DELAYQ_DURABLE_REPLICAS", "0", "how many replicas must confirm each schedule")
    timeout = env_int("DELAYQ_DURABLE_TIMEOUT_MS", str(Config.durable_timeout_ms), "ms to wait for them")
    key = (url, prefix, shards, durable, timeout) if url else (id(connection), prefix, shards, durable, timeout)

    def build() -> DelayStore:
        config = Config(prefix=prefix, shards=shards, durable_replicas=durable, durable_timeout_ms=timeout)
        return DelayStore(connect(url), replace(config, url=url)) if url else DelayStore(connection, config)

    return _stores.get(
        key,
        build,
        # an id may be reused by a later connection: the store must be on this one
        valid=lambda store: url is not None or store.client is connection,
    )


def env_int(name: str, default: str, meaning: str, *, low: int | None = None, high: int | None = None) -> int:
    """The whole number in environment variable ``name`` (``default`` when unset or empty),
    within ``low``..``high`` when given: read where a worker or producer starts, so a bad
    setting stops it there with one line, not each job.

    Raises:
        ConfigError: not a whole number, or out of range; the message says what it means.
    """
    text = os.environ.get(name) or default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or (low is not None and value < low) or (high is not None and value > high):
        bounds = "" if low is None or high is None else f" between {low} and {high}"
        raise ConfigError(f"{name}={text!r}: use a whole number{bounds}, {meaning}")
    return value


def ready_at(when: Any) -> datetime:
    """A scheduled time as RQ reads it (a naive datetime is the machine's local time), checked.

    Raises:
        InvalidTimeError: not a datetime, or one the store cannot hold.
    """
    if not isinstance(when, datetime):
        raise InvalidTimeError(
            f"cannot schedule an RQ job at {when!r} ({type(when).__name__}): pass a datetime "
            "(enqueue_at) or a timedelta (enqueue_in)"
        )
    aware = when if when.tzinfo is not None else when.astimezone()
    to_ms(aware)
    return aware


def slot_meta(value: Any) -> dict[str, Any]:
    """The job meta of a ``delayq_slot=`` option (a key, or ``{"key", "limit"}``).

    Raises:
        InvalidSlotError: it is no slot; nothing was saved.
    """
    slot = Slot.parse(value)
    return {SLOT_META: {"key": slot.key, "limit": slot.limit}}


def group_options(kwargs: dict[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The job meta of the ``delayq_slot=`` and ``delayq_group=`` options, popped from ``kwargs``:
    a slot as ``{"key", "limit"}``, groups as a list of dicts (empty without either). Checked
    with the job's ``meta`` (its rate key counts towards the 3 groups too), so bad input raises
    before the job is saved.

    Raises:
        InvalidSlotError, InvalidGroupError: no slot or groups, or too many; nothing was saved.
    """
    slot, groups = kwargs.pop(SLOT_OPTION, None), kwargs.pop(GROUP_OPTION, None)
    added = {} if slot is None else slot_meta(slot)
    parsed = () if groups is None else parse_groups(groups)
    if parsed:
        added[GROUP_META] = [g.to_meta() for g in parsed]
    if added:
        with_job_groups(Envelope("rq", ""), {**meta, **added}, 0)
    return added


def with_job_groups(envelope: Envelope, meta: Mapping[str, Any], rank: int) -> Envelope:
    """``envelope`` with a job's rate key, slot (with the job's ``rank``) and groups from its
    ``meta``, as it has them; and the trace context it carries (:func:`carry_trace`), for the
    forward's span.

    Raises:
        InvalidRateKeyError, InvalidSlotError, InvalidGroupError: what the meta names is none,
            or more than 3 groups with the aliases.
    """
    rate_key, slot, groups, trace = meta.get(RATE_KEY_META), meta.get(SLOT_META), meta.get(GROUP_META), _trace_of(meta)
    if trace is not None:
        envelope = replace(envelope, meta={**envelope.meta, TRACE_META: trace})
    if rate_key is not None:
        envelope = with_rate_key(envelope, rate_key)
    if slot is not None:
        envelope = with_slot(envelope, Slot.parse(slot), rank)
    return envelope if groups is None else with_groups(envelope, groups)


def carry_trace(job: Job) -> None:
    """Put the current span's W3C context (``traceparent``, ``tracestate``) in ``job.meta``, saved
    with the job: the forward's span links to it and a worker with :class:`~.tracing.TracedJobs`
    runs the job in its trace. Outside a span (or without opentelemetry) the job keeps what it
    has: a retry scheduled with no span current keeps its first producer's."""
    carrier = current_carrier()
    if carrier is not None:
        kept = {k: v for k, v in (job.meta or {}).items() if k not in TRACE_FIELDS}
        job.meta = {**kept, **carrier}


def _trace_of(meta: Mapping[str, Any]) -> dict[str, str] | None:
    trace = {k: v for k in TRACE_FIELDS if isinstance(v := meta.get(k), str)}
    return trace or None


class UsesDelayStore:
    """The ``delay_store`` of a Queue or Scheduler: the one given, else :func:`store_of_connection`."""

    connection: redis.Redis
    _delay_store: DelayStore | None

    @property
    def delay_store(self) -> DelayStore:
        if self._delay_store is None:
            self._delay_store = store_of_connection(self.connection)
        return self._delay_store


class Queue(UsesDelayStore, RQQueue):
    """An ``rq.Queue`` that keeps scheduled jobs in a delay store instead of ``rq:scheduled:*``.

    Args:
        delay_store: where scheduled jobs wait; by default :func:`store_of_connection` the queue's
            connection (env vars, else the queue's own Redis).
        *args, **kwargs: as ``rq.Queue``.
    """

    def __init__(self, *args: Any, delay_store: DelayStore | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delay_store = delay_store
        self._envelope_bytes: bytes | None = None

    def envelope(self) -> Envelope:
        """What the store keeps beside a job id of this queue."""
        return job_envelope(self.name, queue_class=type(self), job_class=self.job_class, serializer=self.serializer)

    @property
    def scheduled_job_registry(self) -> ScheduledJobRegistry:
        """RQ's registry of this queue's waiting jobs: the store's, with their exact times."""
        return ScheduledJobRegistry(queue=self, job_class=self.job_class, serializer=self.serializer)

    def job_envelope_bytes(self, job: Job) -> bytes:
        """What the store keeps for ``job``: this queue's envelope, with the job's rate key, slot,
        groups, trace context and batch (a cancel or purge reports it) from its meta when it has them."""
        meta = job.meta or {}
        if _ENVELOPE_META.isdisjoint(meta):
            return self.envelope_bytes()
        envelope, batch = with_job_groups(self.envelope(), meta, job_rank(job)), meta.get(BATCH_META)
        return (envelope if batch is None else with_batch(envelope, str(batch))).encode()

    def envelope_bytes(self) -> bytes:
        """:meth:`envelope`, encoded once: it is the same for every job of this queue, and
        encoding it per ``enqueue_at`` was a tenth of the call."""
        if self._envelope_bytes is None:
            self._envelope_bytes = self.envelope().encode()
        return self._envelope_bytes

    def enqueue(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        """RQ's ``enqueue``; with ``delayq_slot=`` or ``delayq_group=`` the job goes through the
        store (due now), to wait there until its groups admit it."""
        if kwargs.get(SLOT_OPTION) is None and kwargs.get(GROUP_OPTION) in (None, [], ()):  # empty: no group
            kwargs.pop(SLOT_OPTION, None)
            kwargs.pop(GROUP_OPTION, None)
            return super().enqueue(f, *args, **kwargs)
        return self.enqueue_at(dt.datetime.now(dt.timezone.utc), f, *args, **kwargs)

    def enqueue_at(self, datetime: datetime, f: Any, *args: Any, **kwargs: Any) -> Job:
        """RQ's ``enqueue_at`` (``enqueue_in`` calls it), with ``delayq_debounce=``: all schedules
        of its key collapse into one run (see :meth:`DelayStore.debounce`). The job returned is
        the one this call saved; whether it or an earlier one runs follows the option's ``keep``,
        and the job not kept is deleted.

        Raises:
            InvalidDebounceError: a malformed option, or one with ``pipeline=`` (the collapse
                must see the saved job first); nothing was saved.
            InvalidSlotError, InvalidGroupError: ``delayq_slot=``/``delayq_group=`` name none,
                or more than 3 groups with the job's rate key; nothing was saved.
        """
        added = group_options(kwargs, kwargs.get("meta") or {})
        if added:  # in the job's meta: saved with it, kept by its retries, read by the worker
            kwargs["meta"] = {**(kwargs.get("meta") or {}), **added}
        option = kwargs.pop(DEBOUNCE_OPTION, None)
        if option is None:
            return super().enqueue_at(datetime, f, *args, **kwargs)  # type: ignore[no-any-return]
        collapse = Collapse.parse(option, DEBOUNCE_OPTION)
        if kwargs.get("pipeline") is not None:
            raise InvalidDebounceError(f"{DEBOUNCE_OPTION} cannot join a caller's pipeline: enqueue without one")
        token = _collapsing.set(collapse)
        try:
            return super().enqueue_at(datetime, f, *args, **kwargs)  # type: ignore[no-any-return]
        finally:
            _collapsing.reset(token)

    def schedule_job(self, job: Job, datetime: datetime, pipeline: Any | None = None, *args: Any, **kwargs: Any) -> Job:
        """Save the job as RQ does (status ``scheduled``) and schedule its id in the delay store.

        RQ's own ``schedule_job`` writes the job hash, so the saved job matches each RQ version
        exactly; its entry in ``rq:scheduled:<queue>`` becomes a mirror entry (see
        :mod:`.registry`) in the same transaction, so RQ's built-in scheduler never moves it.
        When the store lives on this queue's Redis, the store's entry joins that transaction
        (or the caller's ``pipeline``, as in a worker's retry): the job is scheduled completely
        or not at all. A job enqueued at the front (``at_front=True``) gets a higher rank, so a
        backlog of due jobs moves it first.

        Raises:
            InvalidTimeError: ``datetime`` is not a datetime; nothing was saved.
        """
        ready = ready_at(datetime)
        carry_trace(job)

        def save(pipe: Any) -> None:
            self._save_job(job, ready, pipe, *args, **kwargs)

        return self._schedule(job, ready, pipeline, save)

    def schedule_id(self, job: Job, datetime: datetime, pipeline: Any | None = None) -> Job:
        """Schedule an already saved job in the delay store (and its mirror entry), as
        ``ScheduledJobRegistry.schedule`` does for RQ."""
        ready = ready_at(datetime)
        return self._schedule(job, ready, pipeline, lambda pipe: None)  # the mirror entry alone

    def _schedule(self, job: Job, ready: datetime, pipeline: Any | None, save: Callable[[Any], None]) -> Job:
        """Queue ``save`` (RQ's writes of the job: its hash), the job's mirror entry and the
        store's entry on one transaction when the store shares this queue's Redis. ``ready`` is
        checked (:func:`ready_at`): once per call, as every step here reads it.

        The usual ``enqueue_at`` (no caller's pipeline, writes :func:`job_writes` knows) sends
        them as one script call instead (:class:`RqSchedule`): as atomic, and a third cheaper
        than the transaction, whose seven commands the producer packed and parsed one by one.
        Its mirror entry is then never queued: its score goes straight into the call."""
        collapse = _collapsing.get()
        if collapse is not None:
            _collapsing.set(None)  # this job only: not the dependents or retries it schedules
            return self._collapse(job, ready, save, collapse)
        store = self.delay_store
        envelope = self.job_envelope_bytes(job)
        shared = on_store_server(store, self.connection)
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        save(pipe)
        writes = job_writes(pipe.command_stack, self, job, ready) if shared and pipeline is None else None
        if writes is not None:
            store.schedule_with(
                lambda keys, item, wake: RqSchedule.call(keys, item, writes, wake=wake),
                job.id,
                ready,
                envelope,
                rank=job_rank(job),
                client=self.connection,  # RQ's user writes RQ's keys
            )
            return job
        self.registry_write(pipe, job, ready)
        if shared:
            store.schedule(job.id, ready, envelope, rank=job_rank(job), pipeline=pipe)
        if pipeline is None:
            pipe.execute()
            if shared:
                store.confirm_durable()  # RQ's transaction held our write: WAIT after its EXEC
        elif shared and store.config.durable_replicas:
            _confirm_after_execute(pipe, store)
        if not shared:
            # The job hash is saved first (or with the caller's pipeline): an id due at once must
            # not reach the forwarder before its job exists.
            store.schedule(job.id, ready, envelope, rank=job_rank(job))
        return job

    def _collapse(self, job: Job, ready: datetime, save: Callable[[Any], None], collapse: Collapse) -> Job:
        """Save the job, then collapse it into its key's run; delete the job that will not run
        (this one with ``keep="first"`` on a pending run, the one it replaced with ``"last"``).

        Not one transaction with the save, as a plain schedule is: the script's answer decides
        what to delete. A crash in between leaves a saved job that never runs (status
        ``scheduled``), never a run without its job.
        """
        with self.connection.pipeline() as pipe:
            save(pipe)
            self.registry_write(pipe, job, ready)
            pipe.execute()
        envelope = with_job_groups(self.envelope(), job.meta or {}, job_rank(job))
        envelope = replace(envelope, meta={**envelope.meta, JOB_KEY: job.id})
        done = collapse.apply(self.delay_store, ready, envelope, rank=job_rank(job))
        dropped = [] if done.stored else [job.id]
        if done.superseded is not None:
            dropped.append(str(Envelope.decode(done.superseded).meta.get(JOB_KEY, "")))
        for job_id in filter(None, dropped):
            with suppress(NoSuchJobError):  # deleted meanwhile: nothing to clean up
                self.job_class.fetch(job_id, connection=self.connection, serializer=self.serializer).delete()
        return job

    def save_scheduled(self, job: Job, datetime: datetime, pipeline: Any, *args: Any, **kwargs: Any) -> None:
        """Queue on ``pipeline`` the job hash as RQ's ``schedule_job`` saves it (status ``scheduled``),
        with its ``rq:scheduled:<queue>`` entry as a mirror: the delay store's entry is the
        caller's to write.

        RQ's own ``schedule_job`` runs, so the hash matches each RQ version exactly, but through
        :class:`_RegistryDropped`: its ``rq:scheduled:<queue>`` ZADD is never sent, rather than
        written and then removed (two commands per job, a fifth of ``enqueue_at``). Bulk loaders
        save many jobs on one pipeline this way, then store their ids in one ``schedule_many``.
        """
        self._save_job(job, datetime, pipeline, *args, **kwargs)
        self.registry_write(pipeline, job, datetime)

    def _save_job(self, job: Job, datetime: datetime, pipeline: Any, *args: Any, **kwargs: Any) -> None:
        """:meth:`save_scheduled` without the mirror entry: RQ's writes of the job alone."""
        registry = ScheduledJobRegistry.key_template.format(self.name)
        dropping = _RegistryDropped(pipeline, registry)
        super().schedule_job(job, datetime, dropping, *args, **kwargs)  # type: ignore[arg-type]
        if not dropping.dropped:  # written some other way (rq 3's unique=True runs its own script)
            pipeline.zrem(registry, job.id)

    def registry_write(self, pipeline: Any, job: Job, datetime: datetime) -> None:
        """Queue the job's ``rq:scheduled:<queue>`` entry as a mirror (see :mod:`.registry`):
        listed where RQ and rq-dashboard look, scored where RQ's scheduler never moves it.

        ``datetime`` is one RQ took (a naive one is local time, as ``timestamp()`` reads it):
        checked by the caller, not again here."""
        mirror_scheduled(pipeline, self.name, {job.id: datetime.timestamp()})


def job_writes(
    commands: Iterable[tuple[tuple[Any, ...], Any]], queue: Queue, job: Job, ready: datetime
) -> RqJobWrites | None:
    """The commands (a pipeline's ``command_stack``) that RQ's ``schedule_job`` queued for ``job``
    (:meth:`Queue.save_scheduled` before its mirror entry), as one :class:`RqJobWrites` with the
    mirror entry for ``ready``: RQ's entry in ``rq:queues`` and the job hash. None when they hold
    anything else (a TTL's EXPIREs, an older RQ's ZREM of its registry entry, a subclass's own
    writes): those are sent in a transaction as queued, as RQ wrote them."""
    job_key, queues = job.key, ("SADD", queue.redis_queues_keys, queue.key)  # RQ computes job.key per read
    fields: list[Any] = []
    listed = False
    for args, _ in commands:
        if args[0] == "HSET" and args[1] == job_key:
            fields += args[2:]
        elif args == queues:
            listed = True
        else:
            return None
    if not (listed and fields):
        return None
    registry = registry_key(queue.name)
    return RqJobWrites(queues[1], queues[2], job_key, tuple(fields), registry, mirror_score(ready.timestamp()))


def _confirm_after_execute(pipeline: Any, store: DelayStore) -> None:
    """Have ``pipeline``'s ``execute`` WAIT for the replicas (``store.confirm_durable``) once its
    EXEC has run. For RQ's own pipelines: a worker retrying a failed job with
    ``Retry(interval=…)`` schedules it on the pipeline ``handle_job_failure`` makes and executes,
    and RQ offers no hook after that EXEC. A ``NotDurableError`` reaches the worker, which logs
    that the failure may not be persisted; the write is on the primary."""
    execute = pipeline.execute
    if getattr(execute, "delayq_confirms", False):
        return  # one WAIT per EXEC, however many jobs it schedules

    def confirmed(*args: Any, **kwargs: Any) -> Any:
        replies = execute(*args, **kwargs)
        store.confirm_durable()
        return replies

    confirmed.delayq_confirms = True  # type: ignore[attr-defined]
    pipeline.execute = confirmed


class _RegistryDropped:
    """A pipeline that drops a ZADD to one key (RQ's scheduled registry) and passes every other
    command on. RQ's ``schedule_job`` takes it as its ``pipeline``, so it does not execute it."""

    def __init__(self, pipeline: Any, key: str) -> None:
        self._pipeline = pipeline
        self._key = key
        self.dropped = False

    def zadd(self, name: Any, mapping: Mapping[Any, Any], *args: Any, **kwargs: Any) -> Any:
        if name == self._key:
            self.dropped = True
            return self._pipeline
        return self._pipeline.zadd(name, mapping, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)


class ScheduledJobRegistry(RQScheduledJobRegistry):
    """RQ's registry of a delayq :class:`~delayq_backends.rq.Queue`: ids, count and order from the
    mirror entries, each job's exact time from the delay store.

    ``schedule`` and ``remove`` keep the store in step, so code that schedules or unschedules
    through the registry behaves as with RQ.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As RQ's: ``(name, connection=…)`` or ``(queue=…)``; a plain ``rq.Queue`` or a name
        gets a :class:`~delayq_backends.rq.Queue` of the same name, for its delay store."""
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        queue = kwargs.get("queue")
        self.delayq_queue: Queue = (
            queue
            if isinstance(queue, Queue)
            else Queue(self.name, connection=self.connection, job_class=self.job_class, serializer=self.serializer)
        )

    def get_scheduled_time(self, job_or_id: Job | str) -> datetime:
        """When the job is due (aware, UTC), to the millisecond.

        Raises:
            NoSuchJobError: it is not waiting, neither in the store nor with a real score here.
        """
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        item = self.delayq_queue.delay_store.get(job_id)
        if item is not None:
            return datetime.fromtimestamp(item.ready_ms / 1000, tz=timezone.utc)
        score = self.connection.zscore(self.key, job_id)
        if score is None or is_mirror(score):
            raise NoSuchJobError(f"Job {job_id} not found in {self.key}")
        return datetime.fromtimestamp(score, tz=timezone.utc)

    def get_expiration_time(self, job: Job) -> datetime:
        """The entry's time as RQ's registry keeps it: whole seconds (the mirror's offset taken off)."""
        score = self.connection.zscore(self.key, job.id)
        if score is not None and is_mirror(score):
            score = int(score - MIRROR_OFFSET_S)
        return datetime.fromtimestamp(score, timezone.utc)  # type: ignore[arg-type]

    def schedule(self, job: Job, scheduled_datetime: datetime, pipeline: Any | None = None) -> Any:
        """Put ``job`` (already saved) in the store at ``scheduled_datetime`` (naive: local time, as RQ).

        Unlike RQ's, this marks the job ``scheduled``: the forwarder moves only jobs still
        scheduled, which is what keeps a cancelled or already moved job from running twice.
        """
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        job.set_status(JobStatus.SCHEDULED, pipeline=pipe)
        self.delayq_queue.schedule_id(job, scheduled_datetime, pipe)
        if pipeline is None:
            pipe.execute()

    def remove(self, job: Job | str, pipeline: Any | None = None, delete_job: bool = False) -> Any:
        """Unschedule ``job`` here and in the store (and delete it with ``delete_job``)."""
        job_id = job.id if isinstance(job, Job) else job
        self.delayq_queue.delay_store.cancel(job_id)
        return super().remove(job, pipeline=pipeline, delete_job=delete_job)
