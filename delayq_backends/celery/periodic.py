"""Periodic tasks without ``celery beat``: the app's ``beat_schedule``, fired by the forwarders.

Each entry of ``app.conf.beat_schedule`` is **one store item**, id ``periodic:<name>``, due at
the entry's next period. Its envelope (kind ``celery-periodic``) holds the task message, built
once by Celery's own sender at sync time, and the schedule. When it comes due, a forwarder
claims it like any item; :class:`PeriodicTarget` publishes the period's run (a Celery message
with task id ``uuid5(name, period)``) through the Celery target, then **acks it and schedules
the next period in one script call** (``rearm.lua``), only while the claim's lease is still
ours. So any number of forwarders run active-active with no lock and no leader:

- each period's next run is written exactly once: a forwarder killed before the rearm leaves
  the item leased; when the lease runs out another forwarder fires it (and rearms), so no
  period is skipped; one killed after it has done its part;
- a kill between the publish and the rearm sends that period's run twice (at-least-once,
  like any item); both sends carry the same task id.

An entry's ``options={"delayq_overlap": "skip"}`` (or ``"buffer_one"``; ``"allow"`` by default)
keeps its runs from overlapping (:mod:`delayq_backends.overlap_policy`): each run carries the
entry's concurrency slot (header ``delayq_slot``, key ``periodic:<name>``, limit 1, held by the
worker while it runs under ``install(app)``), and a period whose previous run still holds it is
skipped and counted (``skipped`` in the entry's state), or under ``buffer_one`` waits as a
slotted task of its own (item id = the run's task id) while no other does.

``sync`` makes the store follow the config: new entries are added, changed ones replaced (a
compare-and-set that waits while a forwarder is firing the entry), entries gone from the config
removed. A registry hash (``<prefix>:{<prefix>}:periodic``, name → item id) lists the entries,
so a sync never scans the store. ``celery -A proj delayq forward`` syncs at start.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from numbers import Real
from typing import Any

from celery import Celery
from kombu.utils.json import dumps as kombu_json_dumps

from ..envelope import Envelope
from ..errors import DelayqError, EnvelopeError, NewerFormatError
from ..keys import normalize_id, periodic_key
from ..models import CancelOutcome, RearmOutcome
from ..overlap_policy import ALLOW, check_policy, overlap_slot
from ..periodic.firing import FiringTarget, Run
from ..periodic.schedules import Misfire, Schedule, Slot, run_task_id
from ..periodic.state import META, LastRun, PeriodicState, state_of, with_state
from ..store import DelayStore
from ..targets import Delivery, Target
from ..timeutil import Clock, from_ms
from .message import KIND as CELERY_KIND
from .message import StoredMessage, TaskView, priority_rank
from .schedules import from_celery
from .settings import store_for
from .slots import SLOT_HEADER
from .template import Capture

__all__ = [
    "ID_PREFIX",
    "KIND",
    "PeriodicEntry",
    "PeriodicError",
    "PeriodicState",
    "PeriodicStatus",
    "PeriodicTarget",
    "SyncReport",
    "entries_of",
    "item_id",
    "remove",
    "statuses",
    "sync",
    "task_view",
]

log = logging.getLogger("delayq.celery.periodic")

#: ``Envelope.target`` of periodic entries: a forwarder without :class:`PeriodicTarget` (an older
#: version) leaves them alone and says so, instead of sending the template as a one-off task.
KIND = "celery-periodic"
ID_PREFIX = "periodic:"
#: ``beat_schedule`` entry keys we read (``relative`` as Celery's ``schedule(relative=True)``)
_ENTRY_KEYS = {"task", "schedule", "args", "kwargs", "options", "relative"}
#: ``apply_async`` options a periodic entry cannot have: each run is sent when due, on its own
#: the entry option naming its overlap policy (:mod:`delayq_backends.overlap_policy`)
OVERLAP_OPTION = "delayq_overlap"
_REFUSED_OPTIONS = {"countdown", "eta", "task_id", "link", "link_error", "chain", "chord", "group_id", "producer"}


class PeriodicError(DelayqError):
    """A ``beat_schedule`` entry, or the store item of one, that cannot be synced."""


def item_id(name: str) -> str:
    """The store item of entry ``name``."""
    return normalize_id(f"{ID_PREFIX}{name}")


def _envelope(message: StoredMessage, state: PeriodicState) -> bytes:
    """The stored entry: the template message's envelope as kind ``celery-periodic``, with ``state``."""
    return with_state(replace(message.to_envelope(), target=KIND), state)


