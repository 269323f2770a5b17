"""RQ periodic entries: an RQ job template stored once, and one fresh RQ job written per period.

An entry of kind :data:`KIND` (``rq-periodic``) is one store item like a Celery entry
(:mod:`delayq_backends.periodic`); what is RQ's here is its run template and how a run is sent:

- **The template** (:class:`JobTemplate`) is the job hash RQ's ``Queue.enqueue`` would save for
  the entry's function, captured once when the entry is added or synced: ``Queue.create_job``
  with the function's *dotted path* (so nothing of the user's code is imported, at capture or
  when a forwarder fires it), its args and kwargs serialized by RQ's own serializer into
  ``data``, and the job options (``timeout``, ``result_ttl``, ``ttl``, ``failure_ttl``, ``meta``,
  webhooks) as RQ writes them. It lives in the entry's envelope: ``data`` as the body, the other
  fields and the user's ``meta`` (JSON) in its meta.
- **A run** is a new job with id ``uuid5(name, period)`` (:func:`~delayq_backends.periodic.schedules.run_task_id`,
  as Celery runs), its ``meta`` the entry's plus ``delayq_periodic = {"name", "due"}`` (run
  history reads it) and, under an overlap policy, the entry's slot for a ``SlotWorker`` to hold.
  A run waiting in the store (an overlap policy's ``buffer_one``) is an ``rq-run`` item holding
  the template, its entry's name and that meta as JSON.
- **Trust**: ``data`` is code an ``rq worker`` runs, so the forwarder writes an entry's run (or a
  stored run) only when its template is the one an operator defined for the entry
  (:mod:`delayq_backends.periodic.trust`: the digest :meth:`JobTemplate.digest`); any other item
  of these kinds is dead-lettered with the fix, and nothing reaches RQ.
  :class:`RQRunTarget` writes its hash and pushes it onto the queue in one script call
  (``rq_run.lua``); a job whose hash exists already is not pushed again, so a period sent twice
  (a forwarder killed between its publish and its rearm) is enqueued once while the first
  run's hash lives (RQ keeps it ``result_ttl``, 500 s by default, after a success).

The forwarder serializes each run's ``meta`` (a dict of plain values, never bytes from the
store) with the serializer the template names, RQ's default (pickle) or its JSON serializer; it
never deserializes anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import redis
from rq import Callback, Retry
from rq import Queue as RQQueue
from rq.job import Job, JobStatus
from rq.serializers import DefaultSerializer, JSONSerializer
from rq.utils import utcformat

from ..envelope import Envelope
from ..errors import DelayqError, EnvelopeError
from ..models import DeliveryFailure
from ..outages import gives_back
from ..overlap_policy import ALLOW, overlap_slot
from ..periodic.firing import FiringTarget, Run
from ..periodic.history import RUN_HEADER, RunMark
from ..periodic.schedules import run_task_id
from ..periodic.state import PeriodicState, state_of
from ..periodic.trust import TrustCheck, UntrustedError
from ..scripts import RqNewJob, RqRun, ScriptRunner
from ..store.lease import Lease
from ..targets import Delivery, PublishReport
from .queue import SLOT_META

__all__ = [
    "KIND",
    "MAX_RUNS_PER_CALL",
    "PERIODIC_META",
    "RUN_KIND",
    "JobTemplate",
    "RQPeriodicTarget",
    "RQRunTarget",
    "RQRuns",
    "TemplateError",
    "capture",
    "entry_view",
    "task_of",
    "template_digest",
    "run_envelope",
]

log = logging.getLogger("delayq.rq.entries")

#: ``Envelope.target`` of RQ periodic entries (fired by :class:`RQPeriodicTarget`).
KIND = "rq-periodic"
#: ``Envelope.target`` of one run of an entry: a new job for :class:`RQRunTarget` to write.
RUN_KIND = "rq-run"
#: The run's ``job.meta`` key naming its entry, period and kind (:class:`~delayq_backends.periodic.history.RunMark`).
PERIODIC_META = RUN_HEADER
#: The envelope meta key of a template (and of a run's fields).
_TEMPLATE = "rq"
#: Hash fields each run writes for itself (its meta, its creation and enqueue times).
_PER_RUN = ("meta", "created_at", "enqueued_at")
#: The serializers a template may name: the forwarder serializes each run's meta with it.
_SERIALIZERS: dict[str | None, Any] = {None: DefaultSerializer, "rq.serializers.JSONSerializer": JSONSerializer}
#: Runs written per script call: a run_all catch-up or a backfill sends up to 10,000 at once,
#: and a script's arguments (and Lua's unpack of the pushes) must stay bounded.
MAX_RUNS_PER_CALL = 500
#: An id the template is created with: no hash field holds it, each run has its own.
_PLACEHOLDER_ID = "00000000-0000-0000-0000-000000000000"


class TemplateError(DelayqError, ValueError):
    """An RQ job that cannot be a periodic entry's template (a value RQ cannot store, a
    serializer the forwarder cannot use)."""


@dataclass(frozen=True)
class JobTemplate:
    """The job hash of an entry's runs, less what each run writes for itself.

    Attributes:
        queue: the queue's name (the job's ``origin``).
        func: the function's dotted path (for listings; the worker reads it from ``data``).
        data: RQ's ``data`` field (compressed, serialized function, args and kwargs).
        fields: every other hash field as RQ's ``Job.to_dict`` writes it, text and integers.
        meta: the user's ``job.meta`` (JSON values), each run's meta starts from it.
        ttl: RQ's job ``ttl`` in seconds (the job's keys expire that long after its enqueue).
        serializer: None for RQ's default serializer, else the dotted path of RQ's JSON one.
    """

    queue: str
    func: str
    data: bytes
    fields: Mapping[str, str | int]
    meta: Mapping[str, Any] = field(default_factory=dict)
    ttl: int | None = None
    serializer: str | None = None

    def to_envelope(self, kind: str = KIND) -> Envelope:
        """The template as an envelope of ``kind`` (the entry's state is the caller's to add)."""
        described = {"func": self.func, "fields": dict(self.fields), "meta": dict(self.meta), "ttl": self.ttl}
        if self.serializer is not None:
            described["serializer"] = self.serializer
        return Envelope(kind, self.queue, body=self.data, meta={_TEMPLATE: described})

    @classmethod
    def from_envelope(cls, envelope: Envelope) -> JobTemplate:
        """The template an entry's envelope holds.

        Raises:
            EnvelopeError: it holds none, or one no release wrote.
        """
        try:
            described = envelope.meta[_TEMPLATE]
            fields, meta, ttl = dict(described["fields"]), dict(described["meta"]), described.get("ttl")
            serializer = described.get("serializer")
            if serializer not in _SERIALIZERS or (ttl is not None and type(ttl) is not int):
                raise ValueError(f"serializer {serializer!r}, ttl {ttl!r}")
            if not all(isinstance(k, str) and isinstance(v, (str, int)) for k, v in fields.items()):
                raise ValueError("a job field is not text or an integer")
            return cls(envelope.destination, str(described["func"]), envelope.body, fields, meta, ttl, serializer)
        except (KeyError, TypeError, ValueError) as exc:
            raise EnvelopeError(f"not an RQ periodic entry's job template: {type(exc).__name__}: {exc}") from exc

    def fingerprint(self) -> str:
        """A hash of what makes the runs, so a sync can tell an unchanged entry."""
        what = [self.queue, self.data.hex(), sorted(self.fields.items()), self.meta, self.ttl, self.serializer]
        return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def digest(self) -> str:
        """What an operator vouches for (:mod:`delayq_backends.periodic.trust`): every byte an RQ
        worker reads of the job but its ``meta`` (JSON values the forwarder serializes itself),
        so a stored run is checked by the same digest as its entry."""
        return _digest(self.queue, self.data, self.fields, self.ttl, self.serializer)

    def run_meta(self, mark: RunMark, slot: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``meta`` of one run, as JSON values: the entry's meta, its entry, period and kind
        (:data:`PERIODIC_META`, read by the workers' history reports) and, under an overlap
        policy, the entry's slot. The run's writer serializes it as RQ serializes ``job.meta``."""
        meta = {**self.meta, PERIODIC_META: mark.header()}
        if slot is not None:
            meta[SLOT_META] = dict(slot)
        return meta


