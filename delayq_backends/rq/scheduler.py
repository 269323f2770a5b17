"""``delayq_backends.rq.Scheduler``: rq-scheduler's ``Scheduler`` API on the delay store.

Changing the import is the whole migration: the constructor and the methods take the same
arguments and behave the same, but no ``rqscheduler`` daemon, lock or poll interval is
involved. ``delayq forward --rq-redis …`` moves due jobs into their queues and re-arms periodic
and cron jobs as it moves them, in the same step, so any number of forwarders never run a job
twice. Times follow rq-scheduler: a naive datetime is UTC.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from itertools import islice
from typing import Any, NoReturn, cast

import redis
from rq import Queue as RQQueue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.utils import import_attribute

from ..connection import on_store_server
from ..envelope import Envelope
from ..errors import DelayqError, EnvelopeError, InvalidTimeError
from ..models import CancelOutcome, ScheduledItem
from ..overlap_policy import ALLOW, check_policy, overlap_slot
from ..store import DelayStore
from ..timeutil import to_ms
from .jobs import KIND, OVERLAP_FIELD, SCHEDULE_KEY, job_envelope, job_rank, schedule_of
from .periodic import (
    RQ_SCHEDULER,
    SYNTAX_KEY,
    InvalidScheduleError,
    advance,
    check_cron,
    check_interval,
    check_syntax,
    next_cron_time,
)
from .queue import SLOT_META, UsesDelayStore, carry_trace, group_options, with_job_groups
from .registry import forget_scheduled

__all__ = ["JobNotScheduledError", "NoSchedulerKeyError", "NoSchedulerProcessError", "Scheduler"]

#: The kwargs of ``enqueue_at``/``enqueue_in`` meant for the job, not the function (rq-scheduler's list).
_JOB_KWARGS = {
    "timeout": "timeout",
    "job_id": "id",
    "job_ttl": "ttl",
    "job_result_ttl": "result_ttl",
    "job_description": "description",
    "depends_on": "depends_on",
    "meta": "meta",
    "queue_name": "queue_name",
    "on_success": "on_success",
    "on_failure": "on_failure",
}

Until = datetime | timedelta | int | float | None

#: Items read per store call by ``get_jobs`` and ``count``.
PAGE = 500


class JobNotScheduledError(DelayqError, ValueError):
    """``change_execution_time`` on a job that is not scheduled (rq-scheduler raises ValueError)."""


class NoSchedulerProcessError(DelayqError, NotImplementedError):
    """An rq-scheduler daemon method (``run``, ``acquire_lock``, ...) called on the Scheduler,
    which has no daemon: ``delayq forward`` does its work."""


class NoSchedulerKeyError(NoSchedulerProcessError, AttributeError):
    """An rq-scheduler daemon key (``scheduler_lock_key``, ``scheduled_jobs_key``, ...) read on
    the Scheduler: none exists, and reading rq-scheduler's would say "no scheduler, no jobs".
    An AttributeError too, so ``hasattr`` and ``getattr(..., default)`` answer as for any
    attribute the class lacks, but with the fix in its message."""


class _DaemonKey:
    """A key of rq-scheduler's daemon (a class attribute there), which this Scheduler lacks: its
    access raises :class:`NoSchedulerKeyError` saying what to read instead (``instead``)."""

    def __init__(self, instead: str) -> None:
        self.instead = instead

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> NoReturn:
        raise NoSchedulerKeyError(
            f"Scheduler.{self.name}: delayq_backends.rq.Scheduler has no scheduler process, so no such key "
            f"(`{FORWARD_COMMAND}` moves due jobs, leaderless, with no lock); {self.instead}"
        )


#: What replaces ``rqscheduler`` / ``Scheduler.run()``, for the daemon methods' error.
FORWARD_COMMAND = "delayq forward --url <store's Redis> --rq-redis <RQ's Redis>"


def utc_ms(when: Any) -> int:
    """A scheduled time as rq-scheduler reads it (a naive datetime is UTC), in checked epoch ms."""
    if isinstance(when, datetime) and when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return to_ms(when)


def seconds(ms: int) -> float:
    """Epoch ms as the epoch seconds the store's API takes (exact to the ms after its rounding)."""
    return ms / 1000


