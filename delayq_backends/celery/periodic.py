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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from numbers import Real
from typing import Any

from celery import Celery
from kombu.utils.json import dumps as kombu_json_dumps

from ..envelope import Envelope, with_slot
from ..errors import DelayqError, EnvelopeError, NewerFormatError
from ..keys import MAX_RANK, RANK_SPAN, normalize_id, periodic_key
from ..models import CancelOutcome, DeliveryFailure, RearmOutcome
from ..overlap_policy import ALLOW, POLICIES, Fire, OverlapAsk, check_policy, fire_runs, overlap_slot
from ..periodic.history import RUN_HEADER, RunMark, SentRun, report_published
from ..store import DelayStore, slot_member
from ..store.lease import Lease
from ..targets import Delivery, PublishReport, Target
from ..timeutil import Clock, from_ms
from .message import KIND as CELERY_KIND
from .message import StoredMessage, TaskView, priority_rank
from .schedules import Misfire, Plan, Schedule, Slot, from_celery, run_task_id, schedule_from_json
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
#: the envelope meta key holding the entry's :class:`PeriodicState`
META = "periodic"
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


@dataclass(frozen=True)
class LastRun:
    """The last firing: its latest period, when it was sent, and how many periods it missed."""

    key: str
    at_ms: int
    sent_ms: int
    missed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "at": self.at_ms, "sent": self.sent_ms, "missed": self.missed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> LastRun | None:
        if not data:
            return None
        return cls(str(data["key"]), int(data["at"]), int(data["sent"]), int(data.get("missed", 0)))