def _digest(queue: str, data: bytes, fields: Mapping[str, Any], ttl: Any, serializer: Any) -> str:
    """sha256 of a job's queue, ``data``, other fields, ttl and serializer."""
    what = [queue, data.hex(), sorted(fields.items()), ttl, serializer]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def capture(
    func: str | Callable[..., Any],
    queue: str,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    job_timeout: int | None = None,
    result_ttl: int | None = None,
    ttl: int | None = None,
    failure_ttl: int | None = None,
    meta: Mapping[str, Any] | None = None,
    webhooks: Sequence[Any] | None = None,
    description: str | None = None,
    serializer: str | None = None,
    retry_max: int | None = None,
    retry_intervals: Sequence[int] | None = None,
    on_success: str | None = None,
    on_failure: str | None = None,
) -> JobTemplate:
    """The job RQ's ``Queue(queue).enqueue(func, args=..., kwargs=..., job_timeout=..., ...)``
    would save, as a template: RQ's own ``Queue.create_job`` builds it (defaults, the queue's
    timeout, the serialized ``data``), with ``func`` a dotted path, so nothing is imported and no
    Redis command is sent. ``retry_max``/``retry_intervals`` are RQ's ``Retry(max, interval)``,
    ``on_success``/``on_failure`` the import paths of RQ ``Callback``s (each run's job carries
    them as RQ's enqueue would write them: ``retries_left``, ``success_callback_name``, ...).

    Raises:
        TemplateError: ``meta`` is not JSON (each run's meta is rebuilt from it), a serializer
            other than RQ's two, or an option RQ refuses (its message is kept).
    """
    if serializer not in _SERIALIZERS:
        raise TemplateError(
            f"serializer {serializer!r}: periodic runs use RQ's default or rq.serializers.JSONSerializer"
        )
    try:
        json.dumps(dict(meta or {}), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TemplateError(
            f"meta {meta!r} is not JSON ({exc}): each run's meta is rebuilt from it; use plain values"
        ) from exc
    rq_queue = RQQueue(queue, connection=redis.Redis(), serializer=_SERIALIZERS[serializer])  # never connects
    try:
        job = rq_queue.create_job(
            func,  # type: ignore[type-var]  # a path or a function, as RQ's own enqueue takes
            args=tuple(args or ()), kwargs=dict(kwargs or {}), timeout=job_timeout, result_ttl=result_ttl,
            ttl=ttl, failure_ttl=failure_ttl, description=description, job_id=_PLACEHOLDER_ID,
            meta=dict(meta or {}), status=JobStatus.QUEUED, webhooks=webhooks,
            retry=Retry(retry_max, list(retry_intervals or [0])) if retry_max else None,
            on_success=Callback(on_success) if on_success else None,
            on_failure=Callback(on_failure) if on_failure else None,
        )  # fmt: skip
        saved = job.to_dict()
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"RQ cannot make a job of {func!r} with these options: {exc}") from exc
    except Exception as exc:  # the serializer: args or kwargs it cannot serialize
        raise TemplateError(f"RQ cannot serialize the args/kwargs of {func!r}: {type(exc).__name__}: {exc}") from exc
    data = saved.pop("data")
    fields = {k: _plain(v) for k, v in saved.items() if k not in _PER_RUN}
    odd = sorted(k for k, v in fields.items() if not isinstance(v, (str, int)))
    if odd:
        raise TemplateError(f"job fields {odd} of {func!r} are not text or integers: RQ {Job.__module__} changed?")
    return JobTemplate(queue, str(job.func_name), data, fields, dict(meta or {}), job.ttl, serializer)