def _score(item: ScheduledItem) -> int:
    """An item's place in the store's order: its lease deadline while leased, else its ready time."""
    return item.ready_ms if item.leased_until_ms is None else item.leased_until_ms


def _is_rq(data: bytes) -> bool:
    try:
        return Envelope.decode(data).target == KIND
    except EnvelopeError:  # shown by `delayq list`; not an RQ job either way
        return False


def _wall_clock() -> float:
    """``time.time()`` looked up at each call: a default bound at import would miss freezegun,
    which patches ``time.time`` while a test runs."""
    return time.time()


def _named(func: Any) -> str:
    """A job's name for an error before it has an id: its function's dotted path."""
    return (
        func if isinstance(func, str) else f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
    )


def _resolve(value: str | type | None, default: type) -> type:
    if value is None:
        return default
    if isinstance(value, str):
        return cast(type, import_attribute(value))
    return value


class Scheduler(UsesDelayStore):
    """Schedule RQ jobs once, periodically or by cron, as rq-scheduler does.

    Args:
        queue_name: default queue of the jobs (``queue`` overrides it).
        queue: an ``rq.Queue`` whose name and connection to use.
        interval: rq-scheduler's polling interval; accepted and unused (nothing polls).
        connection: RQ's Redis; taken from ``queue`` when not given.
        job_class, queue_class: classes or dotted paths, as rq-scheduler takes them; the
            forwarder imports them when it moves the job, if they are on its allowlist
            (``delayq forward --rq-allow-class``).
        name: accepted for compatibility.
        delay_store: where jobs wait; by default as for :class:`~delayq_backends.rq.Queue`.
        cron_syntax: how :meth:`cron` reads its strings: ``"rq-scheduler"`` (the default:
            rq-scheduler 0.14's ``crontab`` parser, host-local time) or ``"cron"`` (standard
            cron with croniter, UTC or ``use_local_timezone``); see :mod:`.periodic`.
        clock: "now" in epoch seconds (tests pass a fake one). By default ``time.time`` as it
            is when called, so freezegun's ``freeze_time`` moves this Scheduler's "now" too, as it
            moves rq-scheduler's.

    Raises:
        InvalidScheduleError: neither ``connection`` nor ``queue`` given.
    """

    queue_class: type[RQQueue] = RQQueue
    job_class: type[Job] = Job
    # rq-scheduler's daemon keys: a ported health check or script reads them; each says what instead
    scheduler_lock_key = _DaemonKey("to see that forwarders run, read `delayq stats` or the forwarders' metrics")
    scheduler_key = _DaemonKey("to see that forwarders run, read `delayq stats` or the forwarders' metrics")
    redis_scheduler_namespace_prefix = _DaemonKey("forwarders register no scheduler instance in RQ's Redis")
    scheduled_jobs_key = _DaemonKey(
        "the jobs wait in the delay store: read them with Scheduler.get_jobs() / count() (or `delayq list`), "
        "or RQ's ScheduledJobRegistry, which lists them too"
    )

    def __init__(
        self,
        queue_name: str = "default",
        queue: RQQueue | None = None,
        interval: float = 60,
        connection: redis.Redis | None = None,
        job_class: str | type[Job] | None = None,
        queue_class: str | type[RQQueue] | None = None,
        name: str | None = None,
        *,
        delay_store: DelayStore | None = None,
        cron_syntax: str = RQ_SCHEDULER,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if connection is None and queue is None:
            raise InvalidScheduleError("Scheduler needs connection=Redis(...) (or queue=Queue(...))")
        self.connection: redis.Redis = connection if connection is not None else queue.connection  # type: ignore[union-attr]
        self.queue_name = queue.name if queue is not None else queue_name
        self.job_class = _resolve(job_class, type(self).job_class)
        self.queue_class = _resolve(queue_class, type(self).queue_class)
        #: rq-scheduler records a queue class given by path in each job's meta, for get_queue_for_job
        self.queue_class_name = queue_class if isinstance(queue_class, str) else None
        self.cron_syntax = check_syntax(cron_syntax)
        self.name = name
        self.clock: Callable[[], float] = clock or _wall_clock
        self._delay_store = delay_store

    # -- scheduling ---------------------------------------------------------------------------

    def enqueue_at(self, scheduled_time: datetime, func: Any, *args: Any, **kwargs: Any) -> Job:
        """Run ``func(*args, **kwargs)`` at ``scheduled_time`` (naive means UTC).

        The keyword arguments rq-scheduler reserves (``timeout``, ``job_id``, ``job_ttl``,
        ``job_result_ttl``, ``job_description``, ``depends_on``, ``meta``, ``queue_name``,
        ``on_success``, ``on_failure``, ``at_front``) configure the job, not the call;
        ``delayq_slot`` gives it a concurrency slot, ``delayq_group`` its groups (as
        :meth:`Queue.enqueue_at <delayq_backends.rq.Queue.enqueue_at>`).

        Raises:
            InvalidSlotError, InvalidGroupError: ``delayq_slot``/``delayq_group`` name none, or
                more than 3 groups with the job's rate key; nothing was saved.
        """
        ready = utc_ms(scheduled_time)
        options = {target: kwargs.pop(name) for name, target in _JOB_KWARGS.items() if name in kwargs}
        at_front = bool(kwargs.pop("at_front", False))
        added = group_options(kwargs, options.get("meta") or {})
        job = self._create_job(func, args=args, kwargs=kwargs, **options)
        job.meta.update(added)
        return self._schedule(job, ready, at_front=at_front)

    def enqueue_in(self, time_delta: timedelta, func: Any, *args: Any, **kwargs: Any) -> Job:
        """Like :meth:`enqueue_at`, ``time_delta`` from now."""
        if not isinstance(time_delta, timedelta):
            raise InvalidTimeError(f"enqueue_in takes a timedelta, got {type(time_delta).__name__} {time_delta!r}")
        return self.enqueue_at(self._now() + time_delta, func, *args, **kwargs)

    def schedule(
        self,
        scheduled_time: datetime,
        func: Any,
        args: Any = None,
        kwargs: Any = None,
        interval: float | None = None,
        repeat: int | None = None,
        result_ttl: int | None = None,
        ttl: int | None = None,
        timeout: Any = None,
        id: str | None = None,
        description: str | None = None,
        queue_name: str | None = None,
        meta: dict[str, Any] | None = None,
        depends_on: Any = None,
        on_success: Any = None,
        on_failure: Any = None,
        at_front: bool | None = None,
        *,
        overlap: str = ALLOW,
    ) -> Job:
        """Run ``func`` at ``scheduled_time``, then every ``interval`` seconds, ``repeat`` runs in
        all (None: forever). A periodic job keeps its result (``result_ttl=-1``) unless told
        otherwise, because its hash must outlive the interval to run again.

        ``overlap`` (``"allow"``, ``"skip"``, ``"buffer_one"``): what a period does while the
        previous run still runs (see :mod:`delayq_backends.overlap_policy`; run the workers as
        ``SlotWorker``)."""
        ready = utc_ms(scheduled_time)
        if repeat is not None and interval is None:
            raise InvalidScheduleError("Can't repeat a job without interval argument: pass interval=<seconds>")
        if interval is not None:
            check_interval(interval)
        policy = check_policy(id or _named(func), overlap)
        if policy != ALLOW and interval is None:
            raise InvalidScheduleError(f"overlap={policy!r} is for periodic jobs: pass interval=<seconds> too")
        if interval is not None and result_ttl is None:
            result_ttl = -1
        job = self._create_job(
            func, args=args, kwargs=kwargs, result_ttl=result_ttl, ttl=ttl, id=id, description=description,
            queue_name=queue_name, timeout=timeout, meta=meta, depends_on=depends_on,
            on_success=on_success, on_failure=on_failure,
        )  # fmt: skip
        if interval is not None:
            job.meta["interval"] = interval
        if repeat is not None:
            job.meta["repeat"] = int(repeat)
        return self._schedule(job, ready, at_front=bool(at_front), overlap=policy)

    def cron(
        self,
        cron_string: str,
        func: Any,
        args: Any = None,
        kwargs: Any = None,
        repeat: int | None = None,
        queue_name: str | None = None,
        result_ttl: int = -1,
        ttl: int | None = None,
        id: str | None = None,
        timeout: Any = None,
        description: str | None = None,
        meta: dict[str, Any] | None = None,
        use_local_timezone: bool = False,
        depends_on: Any = None,
        on_success: Any = None,
        on_failure: Any = None,
        at_front: bool = False,
        cron_syntax: str | None = None,
        *,
        overlap: str = ALLOW,
    ) -> Job:
        """Run ``func`` whenever ``cron_string`` matches, ``repeat`` runs in all (None: forever).

        ``cron_syntax`` (default: the Scheduler's, ``"rq-scheduler"``) says how the string reads:
        as rq-scheduler 0.14 reads it (host-local time; a 6th field is a year), or as standard
        cron (``"cron"``: UTC, or the local zone with its DST rules with ``use_local_timezone``).
        ``overlap``: as for :meth:`schedule`.
        """
        syntax = check_syntax(cron_syntax or self.cron_syntax)
        check_cron(cron_string, syntax)
        policy = check_policy(id or _named(func), overlap)
        first = next_cron_time(cron_string, self.clock(), use_local_timezone=use_local_timezone, syntax=syntax)
        if first is None:
            raise InvalidScheduleError(
                f"cron string {cron_string!r} never matches again (its year field lies in the past): "
                "fix the year, or drop the sixth field to repeat every year"
            )
        ready = int(first * 1000)
        job = self._create_job(
            func, args=args, kwargs=kwargs, result_ttl=result_ttl, ttl=ttl, id=id, queue_name=queue_name,
            description=description, timeout=timeout, meta=meta, depends_on=depends_on,
            on_success=on_success, on_failure=on_failure,
        )  # fmt: skip
        job.meta["cron_string"] = cron_string
        job.meta["use_local_timezone"] = use_local_timezone
        if repeat is not None:
            job.meta["repeat"] = int(repeat)
        return self._schedule(job, ready, at_front=at_front, syntax=syntax, overlap=policy)

    def _create_job(self, func: Any, *, queue_name: str | None = None, **options: Any) -> Job:
        options["args"] = options.get("args") or ()
        options["kwargs"] = options.get("kwargs") or {}
        job = self.job_class.create(func, connection=self.connection, status=JobStatus.SCHEDULED, **options)
        job.origin = queue_name or self.queue_name
        if self.queue_class_name:
            job.meta["queue_class_name"] = self.queue_class_name
        return job

    def _schedule(
        self, job: Job, ready_ms: int, *, at_front: bool, syntax: str | None = None, overlap: str = ALLOW
    ) -> Job:
        """Save the job hash and schedule its id; one transaction when the store shares RQ's Redis.

        The hash is written first otherwise: an id due at once must not reach a forwarder
        before its job exists. With an overlap policy, the job's meta names its slot (the worker
        holds it while a run runs) and its envelope the policy (the forwarder asks the slot);
        the envelope carries no slot of its own, as each run asks at fire time.
        """
        if at_front:
            job.enqueue_at_front = True
        store = self.delay_store
        schedule = schedule_of(job.meta)
        if syntax is not None:
            schedule[SYNTAX_KEY] = syntax
        if overlap != ALLOW:
            job.meta[SLOT_META] = {"key": overlap_slot(job.id).key, "limit": 1}
            schedule[OVERLAP_FIELD] = overlap
        envelope = job_envelope(
            job.origin, queue_class=self.queue_class, job_class=self.job_class, scheduler=True, schedule=schedule,
        )  # fmt: skip
        if not schedule:  # a one-off job; the runs of a repeating one share its id, so no slot (yet)
            carry_trace(job)  # nor a producer's trace: each run of a repeating one starts its own
            envelope = with_job_groups(envelope, job.meta or {}, job_rank(job))
        if on_store_server(store, self.connection):
            with self.connection.pipeline() as pipe:
                job.save(pipeline=pipe)
                store.schedule(job.id, seconds(ready_ms), envelope, rank=job_rank(job), pipeline=pipe)
                pipe.execute()
            store.confirm_durable()
        else:
            job.save()
            store.schedule(job.id, seconds(ready_ms), envelope, rank=job_rank(job))
        return job

    # -- rq-scheduler's daemon: replaced by `delayq forward` -----------------------------------

    def run(self, burst: bool = False) -> None:
        self._no_daemon("run")

    def register_birth(self) -> None:
        self._no_daemon("register_birth")

    def register_death(self) -> None:
        self._no_daemon("register_death")

    def acquire_lock(self) -> bool:
        self._no_daemon("acquire_lock")

    def remove_lock(self) -> None:
        self._no_daemon("remove_lock")

    def heartbeat(self) -> None:
        self._no_daemon("heartbeat")

    @staticmethod
    def _no_daemon(method: str) -> NoReturn:
        """The daemon methods exist so a ported ``rqscheduler`` script fails with the fix, not
        a bare AttributeError."""
        raise NoSchedulerProcessError(
            f"Scheduler.{method}(): delayq_backends.rq.Scheduler has no scheduler process; run "
            f"`{FORWARD_COMMAND}` instead of rqscheduler (it moves due jobs and re-arms periodic ones)"
        )

    # -- inspecting and changing --------------------------------------------------------------

    def cancel(self, job: Job | str) -> None:
        """Unschedule ``job`` (a Job or an id); the job hash stays, as with rq-scheduler."""
        self.delay_store.cancel(job.id if isinstance(job, Job) else job)

    def __contains__(self, item: Job | str) -> bool:
        return self.delay_store.exists(item.id if isinstance(item, Job) else item)

    def change_execution_time(self, job: Job, date_time: datetime) -> None:
        """Move a scheduled job to ``date_time`` (naive means UTC).

        Raises:
            JobNotScheduledError: the job is not scheduled (any more).
        """
        outcome = self.delay_store.reschedule(job.id, seconds(utc_ms(date_time)))
        if not outcome:
            hint = "it is being enqueued now (in flight)" if outcome.value == "in flight" else "schedule it first"
            raise JobNotScheduledError(f"Job {job.id!r} not in scheduled jobs queue: {hint}")

    def count(self, until: Until = None) -> int:
        """How many RQ jobs are scheduled up to ``until`` (datetime, timedelta from now, epoch s)."""
        return sum(1 for _ in self._scheduled(until))

    def get_jobs(
        self, until: Until = None, with_times: bool = False, offset: int | None = None, length: int | None = None
    ) -> Iterator[Any]:
        """Scheduled jobs in time order up to ``until``; with ``with_times``, (job, naive UTC time).

        ``offset`` and ``length`` page the result and go together. Ids whose job hash is gone
        are unscheduled on the way, as rq-scheduler does.
        """
        if (offset is None) != (length is None):
            raise InvalidScheduleError("get_jobs: pass both offset and length, or neither")
        start = offset or 0
        stop = None if length is None or length < 0 else start + length
        for job_id, ready in islice(self._scheduled(until), start, stop):
            try:
                job = self.job_class.fetch(job_id, connection=self.connection)
            except NoSuchJobError:
                self.cancel(job_id)
                continue
            yield (
                (job, datetime.fromtimestamp(seconds(ready), tz=timezone.utc).replace(tzinfo=None))
                if with_times
                else job
            )

    def get_jobs_to_queue(self, with_times: bool = False) -> Iterator[Any]:
        """Jobs due now (rq-scheduler's helper); the forwarder moves them on its own."""
        return self.get_jobs(self._now(), with_times=with_times)

    def get_queue_for_job(self, job: Job) -> RQQueue:
        """The queue ``job`` runs on, as rq-scheduler picks it: its origin, with the queue class
        named in ``job.meta["queue_class_name"]`` if any, else this Scheduler's."""
        path = job.meta.get("queue_class_name")
        queue_class = cast(type[RQQueue], import_attribute(path) if path else self.queue_class)
        key = f"{queue_class.redis_queue_namespace_prefix}{job.origin}"
        return queue_class.from_queue_key(key, connection=self.connection, job_class=self.job_class)

    def enqueue_job(self, job: Job) -> None:
        """Run ``job`` now, as rq-scheduler's ``enqueue_job`` does: put it on its queue and, if
        it is periodic or cron, schedule its next run (one run counted down).

        The job leaves the store first: a forwarder cannot move this run as well. A job a
        forwarder is moving at this moment (leased) is left to it, since it runs now anyway.
        """
        store = self.delay_store
        item = store.get(job.id)
        if item is not None and item.leased_until_ms is not None:
            return
        envelope = Envelope.decode(item.envelope) if item is not None and _is_rq(item.envelope) else None
        outcome = store.cancel(job.id)
        if outcome is CancelOutcome.IN_FLIGHT:
            return
        queue = self.get_queue_for_job(job)
        queue.enqueue_job(job, at_front=bool(job.enqueue_at_front))
        forget_scheduled(self.connection, job.origin, [job.id])
        stored = envelope.meta.get(SCHEDULE_KEY) if envelope is not None else None
        if not isinstance(stored, dict) or envelope is None:
            return
        # rq-scheduler re-arms by the job it is given (its meta, as the caller may have changed
        # it); the runs left are counted in the envelope, as the forwarder counts them
        schedule = {**stored, **{k: v for k, v in schedule_of(job.meta).items() if k != "repeat"}}
        following = advance(schedule, now=self.clock())
        if following is not None:
            meta = {**envelope.meta, SCHEDULE_KEY: schedule}
            store.schedule(job.id, following, Envelope(KIND, envelope.destination, meta=meta), rank=job_rank(job))

    def enqueue_jobs(self) -> list[Job]:
        """Run every job that is due now (rq-scheduler's poll step); the forwarder does this on
        its own, so this is for tests and one-off catch-ups. Returns the jobs enqueued."""
        jobs = list(self.get_jobs_to_queue())
        for job in jobs:
            self.enqueue_job(job)
        return jobs

    def _scheduled(self, until: Until) -> Iterator[tuple[str, int]]:
        """(id, ready ms) of scheduled RQ jobs, earliest first, read a page at a time.

        Pages go by score (the last one seen, skipping the items already read at that score),
        not by offset, so reading N items costs O(N), not O(N^2 / page).
        """
        end = self._until_ms(until)
        low: int | None = None
        skip = 0
        while True:
            items = self.delay_store.scheduled(
                start=None if low is None else seconds(low),
                end=None if end is None else seconds(end),
                offset=skip,
                count=PAGE,
            )
            for item in items:
                if _is_rq(item.envelope):
                    yield item.id, item.ready_ms
            if len(items) < PAGE:
                return
            last = _score(items[-1])
            at_last = sum(1 for item in items if _score(item) == last)
            skip = skip + at_last if last == low else at_last
            low = last

    def _until_ms(self, until: Until) -> int | None:
        if until is None:
            return None
        if isinstance(until, timedelta):
            return utc_ms(self._now() + until)
        if isinstance(until, (int, float)) and not math.isfinite(until):
            return None if until > 0 else 0
        return utc_ms(until)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), tz=timezone.utc)