def _message_of(envelope: Envelope) -> StoredMessage:
    """The template message of a periodic envelope; EnvelopeError if it is none."""
    meta = {k: v for k, v in envelope.meta.items() if k != META}
    return StoredMessage.from_envelope(replace(envelope, target=CELERY_KIND, meta=meta))


def _decode(envelope: Envelope) -> tuple[StoredMessage, PeriodicState]:
    """The message and state of a periodic envelope; EnvelopeError if it is none."""
    return _message_of(envelope), state_of(envelope)


class CeleryRuns:
    """The run maker of ``celery-periodic`` entries (:class:`~delayq_backends.periodic.firing.RunMaker`)."""

    kind = KIND
    slot_run = 0  # a worker with install(app) names a run by its task id and retries

    def template(self, envelope: Envelope) -> StoredMessage:
        return _message_of(envelope)

    def run(self, entry: Delivery, template: StoredMessage, state: PeriodicState, run: Run, now_ms: int) -> Delivery:
        """The delivery of one run of entry item ``entry``: id ``<item>#<task id>``; with an
        overlap policy, its message carries the entry's concurrency slot for the worker to hold."""
        task_id = run.task_id(state.name)
        headers = {} if state.overlap == ALLOW else {SLOT_HEADER: {"key": overlap_slot(state.name).key, "limit": 1}}
        message = _run_message(template, task_id, state.expires, now_ms, headers)
        return Delivery(f"{entry.id}#{task_id}", message.to_envelope(), entry.attempts, run.slot.at_ms)


def _run_message(
    message: StoredMessage, task_id: str, expires: float | None, now_ms: int, extra: Mapping[str, Any]
) -> StoredMessage:
    """The message of one run: its own task id (and root id: a run starts its own workflow, as a
    beat send does), ``expires`` counted from this send, and ``extra`` headers."""
    headers = {**message.headers, **extra, "id": task_id, "root_id": task_id}
    if expires is not None:
        headers["expires"] = (from_ms(now_ms) + timedelta(seconds=expires)).isoformat()
    return replace(message, headers=headers, properties={**message.properties, "correlation_id": task_id})


# -- entries of the app --------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicEntry:
    """One ``beat_schedule`` entry, ready to store."""

    name: str
    message: StoredMessage
    schedule: Schedule
    misfire: Misfire
    fingerprint: str
    rank: int
    expires: float | None
    overlap: str = ALLOW

    @property
    def item_id(self) -> str:
        return item_id(self.name)

    def state(self, slot: Slot, last: LastRun | None = None, runs: int = 0, skipped: int = 0) -> PeriodicState:
        return PeriodicState(
            self.name,
            self.schedule,
            self.misfire,
            self.fingerprint,
            slot,
            self.rank,
            self.expires,
            last,
            runs,
            self.overlap,
            skipped,
        )

    def envelope(self, state: PeriodicState) -> bytes:
        return _envelope(self.message, state)


def entries_of(app: Celery) -> tuple[list[PeriodicEntry], dict[str, str]]:
    """The app's ``beat_schedule`` as entries, and the ones that cannot be used (name → why)."""
    schedule = app.conf.beat_schedule or {}
    entries: list[PeriodicEntry] = []
    errors: dict[str, str] = {}
    for name, conf in schedule.items():
        try:
            entries.append(_entry(app, str(name), conf))
        except (DelayqError, ValueError, TypeError) as exc:
            errors[str(name)] = str(exc)
    return entries, errors


def _zone(app: Celery) -> str:
    """The app's time zone, as crontabs read it: ``timezone``, else UTC (``enable_utc``) or local."""
    name = app.conf.timezone
    if name:
        return str(name)
    return "UTC" if app.conf.enable_utc else "local"