def _plain(value: Any) -> Any:
    """A hash value as Redis stores it: an enum (``status``) by its value, a bool as 0/1."""
    if isinstance(value, Enum):
        return value.value
    return int(value) if isinstance(value, bool) else value


def run_envelope(template: JobTemplate, job_id: str, meta: Mapping[str, Any], entry: str) -> Envelope:
    """One run of entry ``entry``: a new job ``job_id`` of ``template`` with ``meta`` (JSON
    values, serialized when it is written), for :class:`RQRunTarget`. The serialized meta rides
    along in ``details`` for a forwarder of an earlier release during a rolling upgrade (this one
    never reads it: in the store it could be anyone's pickle)."""
    described = {
        "job": job_id, "fields": dict(template.fields), "ttl": template.ttl, "serializer": template.serializer,
        "entry": entry, "meta": dict(meta),
    }  # fmt: skip
    older = bytes(_SERIALIZERS[template.serializer].dumps(dict(meta)))
    return Envelope(RUN_KIND, template.queue, body=template.data, meta={_TEMPLATE: described}, details=older)


@dataclass(frozen=True)
class _RunJob:
    """What a run envelope holds: its job, the entry it is a run of, and the job's digest."""

    job: RqNewJob
    entry: str
    digest: str


def _run_job(d: Delivery, at: str) -> _RunJob:
    """The job a run delivery writes; ValueError if its envelope holds none (an envelope of an
    earlier release held its meta serialized, and names no entry: it cannot be checked)."""
    described = d.envelope.meta.get(_TEMPLATE)
    if not isinstance(described, Mapping) or not isinstance(described.get("job"), str):
        raise ValueError("its envelope holds no RQ job (written by another tool)")
    fields, ttl, serializer = described.get("fields"), described.get("ttl"), described.get("serializer")
    if not isinstance(fields, Mapping) or (ttl is not None and type(ttl) is not int) or serializer not in _SERIALIZERS:
        raise ValueError("its envelope's job fields, ttl or serializer are not RQ's (written by another tool)")
    entry, meta = described.get("entry"), described.get("meta")
    if not isinstance(entry, str) or not isinstance(meta, Mapping):
        raise ValueError(
            "its envelope names no entry and job meta (written by an earlier release or another tool), so it "
            "cannot be checked against the operator's definitions; if the entry is yours, send it again: "
            "`delayq periodic run NAME`"
        )
    job_id, data = described["job"], d.envelope.body
    meta_bytes = bytes(_SERIALIZERS[serializer].dumps(dict(meta)))
    values = {**fields, "data": data, "meta": meta_bytes, "created_at": at, "enqueued_at": at}
    job = RqNewJob(job_id, Job.key_for(job_id), values, ttl if ttl and ttl > 0 else None)
    return _RunJob(job, entry, _digest(d.envelope.destination, bytes(data), fields, ttl, serializer))