@dataclass(frozen=True)
class PeriodicState:
    """What a periodic item's envelope carries besides the message (meta ``periodic``)."""

    name: str
    schedule: Schedule
    misfire: Misfire
    fingerprint: str
    slot: Slot
    rank: int = 0
    expires: float | None = None  # seconds after each send, when the entry's ``expires`` is relative
    last: LastRun | None = None
    runs: int = 0
    overlap: str = ALLOW
    #: periods skipped by the overlap policy, so far
    skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.overlap == ALLOW and not self.skipped else {"overlap": self.overlap, "skipped": self.skipped}
        return {
            **extra,
            "name": self.name,
            "schedule": self.schedule.to_json(),
            "misfire": self.misfire.to_json(),
            "fp": self.fingerprint,
            "slot": self.slot.to_json(),
            "rank": self.rank,
            "expires": self.expires,
            "last": None if self.last is None else self.last.to_json(),
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PeriodicState:
        return cls(
            name=str(data["name"]),
            schedule=schedule_from_json(data["schedule"]),
            misfire=Misfire.from_json(data["misfire"]),
            fingerprint=str(data["fp"]),
            slot=Slot.from_json(data["slot"]),
            rank=int(data.get("rank", 0)),
            expires=None if data.get("expires") is None else float(data["expires"]),
            last=LastRun.from_json(data.get("last")),
            runs=int(data.get("runs", 0)),
            overlap=_policy(data.get("overlap", ALLOW)),
            skipped=_count(data.get("skipped", 0)),
        )

    def fired(self, plan: Plan, now_ms: int, skipped: int = 0) -> PeriodicState:
        """The state after sending ``plan``'s runs (``skipped`` more periods skipped by the
        overlap policy): due at ``plan.next``."""
        last = self.last
        if plan.runs or plan.missed:
            latest = plan.runs[-1] if plan.runs else self.slot
            last = LastRun(latest.key, latest.at_ms, now_ms, plan.missed)
        return replace(self, slot=plan.next, last=last, runs=self.runs + len(plan.runs), skipped=self.skipped + skipped)


def _policy(value: Any) -> str:
    """A stored overlap policy; one no release wrote (a hand write) reads as ``allow``."""
    return str(value) if value in POLICIES else ALLOW


def _count(value: Any) -> int:
    """A stored count; one that is none (a hand write) starts again from 0."""
    return value if type(value) is int and value >= 0 else 0


def _envelope(message: StoredMessage, state: PeriodicState) -> Envelope:
    plain = message.to_envelope()
    return replace(plain, target=KIND, meta={**plain.meta, META: state.to_json()})


def _decode(envelope: Envelope) -> tuple[StoredMessage, PeriodicState]:
    """The message and state of a periodic envelope; EnvelopeError if it is none."""
    meta = dict(envelope.meta)
    try:
        state = PeriodicState.from_json(meta.pop(META))
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvelopeError(f"not a delayq periodic entry: {type(exc).__name__}: {exc}") from exc
    message = StoredMessage.from_envelope(replace(envelope, target=CELERY_KIND, meta=meta))
    return message, state


def _run_delivery(d: Delivery, message: StoredMessage, state: PeriodicState, slot: Slot, now: int) -> Delivery:
    """The delivery of one period's run of entry item ``d``: id ``<item>#<task id>``; its message
    names its entry and period (header ``delayq_periodic``, for the entry's history) and, with an
    overlap policy, the entry's concurrency slot for the worker to hold."""
    task_id = run_task_id(state.name, slot)
    headers: dict[str, Any] = {RUN_HEADER: RunMark(state.name, slot.at_ms).header()}
    if state.overlap != ALLOW:
        headers[SLOT_HEADER] = {"key": overlap_slot(state.name).key, "limit": 1}
    run = _run_message(message, task_id, state.expires, now, headers)
    return Delivery(f"{d.id}#{task_id}", run.to_envelope(), d.attempts, slot.at_ms)


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

    def envelope(self, state: PeriodicState) -> Envelope:
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

#: the shortest lease an entry is fired under: a broker's publish confirm must fit in it
MIN_ENTRY_LEASE_MS = 1000


def entry_lease_ms(state: PeriodicState, lease_ms: int) -> int:
    """How long a forwarder firing ``state``'s entry holds it: half its period (at least
    :data:`MIN_ENTRY_LEASE_MS`), at most the store's lease. A forwarder killed while firing it
    delays the entry by that much: under ``run_once`` a lease longer than the period would
    collapse the periods it covers into one run."""
    period = state.schedule.following(state.slot).at_ms - state.slot.at_ms
    return min(lease_ms, max(MIN_ENTRY_LEASE_MS, period // 2))


@dataclass
class _Firing:
    """One entry being fired: its item, message, state and plan, the run deliveries to publish,
    the periods its overlap policy skipped, and whether it took its slot for them."""

    d: Delivery
    message: StoredMessage
    state: PeriodicState
    plan: Plan
    runs: list[Delivery]
    skipped: int = 0
    taken: bool = False


def _task_id(run: Delivery) -> str:
    """The task id of a run delivery (``<item>#<task id>``)."""
    return run.id.rpartition("#")[2]


def _member(run: Delivery) -> str:
    """A run's member in its entry's slot: as the worker names it (task id, retries 0)."""
    return slot_member(_task_id(run), 0)


def _order(state: PeriodicState, run: Delivery) -> int:
    """A run's order in its slot's line, as the forwarder's slot hook orders slotted items."""
    return (MAX_RANK - state.rank) * RANK_SPAN + run.ready_ms


def _give_back_slot(store: DelayStore | None, f: _Firing) -> None:
    """The slot taken for a run that was not published goes back (else it is held until its
    start hold lapses, and the periods meanwhile are skipped)."""
    if not f.taken or store is None:
        return
    key = overlap_slot(f.state.name).key
    try:
        store.hold_slots({key: [_member(f.runs[0])]}, "end", hold_ms=0)
    except Exception as exc:  # its hold lapses by itself
        log.warning("periodic entry %r: could not give back its slot (%s)", f.state.name, exc)


class PeriodicTarget:
    """Fires ``celery-periodic`` items: publishes each due period's run through ``inner`` (the
    forwarder's Celery target), then acks the item and schedules its next period in one step
    under the claim's lease (:meth:`Lease.rearm`).

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
        self.inner = inner
        self.clock = clock
        #: told (entry name, periods) of the periods an overlap policy skipped: the metrics' counter
        self.on_skipped = on_skipped

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        """Without a lease the next run could not be scheduled safely: nothing is sent."""
        why = "a periodic entry is fired only under a claim's lease (Forwarder calls publish_claimed)"
        return PublishReport(failed=[DeliveryFailure(d.id, why) for d in deliveries])

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        report = PublishReport()
        now = self.clock() if self.clock is not None else lease.now_ms()
        fired: list[_Firing] = []
        shorter: dict[int, list[str]] = {}
        for d in deliveries:
            try:  # one entry that cannot be decoded, planned or encoded fails alone
                message, state = _decode(d.envelope)
                plan = state.misfire.plan(state.schedule, state.slot, now)
                mine = [_run_delivery(d, message, state, slot, now) for slot in plan.runs]
                fit = entry_lease_ms(state, lease.store.config.lease_ms)
            except Exception as exc:
                why = f"cannot fire this periodic entry: {type(exc).__name__}: {exc}"
                report.failed.append(DeliveryFailure(d.id, why, permanent=True))
                continue
            fired.append(_Firing(d, message, state, plan, mine))
            if fit < lease.store.config.lease_ms:
                shorter.setdefault(fit, []).append(d.id)
        for fit, ids in shorter.items():  # before the publish: a kill from here on costs one short lease
            lease.extend(ids, lease_ms=fit)
        store = lease.store if isinstance(lease.store, DelayStore) else None
        fired = self._overlap(fired, store, report)
        runs = [run for f in fired for run in f.runs]
        sent = self.inner.publish_many(runs) if runs else PublishReport()
        report.broker_error = sent.broker_error
        published, unsent = set(sent.published), set(sent.unsent)
        failed = {f.id: f for f in sent.failed}
        for f in fired:
            ids = [run.id for run in f.runs]
            if all(i in published for i in ids):
                self._rearm(lease, f, now)
                report.published.append(f.d.id)
                report.acked.append(f.d.id)
                continue
            _give_back_slot(store, f)
            if any(i in unsent for i in ids):  # given back: its runs go again, all of them
                report.unsent.append(f.d.id)
            else:
                # the broker refused a run: the entry waits (no attempt counted), never a dead letter
                errors = [failed[i] for i in ids if i in failed] or [DeliveryFailure(f.d.id, "not published")]
                error, permanent = "; ".join(e.error for e in errors), all(e.permanent for e in errors)
                report.failed.append(DeliveryFailure(f.d.id, error, permanent=permanent, waits=not permanent))
        return report

    def _overlap(self, fired: list[_Firing], store: DelayStore | None, report: PublishReport) -> list[_Firing]:
        """Apply the overlap policies: an entry with one fires only its latest due period (the
        earlier ones would overlap it: skipped), which runs if its slot is free, waits in the
        slot's line (buffer_one: scheduled as a slotted task, due now) or is skipped. An entry
        whose slot cannot be asked waits, as when its broker refuses (the limit is what the
        policy protects)."""
        asks: dict[str, OverlapAsk] = {}
        for f in fired:
            if f.state.overlap != ALLOW and f.runs:
                f.skipped, f.runs = len(f.runs) - 1, f.runs[-1:]
                f.plan = replace(f.plan, runs=f.plan.runs[-1:])
                asks[f.state.name] = OverlapAsk(f.state.overlap, _member(f.runs[0]), _order(f.state, f.runs[0]))
        if not asks:
            return fired
        if store is None:  # a forwarder role's store alone (no slots): the limit is what counts
            outcomes: Mapping[str, Fire | Exception] = {n: DelayqError("no slot role on this store") for n in asks}
        else:
            outcomes = fire_runs(store, asks)
        kept: list[_Firing] = []
        for f in fired:
            outcome = outcomes.get(f.state.name, Fire.RUN)
            try:
                if isinstance(outcome, Exception):
                    raise outcome
                if outcome is Fire.WAIT and store is not None:  # its own item from now on: in the line
                    run = f.runs[0]
                    envelope = with_slot(run.envelope, overlap_slot(f.state.name), f.state.rank)
                    store.schedule(_task_id(run), from_ms(run.ready_ms), envelope, mode="keep", rank=f.state.rank)
                    f.runs = []
                elif outcome is Fire.SKIP:
                    f.skipped += 1
                    f.runs, f.plan = [], replace(f.plan, runs=[])
            except Exception as exc:
                why = f"its overlap policy could not be applied ({type(exc).__name__}: {exc})"
                report.failed.append(DeliveryFailure(f.d.id, why, waits=True))
                continue
            f.taken = outcome is Fire.RUN and f.state.name in asks
            kept.append(f)
        return kept

    def _rearm(self, lease: Lease, f: _Firing, now: int) -> None:
        state, plan = f.state, f.plan
        following = state.fired(plan, now, f.skipped)
        try:
            outcome = lease.rearm(f.d.id, from_ms(plan.next.at_ms), _envelope(f.message, following), rank=state.rank)
        except Exception as exc:  # the run went out; the item stays leased and fires again later
            log.error(
                "periodic entry %r: sent, but its next run could not be scheduled (%s: %s); it is fired again "
                "when its lease runs out",
                state.name,
                type(exc).__name__,
                exc,
            )
            return
        if outcome is RearmOutcome.HELD:
            log.warning("periodic entry %r: our lease ran out while firing it; another forwarder has it", state.name)
        elif outcome is RearmOutcome.NOT_FOUND:
            log.info("periodic entry %r was removed while being fired", state.name)
        else:
            sent = [SentRun(RunMark(state.name, run.ready_ms), _task_id(run)) for run in f.runs]
            report_published(lease.store, state.name, sent, missed=plan.missed)
            if f.skipped:
                log.info("periodic entry %r: %d period(s) skipped, its last run still running (overlap %s)",
                         state.name, f.skipped, state.overlap)  # fmt: skip
                if self.on_skipped is not None:
                    self.on_skipped(state.name, f.skipped)
            if plan.missed:
                log.warning(
                    "periodic entry %r: %d period(s) missed (%s), %d run(s) sent; next %s",
                    state.name,
                    plan.missed,
                    state.misfire.policy,
                    len(plan.runs),
                    datetime.fromtimestamp(plan.next.at_ms / 1000, tz=timezone.utc).isoformat(),
                )

    def queue_depth(self, queue: str) -> int:
        """The inner target's depth probe (flow control), when it has one."""
        probe = getattr(self.inner, "queue_depth", None)
        if probe is None:
            raise NotImplementedError("the inner target has no queue depth probe")
        return int(probe(queue))

    def close(self) -> None:
        """The inner target is the forwarder's too; it closes it."""