def _entry(app: Celery, name: str, conf: Any) -> PeriodicEntry:
    if not isinstance(conf, Mapping) or "task" not in conf or "schedule" not in conf:
        raise PeriodicError(f"entry {name!r}: use a dict with 'task' and 'schedule' (as celery beat reads it)")
    unknown = sorted(set(conf) - _ENTRY_KEYS)
    if unknown:
        raise PeriodicError(f"entry {name!r}: unknown key(s) {unknown}; known are {sorted(_ENTRY_KEYS)}")
    item_id(name)  # a name with control characters cannot make an id
    options = dict(conf.get("options") or {})
    overlap = check_policy(name, options.pop(OVERLAP_OPTION, ALLOW))
    misfire = Misfire.from_options(options)
    for key in Misfire.OPTIONS:
        options.pop(key, None)
    refused = sorted(_REFUSED_OPTIONS & set(options))
    if refused:
        raise PeriodicError(f"entry {name!r}: option(s) {refused} cannot apply to a periodic run; remove them")
    args, kwargs = conf.get("args") or (), conf.get("kwargs") or {}
    if callable(args) or callable(kwargs):
        raise PeriodicError(
            f"entry {name!r}: lazy args/kwargs (BeatLazyFunc) are evaluated per run by beat; delayq stores the "
            "message once: pass plain values, or compute them in the task"
        )
    schedule = from_celery(conf["schedule"], zone=_zone(app), relative=bool(conf.get("relative")))
    message, expires = _message(app, str(conf["task"]), tuple(args), dict(kwargs), options)
    driver = str(app.connection_for_write().transport.driver_type)  # no connection is made
    rank = priority_rank(message.properties.get("priority"), driver)
    fingerprint = _fingerprint(message, schedule, misfire, expires, rank, overlap)
    return PeriodicEntry(name, message, schedule, misfire, fingerprint, rank, expires, overlap)


def _message(
    app: Celery, task: str, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]
) -> tuple[StoredMessage, float | None]:
    """The task message as ``celery beat`` would send it (``app.send_task``, with the task's own
    options when it is registered here), captured from Celery's sender; and a relative
    ``expires`` in seconds, which each run counts from its own send."""
    registered = app.tasks.get(task)
    if registered is not None:
        defaults = {k: v for k, v in registered._get_exec_options().items() if v is not None}
        options = {**defaults, **options}
    expires = options.pop("expires", None)
    relative = float(expires) if isinstance(expires, Real) and not isinstance(expires, bool) else None
    headers = {**(options.pop("headers", None) or {}), "celery_beat_task": True}  # as beat marks its sends
    time_limit, soft_time_limit = options.pop("time_limit", None), options.pop("soft_time_limit", None)
    ignore_result, shadow = options.pop("ignore_result", None), options.pop("shadow", None)
    options = app.amqp.router.route(options, task, args, kwargs, registered)
    options["headers"] = headers
    message = app.amqp.create_task_message(
        str(_PLACEHOLDER_ID), task, args, kwargs,
        expires=expires, time_limit=time_limit, soft_time_limit=soft_time_limit, reply_to=app.thread_oid,
        shadow=shadow, ignore_result=ignore_result, **options,
    )  # fmt: skip
    capture = Capture()
    app.amqp.send_task_message(capture, task, message, **options)
    if capture.body is None:
        raise PeriodicError(f"task {task!r}: Celery's sender published nothing to capture")
    return StoredMessage.capture(capture.body, capture.kwargs), relative


#: the task id of the stored template; each run gets its own (:func:`run_task_id`)
_PLACEHOLDER_ID = "00000000-0000-0000-0000-000000000000"
#: headers and properties that differ between two builds of the same entry (host, process, send time)
_VOLATILE_HEADERS = {"id", "origin", "root_id", "parent_id"}
_VOLATILE_PROPERTIES = {"correlation_id", "reply_to"}


def _fingerprint(
    message: StoredMessage, schedule: Schedule, misfire: Misfire, expires: float | None, rank: int, overlap: str
) -> str:
    """A hash of everything that makes the entry's runs, so a sync can tell "unchanged"."""
    headers = {k: v for k, v in message.headers.items() if k not in _VOLATILE_HEADERS}
    if expires is not None:
        headers.pop("expires", None)
    what = {
        "body": message.body.hex(),
        "ct": message.content_type,
        "ce": message.content_encoding,
        "h": headers,
        "p": {k: v for k, v in message.properties.items() if k not in _VOLATILE_PROPERTIES},
        "x": message.exchange,
        "rk": message.routing_key,
        "q": message.declare,
        "s": schedule.to_json(),
        "m": misfire.to_json(),
        "e": expires,
        "r": rank,
        **({} if overlap == ALLOW else {"o": overlap}),  # an entry stored before overlap policies: unchanged
    }
    return hashlib.sha1(kombu_json_dumps(what, sort_keys=True).encode()).hexdigest()[:16]


# -- sync ------------------------------------------------------------------------------------------