def _trusted(
    check: TrustCheck, lease: Lease, deliveries: Sequence[Delivery], wanted: Mapping[str, tuple[str, str]]
) -> tuple[list[Delivery], PublishReport]:
    """The deliveries whose (entry name, digest) in ``wanted`` an operator defined, and a report
    failing the others: dead letters naming the fix, or, when the definitions cannot be read (a
    hand write), waiting (never a dead letter for the store's damage). A delivery not in
    ``wanted`` (unreadable) passes: the target's own reading fails it with its reason."""
    report = PublishReport()
    try:
        refused = check.refused(lease.store, wanted)
    except UntrustedError as exc:
        log.error("%s", exc)
        report.failed += [DeliveryFailure(d.id, str(exc), waits=True) for d in deliveries]
        return [], report
    for item, why in refused.items():
        log.error("%s", why)
        report.failed.append(DeliveryFailure(item, why, permanent=True))
    return [d for d in deliveries if d.id not in refused], report


class RQRunTarget:
    """Delivers ``rq-run`` envelopes: writes each run's new job and pushes it onto its queue, one
    ``rq_run.lua`` call per queue; a job whose hash exists already is left as it is (counted as
    published: that run went out before).

    A run claimed from the store (:meth:`publish_claimed`) is written only if its template is its
    entry's operator-defined one; :meth:`publish_many` writes what it is given, for the entries'
    firing (:class:`RQPeriodicTarget`), which checked the entry it made the runs of.

    Args:
        connection: RQ's Redis (``decode_responses=False``).
    """

    kind = RUN_KIND
    _check = TrustCheck("RQ run")

    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection
        self.scripts = ScriptRunner(connection)

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        """Runs waiting in the store (an overlap policy's ``buffer_one``): checked, then written."""
        at = utcformat(datetime.now(timezone.utc))
        wanted = {}
        for d in deliveries:
            with contextlib.suppress(ValueError):  # publish_many fails it with the reason
                run = _run_job(d, at)
                wanted[d.id] = (run.entry, run.digest)
        trusted, report = _trusted(self._check, lease, deliveries, wanted)
        return report.merge(self.publish_many(trusted) if trusted else PublishReport())

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        report = PublishReport()
        at = utcformat(datetime.now(timezone.utc))
        by_queue: dict[str, list[tuple[Delivery, RqNewJob]]] = {}
        for d in deliveries:
            try:
                by_queue.setdefault(d.envelope.destination, []).append((d, _run_job(d, at).job))
            except ValueError as exc:
                report.failed.append(DeliveryFailure(d.id, f"RQ run {d.id!r} cannot be written: {exc}", permanent=True))
        for name, runs in by_queue.items():
            for first in range(0, len(runs), MAX_RUNS_PER_CALL):
                self._write(name, runs[first : first + MAX_RUNS_PER_CALL], report)
        return report

    def _write(self, name: str, runs: Sequence[tuple[Delivery, RqNewJob]], report: PublishReport) -> None:
        """One ``rq_run`` call for ``runs`` of queue ``name``; an outage gives them back unsent."""
        call = RqRun.call(RQQueue.redis_queues_keys, RQQueue.redis_queue_namespace_prefix + name, [j for _, j in runs])
        try:
            written = self.scripts.run(call)
        except Exception as exc:
            if not gives_back(exc):
                raise
            report.unsent += [d.id for d, _ in runs]
            report.broker_error = exc
            return
        for (d, job), new in zip(runs, written):
            if not new:
                log.info("RQ run %s of queue %r was enqueued before: not pushed again", job.job_id, name)
            report.published.append(d.id)

    def check(self) -> None:
        """PING RQ's Redis: connects and authenticates."""
        self.connection.ping()

    def queue_depth(self, queue: str) -> int:
        """Jobs waiting in RQ queue ``queue`` (flow control)."""
        return int(self.connection.llen(RQQueue.redis_queue_namespace_prefix + queue))

    def close(self) -> None:
        """The connection is the RQ target's too: it closes it."""


def task_of(envelope: Envelope) -> str:
    """The function a stored entry runs, for listings."""
    return JobTemplate.from_envelope(envelope).func


def template_digest(envelope: Envelope) -> str:
    """The digest of a stored entry's job template, recorded as its operator's definition."""
    return JobTemplate.from_envelope(envelope).digest()


def entry_view(envelope: Envelope) -> dict[str, Any]:
    """An ``rq-periodic`` item as ``delayq list`` and the item API show it, as a Celery periodic
    item is shown: its next run (that run's job id, the function, the call as RQ describes it,
    the queue) and the entry's name in ``periodic``. Nothing is deserialized.

    Raises:
        EnvelopeError: the item holds no RQ entry.
    """
    template, state = JobTemplate.from_envelope(envelope), state_of(envelope)
    return {
        "id": run_task_id(state.name, state.slot),
        "task": template.func,
        "description": template.fields.get("description"),
        "queue": template.queue,
        "periodic": state.name,
    }


class RQRuns:
    """The run maker of ``rq-periodic`` entries (:class:`~delayq_backends.periodic.firing.RunMaker`):
    one new job per run, id ``run.task_id(name)``, its meta naming the entry and period."""

    kind = KIND
    slot_run = None  # RQ's SlotWorker holds a slot by the job id alone

    def template(self, envelope: Envelope) -> JobTemplate:
        return JobTemplate.from_envelope(envelope)

    def run(self, entry: Delivery, template: JobTemplate, state: PeriodicState, run: Run, now_ms: int) -> Delivery:
        job_id = run.task_id(state.name)
        slot = None if state.overlap == ALLOW else {"key": overlap_slot(state.name).key, "limit": 1}
        meta = template.run_meta(RunMark(state.name, run.slot.at_ms, run.kind), slot)
        envelope = run_envelope(template, job_id, meta, state.name)
        return Delivery(f"{entry.id}#{job_id}", envelope, entry.attempts, run.slot.at_ms)


class RQPeriodicTarget(FiringTarget):
    """Fires ``rq-periodic`` items: each due run is a new job written by ``inner`` (the
    forwarder's :class:`RQRunTarget`), then the entry is acked and its next period stored in one
    step under the claim's lease (:class:`~delayq_backends.periodic.firing.FiringTarget`); an
    entry whose template is not the one an operator defined is dead-lettered unfired."""

    _check = TrustCheck("RQ periodic entry")

    def __init__(self, inner: RQRunTarget) -> None:
        super().__init__(RQRuns(), inner)

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        wanted = {}
        for d in deliveries:
            with contextlib.suppress(EnvelopeError):  # the firing fails it with the reason
                wanted[d.id] = (state_of(d.envelope).name, JobTemplate.from_envelope(d.envelope).digest())
        trusted, report = _trusted(self._check, lease, deliveries, wanted)
        return report.merge(super().publish_claimed(trusted, lease) if trusted else PublishReport())