@dataclass
class SyncReport:
    """What a sync did, by entry name."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    #: entries a newer release stored (a newer envelope format): left as they are
    newer: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"{len(getattr(self, k))} {k}" for k in ("added", "changed", "unchanged", "removed")]
        return (
            ", ".join(parts)
            + (f", {len(self.newer)} left to a newer release" if self.newer else "")
            + (f", {len(self.errors)} refused" if self.errors else "")
        )


def sync(app: Celery, store: DelayStore | None = None, *, wait: float | None = None) -> SyncReport:
    """Make the store's periodic entries those of ``app.conf.beat_schedule``.

    Idempotent, by entry name: new entries get their first period after now; a changed entry
    keeps its next period if its schedule is the same (else the new schedule's first after
    now) and its run history; entries gone from the config are removed. An entry that cannot be
    built is reported in ``errors`` and left as it is in the store (never removed for it).

    Args:
        wait: seconds to wait for a forwarder that is firing a changed entry right now
            (default: the store's lease, after which a holder is presumed dead).
    """
    store = store or store_for(app)
    entries, errors = entries_of(app)
    report = SyncReport(errors=dict(errors))
    deadline = time.monotonic() + (store.config.lease_seconds + 1 if wait is None else wait)
    key = periodic_key(store.config.prefix)
    _check_registry(store, key)
    for entry in entries:
        store.client.hset(key, entry.name, entry.item_id)  # first: a stored entry is always listed
        try:
            outcome = _upsert(store, entry, deadline)
        except DelayqError as exc:
            report.errors[entry.name] = str(exc)
            continue
        getattr(report, outcome).append(entry.name)
    keep = {e.name for e in entries} | set(errors)
    registry_now = _registry(store)
    report.errors.update(registry_now.unreadable)
    report.removed = remove(store, [name for name in registry_now.names if name not in keep])
    return report


def _check_registry(store: DelayStore, key: str) -> None:
    """Refuse a registry of another type (a hand write) before changing anything: its entries
    are unknown, so a sync cannot tell which stored entries left the config."""
    kind = store.client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind not in ("hash", "none"):
        raise PeriodicError(
            f"the periodic registry {key} is a {kind}, not a hash (written by another tool): nothing synced; "
            f"move it away (`redis-cli RENAME {key} {key}:bad`) and sync again"
        )


def _upsert(store: DelayStore, entry: PeriodicEntry, deadline: float) -> str:
    """Add or update one entry; returns ``added``, ``changed`` or ``unchanged``."""
    while True:
        now = store.clock()
        item = store.get(entry.item_id)
        if item is None:
            first = entry.schedule.first_after(now)
            env = entry.envelope(entry.state(first))
            if store.schedule(entry.item_id, from_ms(first.at_ms), env, mode="keep", rank=entry.rank) == "added":
                return "added"
            continue  # another sync added it meanwhile: compare with that one
        try:
            _, old = _decode(Envelope.decode(item.envelope))
        except NewerFormatError as exc:
            log.warning(
                "periodic entry %r: its store item %r was written by a newer release (%s); skipped, it keeps "
                "that release's settings: sync from the newer release",
                entry.name, entry.item_id, exc,
            )  # fmt: skip
            return "newer"
        except EnvelopeError as exc:
            raise PeriodicError(
                f"store item {entry.item_id!r} is not a periodic entry ({exc}): it was scheduled by something "
                f"else; `delayq cancel {entry.item_id}` and sync again"
            ) from exc
        if old.fingerprint == entry.fingerprint and old.overlap == entry.overlap:  # an older forwarder's
            return "unchanged"  # rearm keeps the fingerprint but drops the policy: the sync restores it
        slot = old.slot if old.schedule == entry.schedule else entry.schedule.first_after(now)
        env = entry.envelope(entry.state(slot, old.last, old.runs, old.skipped))
        outcome = store.replace_if(
            entry.item_id, item.envelope, from_ms(slot.at_ms), env, rank=entry.rank, now=store.clock()
        )
        if outcome is RearmOutcome.REPLACED:
            return "changed"
        if outcome is RearmOutcome.HELD:  # a forwarder is firing it: its rearm comes first
            if time.monotonic() > deadline:
                raise PeriodicError(
                    f"entry {entry.name!r} stayed leased to a forwarder; it keeps its old settings: sync again"
                )
            time.sleep(0.05)


@dataclass(frozen=True)
class Registry:
    """The registry's fields: entry names, and fields that are not UTF-8, hence no entry's name
    (a hand write or a damaged key). Those are reported with the fix and skipped, so one cannot
    stop the rest from listing or syncing (nor removed entries from being removed)."""

    names: list[str]
    unreadable: dict[str, str]  # the field as redis-cli takes it (hex escapes) -> what is wrong and the fix


def _registry(store: DelayStore) -> Registry:
    """The registry's fields, read names and unreadable ones apart."""
    key = periodic_key(store.config.prefix)
    _check_registry(store, key)
    names, unreadable = [], {}
    for field_name, _ in store.client.hscan_iter(key):
        raw = field_name if isinstance(field_name, bytes) else str(field_name).encode()
        try:
            names.append(raw.decode())
        except UnicodeDecodeError:
            shown = _redis_cli_quoted(raw)
            unreadable[shown] = (
                f"registry field {shown} of {key} is not UTF-8, so no entry's name; skipped: remove it with "
                f"`redis-cli HDEL {key} {shown}`"
            )
    return Registry(sorted(names), unreadable)


def _redis_cli_quoted(raw: bytes) -> str:
    r"""``raw`` as a redis-cli double-quoted argument (non-printable bytes as ``\xHH``)."""
    body = "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in raw)
    return f'"{body}"'


def remove(store: DelayStore, names: Iterable[str]) -> list[str]:
    """Remove entries by name (their store item, then their registry line); returns the names
    that were registered or stored. A forwarder firing one now sends that run and stops."""
    registry = periodic_key(store.config.prefix)
    removed = []
    for name in names:
        cancelled = store.cancel(item_id(name))
        if store.client.hdel(registry, name) or cancelled is not CancelOutcome.NOT_FOUND:
            removed.append(name)
    return removed


# -- listing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicStatus:
    """One entry as the store has it, for ``periodic list`` and the dashboard."""

    name: str
    item_id: str
    state: str  # "scheduled", "firing" (leased to a forwarder), "missing" (not in the store)
    task: str = ""
    schedule: str = ""
    misfire: str = ""
    next_run_ms: int | None = None
    last_run_ms: int | None = None
    last_sent_ms: int | None = None
    last_missed: int = 0
    runs: int = 0
    overlap: str = ALLOW
    skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def statuses(store: DelayStore) -> list[PeriodicStatus]:
    """Every registered entry, with its schedule, last run and next run."""
    registry = _registry(store)
    out = [PeriodicStatus(shown, "", f"unreadable: {fix}") for shown, fix in sorted(registry.unreadable.items())]
    for name in registry.names:
        ident = item_id(name)
        item = store.get(ident)
        if item is None:
            out.append(PeriodicStatus(name, ident, "missing"))
            continue
        try:
            message, state = _decode(Envelope.decode(item.envelope))
        except NewerFormatError as exc:
            out.append(PeriodicStatus(name, ident, f"newer format {exc.version}: upgrade this reader"))
            continue
        except EnvelopeError as exc:
            out.append(PeriodicStatus(name, ident, f"unreadable: {exc}"))
            continue
        last = state.last
        out.append(
            PeriodicStatus(
                name,
                ident,
                "firing" if item.leased_until_ms is not None else "scheduled",
                message.task,
                state.schedule.describe(),
                state.misfire.describe(),
                item.ready_ms,
                None if last is None else last.at_ms,
                None if last is None else last.sent_ms,
                0 if last is None else last.missed,
                state.runs,
                state.overlap,
                state.skipped,
            )
        )
    return out


def task_view(envelope: Envelope) -> TaskView | None:
    """What a waiting Celery item will send, for ``delayq list|get`` and the dashboard's item view:
    a plain task as stored; a periodic entry as its next run (that run's task id, the entry's
    name in ``periodic``); None for items of other kinds.

    Raises:
        EnvelopeError: a Celery or periodic envelope that cannot be read.
    """
    if envelope.target == CELERY_KIND:
        return StoredMessage.from_envelope(envelope).view()
    if envelope.target != KIND:
        return None
    message, state = _decode(envelope)
    return replace(message.view(), id=run_task_id(state.name, state.slot), periodic=state.name)


# -- the forwarder's side ----------------------------------------------------------------------


class PeriodicTarget(FiringTarget):
    """Fires ``celery-periodic`` items (:class:`~delayq_backends.periodic.firing.FiringTarget`
    with :class:`CeleryRuns`): publishes each due period's run through ``inner``, the
    forwarder's Celery target.

    Args:
        inner: the target of kind ``celery`` that publishes the runs.
        clock: "now" in ms for the misfire policy; by default the store's clock (the server's).
        on_skipped: called with (entry name, periods) for periods skipped by an overlap policy.
    """

    kind = KIND

    def __init__(
        self,
        inner: Target,
        *,
        clock: Clock | None = None,
        on_skipped: Callable[[str, int], None] | None = None,
    ) -> None:
        if inner.kind != CELERY_KIND:
            raise ValueError(f"PeriodicTarget publishes through a {CELERY_KIND!r} target, not {inner.kind!r}")
        super().__init__(CeleryRuns(), inner, clock=clock, on_skipped=on_skipped)
