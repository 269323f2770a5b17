"""Periodic entries as data: add, update, pause, resume, run now, backfill, remove, list, sync.

Each action is one compare-and-set of the entry's store item (:meth:`DelayStore.replace_if`):
read it, compute its new state, write it if nobody changed it meanwhile (else read again) and no
forwarder is firing it (else wait, at most a lease). A change that moves the item's ready time
wakes the forwarders when it becomes its shard's head, so it takes effect at every forwarder at
once, with no restart. Pending actions (run now, backfill) are fields of the state that the next
firing applies and clears under its lease, so each runs exactly once (:mod:`.firing`).

What to run is the kind's business: an :class:`EntrySpec` carries the run template its kind
built (``delayq_backends.celery.periodic.entry_spec`` for Celery, the RQ adapter for RQ); this
module stores and changes it without knowing Celery or RQ.

Sync from code (:func:`sync_code`) touches only entries of its source (``code``) and kind: a
runtime entry of the same name wins (``shadowed``), an empty code set removes nothing, and a
versioned code set older than the one synced last changes nothing (:mod:`.registry`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..envelope import Envelope
from ..errors import EnvelopeError, InvalidIdError, NewerFormatError
from ..keys import normalize_id, periodic_code_key, periodic_key
from ..kinds import kind_of
from ..models import CancelOutcome, RearmOutcome, ScheduledItem
from ..overlap_policy import ALLOW, POLICIES
from ..store import DelayStore
from ..timeutil import MAX_MS, from_ms
from .options import RunOptions
from .registry import (
    PAGE,
    VERSION_SETTING,
    PeriodicError,
    Registry,
    check_registry,
    check_version,
    code_fingerprint,
    read_registry,
    record_code_sync,
    record_missing,
    registry_page,
)
from .schedules import END, MAX_BACKFILL, Cron, Every, Misfire, Once, Schedule, Slot
from .state import CODE, RUNTIME, SOURCES, LastRun, PeriodicState, first_slot, state_of, with_state
from .trust import UntrustedError, forget, record

__all__ = [
    "DUE_WAIT_MS",
    "ID_PREFIX",
    "START_SWEEP_SECONDS",
    "Carried",
    "CodeEntryError",
    "EntryNotFound",
    "EntrySpec",
    "EntryStatus",
    "RunTemplate",
    "Sweep",
    "SyncReport",
    "backfill",
    "get",
    "item_id",
    "keep_alignment",
    "pause",
    "preview",
    "remove",
    "resume",
    "run_now",
    "status_page",
    "statuses",
    "sync_code",
    "trust_stored",
    "upsert",
]

log = logging.getLogger("delayq.periodic")

ID_PREFIX = "periodic:"
#: how long after a period came due (or a killed holder's lease ran out) a change of its entry's
#: schedule waits for a forwarder to fire it: twice the forwarders' default poll (a due item is
#: claimed within a poll even with no wake-up, as after a lease runs out)
DUE_WAIT_MS = 2000
#: how long a forwarder's sync at start sweeps the registry (:class:`Sweep`) before it forwards:
#: the rest of the sweep runs in the background, however much junk the registry holds
START_SWEEP_SECONDS = 1.0


def item_id(name: str) -> str:
    """The store item of entry ``name``."""
    return normalize_id(f"{ID_PREFIX}{name}")


class EntryNotFound(PeriodicError):
    """No periodic entry of that name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no periodic entry {name!r}: see `delayq periodic list` for the names")
        self.name = name


class CodeEntryError(PeriodicError):
    """A change a code entry cannot take at runtime (a sync would undo it)."""


# -- definitions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTemplate:
    """What a kind stores to make each run: the template's envelope (target = the entry kind's,
    no ``periodic`` meta), a fingerprint of everything that makes its runs, its rank and a
    relative ``expires`` (seconds after each send). ``trust``: for a template that carries code
    to run (an RQ job's ``data``), its digest, recorded as an operator's definition when the
    entry is stored (:mod:`.trust`); None for a kind whose runs a producer could send anyway."""

    envelope: Envelope
    fingerprint: str
    rank: int = 0
    expires: float | None = None
    trust: str | None = None


@dataclass(frozen=True)
class Carried:
    """The run history an entry moved in from another scheduler brings (``delayq periodic
    import``): when it last ran (UTC ms, None: never) and how many times. A new entry starts from
    it: its first period is the schedule's first after that last run (so a period the old
    scheduler ran is not run again, and one it missed since is due at once, under the misfire
    policy), and its run count goes on from there. An entry already stored keeps its own."""

    last_ms: int | None = None
    runs: int = 0

    def first_slot(self, schedule: Schedule, now_ms: int, start_ms: int | None) -> Slot:
        """The first period of a new entry with this history (a one-off that ran is finished). A
        crontab whose periods since the last run are due already starts from the latest of them,
        due now (one catch-up run, as beat's): its firing then steps through one period, not
        through every one since (a minutely crontab last run a year ago)."""
        if self.last_ms is None:
            return first_slot(schedule, now_ms, start_ms)
        if isinstance(schedule, Once):
            return END if self.runs or self.last_ms >= schedule.at_ms else first_slot(schedule, now_ms, start_ms)
        slot = first_slot(schedule, self.last_ms, start_ms)
        if isinstance(schedule, Cron) and slot.at_ms <= now_ms:
            return max(slot, schedule.latest(now_ms), key=lambda s: s.at_ms)
        return slot

    def last(self) -> LastRun | None:
        return None if self.last_ms is None else LastRun(f"imported:{self.last_ms}", self.last_ms, self.last_ms)


@dataclass(frozen=True)
class EntrySpec:
    """One entry's definition, whatever its kind.

    ``enabled`` None keeps a stored entry's flag (a new one starts enabled); ``source`` is
    ``runtime`` for entries added by hand, ``code`` for those a sync from code writes;
    ``carried``: the history of an entry moved in from another scheduler (:class:`Carried`),
    used only when it is added. It is no part of the definition: importing it again with a
    longer history changes nothing.
    """

    name: str
    template: RunTemplate
    schedule: Schedule
    misfire: Misfire = field(default_factory=Misfire)
    overlap: str = ALLOW
    source: str = RUNTIME
    enabled: bool | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_runs: int | None = None
    jitter_ms: int = 0
    #: the run options as given (the template applies them; the state keeps them to read back)
    options: RunOptions = field(default_factory=RunOptions)
    carried: Carried | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        item_id(self.name)  # a name with control characters cannot make an id
        if self.source not in SOURCES:
            raise PeriodicError(f"entry {self.name!r}: source {self.source!r}: use one of {list(SOURCES)}")
        if self.overlap not in POLICIES:
            raise PeriodicError(f"entry {self.name!r}: overlap {self.overlap!r}: use one of {list(POLICIES)}")
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise PeriodicError(f"entry {self.name!r}: its end is before its start: swap them")
        if self.max_runs is not None and self.max_runs < 1:
            raise PeriodicError(f"entry {self.name!r}: max_runs={self.max_runs}: use at least 1 (or none)")
        if not 0 <= self.jitter_ms <= 86_400_000:
            raise PeriodicError(f"entry {self.name!r}: jitter {self.jitter_ms} ms: use 0 ms to 1 day")
        if isinstance(self.schedule, Once) and self.max_runs is not None:
            raise PeriodicError(f"entry {self.name!r}: a one-off runs once: drop max_runs")

    @property
    def fingerprint(self) -> str:
        """The template's fingerprint, plus the entry's own fields when it uses any (so an entry
        stored before they existed reads as unchanged)."""
        own = {
            k: v
            for k, v in (
                ("start", self.start_ms), ("end", self.end_ms), ("max", self.max_runs), ("j", self.jitter_ms),
                ("opt", self.options.to_json()),
            )
            if v
        }  # fmt: skip
        if not own:
            return self.template.fingerprint
        text = json.dumps([self.template.fingerprint, own], sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def state(self, old: PeriodicState | None, now_ms: int) -> PeriodicState:
        """The entry's state: a new one's, or ``old`` (its run history, pause and pending actions
        kept) with this definition; its next period kept while the schedule is the same."""
        same = old is not None and old.schedule == self.schedule and not old.finished and old.start_ms == self.start_ms
        carried = self.carried if old is None and self.carried is not None else Carried()
        slot = old.slot if same and old is not None else carried.first_slot(self.schedule, now_ms, self.start_ms)
        base = old or PeriodicState(
            self.name, self.schedule, self.misfire, "", slot, last=carried.last(), runs=carried.runs
        )
        if self.enabled is not None:  # paused or resumed as pause() and resume() do
            base = base.resumed(now_ms) if self.enabled else base.paused(now_ms)
        return replace(
            base,
            schedule=self.schedule,
            misfire=self.misfire,
            fingerprint=self.fingerprint,
            slot=slot,
            rank=self.template.rank,
            expires=self.template.expires,
            overlap=self.overlap,
            source=self.source,
            start_ms=self.start_ms,
            end_ms=self.end_ms,
            max_runs=self.max_runs,
            jitter_ms=self.jitter_ms,
            options=self.options,
        )


def keep_alignment(store: DelayStore, name: str, schedule: Schedule, aligned: bool | None) -> Schedule:
    """``schedule`` with its alignment on multiples of the period (Celery's ``relative=True``)
    as ``aligned`` says, or when it says nothing as entry ``name``'s stored interval has it: an
    edit that does not mention alignment keeps it (a form or a command that has no say in it
    would otherwise drop it); a new entry is not aligned. Only an interval has an alignment.
    """
    if not isinstance(schedule, Every):
        return schedule
    if aligned is None:
        try:
            stored = _read(store, name)
        except PeriodicError:  # unreadable or newer: the upsert that follows says so
            stored = None
        old = stored.state.schedule if stored is not None else None
        aligned = isinstance(old, Every) and old.aligned
    return replace(schedule, aligned=aligned)


# -- the compare-and-set loop ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Stored:
    """An entry's item as read: its bytes (the compare-and-set's expected value), envelope, state,
    and its lease's deadline (None unless a forwarder claimed it; kept past the deadline until
    another claims it or the holder's rearm)."""

    raw: bytes
    envelope: Envelope
    state: PeriodicState
    leased_until_ms: int | None
    ready_ms: int


def _read(store: DelayStore, name: str) -> _Stored | None:
    item = store.get(item_id(name))
    if item is None:
        return None
    try:
        envelope = Envelope.decode(item.envelope)
        state = state_of(envelope)
    except NewerFormatError as exc:
        raise PeriodicError(
            f"entry {name!r} was written by a newer release of delayq_backends (format {exc.version}): change it "
            "with that one"
        ) from exc
    except EnvelopeError as exc:
        raise PeriodicError(
            f"store item {item_id(name)!r} is not a periodic entry ({exc}): `delayq cancel {item_id(name)}` "
            "and add the entry again"
        ) from exc
    return _Stored(item.envelope, envelope, state, item.leased_until_ms, item.ready_ms)


def _ready(state: PeriodicState, now_ms: int) -> datetime:
    """When an entry's item is due: now with a pending action, else as its state says."""
    return from_ms(now_ms if state.pending else state.ready_ms())


def _deadline(store: DelayStore, wait: float | None) -> float:
    return time.monotonic() + (store.config.lease_seconds + 1 if wait is None else wait)


def _firing_due(stored: _Stored, new: PeriodicState, now_ms: int) -> bool:
    """A new schedule would replace a period of the old one that is due and that a running
    forwarder fires (or re-fires, once a killed holder's lease ran out) within :data:`DUE_WAIT_MS`:
    the change waits for that firing, so the period runs as its misfire policy says instead of
    vanishing unseen. A period due for longer (no forwarder runs) is replaced at once."""
    old = stored.state
    if new.slot == old.slot or not old.enabled or old.finished or old.slot.at_ms > now_ms:
        return False
    return now_ms < max(old.slot.at_ms, stored.leased_until_ms or 0) + DUE_WAIT_MS


def _held(name: str, deadline: float) -> None:
    """A forwarder is firing the entry: its rearm comes first; wait for it, or give up."""
    if time.monotonic() > deadline:
        raise PeriodicError(f"entry {name!r} stayed leased to a forwarder (firing it); nothing changed: try again")
    time.sleep(0.05)


def _change(
    store: DelayStore,
    name: str,
    change: Callable[[PeriodicState, int], PeriodicState],
    *,
    wait: float | None = None,
) -> PeriodicState:
    """Apply ``change`` (state, now ms -> new state) to entry ``name`` as one compare-and-set."""
    deadline = _deadline(store, wait)
    while True:
        stored = _read(store, name)
        if stored is None:
            raise EntryNotFound(name)
        now = store.clock()
        new = change(stored.state, now)
        if new == stored.state:
            return new
        payload = with_state(stored.envelope, new)
        outcome = store.replace_if(item_id(name), stored.raw, _ready(new, now), payload, rank=new.rank, now=now)
        if outcome is RearmOutcome.REPLACED:
            return new
        if outcome is RearmOutcome.NOT_FOUND:
            raise EntryNotFound(name)
        if outcome is RearmOutcome.HELD:
            _held(name, deadline)


# -- runtime actions --------------------------------------------------------------------------------


def upsert(store: DelayStore, spec: EntrySpec, *, detach: bool = False, wait: float | None = None) -> str:
    """Add or update entry ``spec.name``; returns ``added``, ``changed`` or ``unchanged``.

    Raises:
        CodeEntryError: a runtime change of an entry from code, without ``detach`` (which makes
            it a runtime entry the sync no longer manages).
    """
    if spec.source == CODE:
        raise CodeEntryError(f"entry {spec.name!r}: code entries are written by a sync from code (sync_code)")
    return _upsert(store, spec, _deadline(store, wait), detach=detach)


def _upsert(store: DelayStore, spec: EntrySpec, deadline: float, *, detach: bool = False) -> str:
    """Add or update one entry: ``added``, ``changed``, ``unchanged``, ``shadowed`` (a code spec
    meeting a runtime entry) or ``newer`` (an entry a newer release wrote: left alone)."""
    ident = item_id(spec.name)
    registry = check_registry(store)
    store.write_acknowledged(registry, ("HSET", registry, spec.name, ident))  # first: always listed
    while True:
        now = store.clock()
        try:
            stored = _read(store, spec.name)
        except PeriodicError as exc:
            if isinstance(exc.__cause__, NewerFormatError):
                log.warning("periodic entry %r: %s; left as it is", spec.name, exc)
                return "newer"
            raise
        if stored is None:
            _trust(store, spec)
            state = spec.state(None, now)
            payload = with_state(spec.template.envelope, state)
            if store.schedule(ident, _ready(state, now), payload, mode="keep", rank=state.rank) == "added":
                return "added"
            continue  # added meanwhile: compare with that one
        old = stored.state
        if _shadowed(spec, old, detach):
            return "shadowed"
        new = spec.state(old, now)
        _trust(store, spec)  # unchanged too: an entry stored before the definitions were kept gets one
        if _firing_due(stored, new, now) and time.monotonic() < deadline:
            time.sleep(0.05)  # the due period's firing (and rearm) comes first, as when HELD
            continue
        if _same(old, new):
            return "unchanged"
        payload = with_state(spec.template.envelope, new)
        outcome = store.replace_if(ident, stored.raw, _ready(new, now), payload, rank=new.rank, now=now)
        if outcome is RearmOutcome.REPLACED:
            return "changed"
        if outcome is RearmOutcome.HELD:  # a forwarder is firing it: its rearm comes first
            _held(spec.name, deadline)


def _shadowed(spec: EntrySpec, old: PeriodicState, detach: bool) -> bool:
    """A code ``spec`` meets a stored runtime entry (which wins: True).

    Raises:
        CodeEntryError: a runtime ``spec`` meets an entry from code, without ``detach``.
    """
    if spec.source == RUNTIME and old.source == CODE and not detach:
        raise CodeEntryError(
            f"entry {spec.name!r} comes from code (beat_schedule / RQ cron config): change it there and deploy, "
            "or detach it (detach=True, --detach) to make it a runtime entry the sync no longer manages"
        )
    return spec.source == CODE and old.source == RUNTIME


def _same(old: PeriodicState, new: PeriodicState) -> bool:
    """Writing ``new`` over ``old`` would change nothing of the entry's definition."""
    return (
        old.fingerprint == new.fingerprint
        and old.overlap == new.overlap
        and old.source == new.source
        and old.enabled == new.enabled
        and old.newer_format == new.newer_format
    )


def preview(store: DelayStore, spec: EntrySpec, *, detach: bool = False) -> str:
    """What :func:`upsert` (or a sync, for a code ``spec``) would do with ``spec`` now, writing
    nothing: ``added``, ``changed``, ``unchanged``, ``shadowed`` or ``newer`` (a dry run's diff).

    Raises:
        CodeEntryError: as :func:`upsert` would.
        PeriodicError: the stored item cannot be read (naming the fix).
    """
    try:
        stored = _read(store, spec.name)
    except PeriodicError as exc:
        if isinstance(exc.__cause__, NewerFormatError):
            return "newer"
        raise
    if stored is None:
        return "added"
    if _shadowed(spec, stored.state, detach):
        return "shadowed"
    return "unchanged" if _same(stored.state, spec.state(stored.state, store.clock())) else "changed"


def _trust(store: DelayStore, spec: EntrySpec) -> None:
    """Record ``spec``'s template as its operator's definition before its item is stored (a
    forwarder compares the item with it): this process built the template itself."""
    if spec.template.trust is not None:
        record(store, spec.name, spec.template.trust)


def trust_stored(store: DelayStore, names: Iterable[str] | None = None) -> dict[str, str]:
    """Record the stored templates of entries ``names`` (None: every registered one whose kind
    carries code) as an operator's definitions (:mod:`.trust`), live or dead-lettered; by name,
    ``trusted: runs <task>`` or why not. ``delayq periodic trust``: the operator vouches for
    templates stored before the definitions were kept, or a dead letter they recognise."""
    out = {}
    for name in read_registry(store).names if names is None else names:
        try:
            envelope = _stored_envelope(store, name)
            kind = kind_of(envelope.target) if envelope is not None else None
            digest_of = kind[0].trust.load() if kind is not None and kind[0].trust else None
            if envelope is None or kind is None or digest_of is None:
                if names is not None:
                    out[name] = "not found" if envelope is None else "left as it is: its runs carry no code"
                continue
            record(store, name, digest_of(envelope))
            out[name] = f"trusted: runs {kind[1](envelope)}"
        except (EnvelopeError, UntrustedError) as exc:
            out[name] = f"not trusted: {exc}"
    return out


def _stored_envelope(store: DelayStore, name: str) -> Envelope | None:
    """Entry ``name``'s envelope, in the schedule or among the dead letters (None: neither)."""
    ident = item_id(name)
    item = store.get(ident)
    if item is not None:
        return Envelope.decode(item.envelope)
    raw = store.client.hget(store.keys(store.shard_of(ident)).dead_items, ident)
    return Envelope.decode(raw) if isinstance(raw, bytes) else None


def pause(store: DelayStore, name: str) -> EntryStatus:
    """Stop entry ``name`` from firing (its item is never due) until :func:`resume`. A forwarder
    that claimed it in a race rearms it without sending a run."""
    _change(store, name, lambda s, now: s.paused(now))
    return _status_of(store, name)


def resume(store: DelayStore, name: str) -> EntryStatus:
    """Let entry ``name`` fire again: due at its next period, or now if that has passed (then its
    misfire policy decides what the periods that came due while paused send). Those periods are
    not missed, and a run of one is late only from now: a planned pause sets off no alert."""
    _change(store, name, lambda s, now: s.resumed(now))
    return _status_of(store, name)


def run_now(store: DelayStore, name: str) -> EntryStatus:
    """One extra run of entry ``name``, sent by the next firing (due now), paused or not; its
    schedule is untouched. Task id ``uuid5(name, "manual:<request ms>")``."""
    _change(store, name, lambda s, now: replace(s, run_now=(*s.run_now, now)))
    return _status_of(store, name)


def backfill(store: DelayStore, name: str, start_ms: int, end_ms: int) -> EntryStatus:
    """Run every period of entry ``name``'s schedule in ``[start_ms, end_ms]`` (at most
    :data:`~.schedules.MAX_BACKFILL`), sent by the next firing (due now); task ids
    ``uuid5(name, "backfill:<period key>")``.

    Raises:
        PeriodicError: an empty, reversed or too long range.
    """
    if end_ms < start_ms:
        raise PeriodicError(f"backfill of {name!r}: the range ends before it starts: swap the times")

    def add(state: PeriodicState, now: int) -> PeriodicState:
        count = len(state.schedule.between(state.slot, start_ms, end_ms, MAX_BACKFILL + 1))
        if count == 0:
            raise PeriodicError(f"backfill of {name!r}: no period of {state.schedule.describe()} in that range")
        if count > MAX_BACKFILL:
            raise PeriodicError(
                f"backfill of {name!r}: more than {MAX_BACKFILL} periods in that range: split it into shorter ranges"
            )
        return replace(state, backfill=(*state.backfill, (start_ms, end_ms)))

    _change(store, name, add)
    return _status_of(store, name)


def remove(store: DelayStore, names: Iterable[str], *, force: bool = False) -> list[str]:
    """Remove entries by name (their store item, then their registry line); returns the names
    that were registered or stored. A forwarder firing one now sends that run and stops.

    Raises:
        CodeEntryError: an entry from code, without ``force`` (the next sync would add it back).
    """
    names = list(names)
    if not force:
        for name in names:
            try:
                stored = _read(store, name)
            except PeriodicError:  # unreadable: removing it is the fix
                continue
            if stored is not None and stored.state.source == CODE:
                raise CodeEntryError(
                    f"entry {name!r} comes from code: the next sync adds it back. Remove it from the code (and "
                    "deploy), or pause it; force=True (--force) removes it until then"
                )
    return _remove(store, names)


def _remove(store: DelayStore, names: Iterable[str], *, bare: Sequence[str] = ()) -> list[str]:
    """Remove entries ``names`` (item, then registry line) and ``bare``, names known to have no
    item, whose registry lines go in one pipelined round; returns those that were there."""
    registry = check_registry(store)
    removed = []
    for name in names:
        cancelled = store.cancel(item_id(name))
        (unlisted,) = store.write_acknowledged(registry, ("HDEL", registry, name))
        if unlisted or cancelled is not CancelOutcome.NOT_FOUND:
            removed.append(name)
    if bare:
        gone = store.write_acknowledged(registry, *(("HDEL", registry, name) for name in bare))
        removed += [name for name, there in zip(bare, gone) if there]
    forget(store, removed)
    return removed


# -- listing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryStatus:
    """One entry as the store has it, for ``periodic list|show``, the HTTP API and the dashboard.

    ``state``: ``scheduled``, ``firing`` (leased to a forwarder), ``paused``, ``finished``,
    ``missing`` (registered, not in the store), or why it cannot be read. ``next_run_ms`` is
    None while paused or finished; ``run_now`` counts pending manual runs, ``backfill`` lists
    pending ranges.
    """

    name: str
    item_id: str
    state: str
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
    source: str = CODE
    enabled: bool = True
    kind: str = ""
    finished: bool = False
    tz: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_runs: int | None = None
    jitter_ms: int = 0
    paused_ms: int | None = None
    run_now: int = 0
    backfill: list[list[int]] = field(default_factory=list)
    #: the run options set (:mod:`.options`), as JSON values
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _status(name: str, item: Any) -> EntryStatus:
    ident = item_id(name)
    if item is None:
        return EntryStatus(name, ident, "missing")
    try:
        envelope = Envelope.decode(item.envelope)
        state = state_of(envelope)
        found = kind_of(envelope.target)
        kind, task = (found[0].name, found[1](envelope)) if found else (envelope.target, "")
    except NewerFormatError as exc:
        return EntryStatus(name, ident, f"newer format {exc.version}: upgrade this reader")
    except (EnvelopeError, KeyError, TypeError, ValueError) as exc:
        return EntryStatus(name, ident, f"unreadable: {exc}")
    last = state.last
    if item.leased_until_ms is not None:
        shown = "firing"
    elif state.finished:
        shown = "finished"
    elif not state.enabled:
        shown = "paused"
    else:
        shown = "scheduled"
    return EntryStatus(
        name,
        ident,
        shown,
        task,
        state.schedule.describe(),
        state.misfire.describe(),
        None if item.ready_ms >= MAX_MS else item.ready_ms,
        None if last is None else last.at_ms,
        None if last is None else last.sent_ms,
        0 if last is None else last.missed,
        state.runs,
        state.overlap,
        state.skipped,
        state.source,
        state.enabled,
        kind,
        state.finished,
        getattr(state.schedule, "zone", None),
        state.start_ms,
        state.end_ms,
        state.max_runs,
        state.jitter_ms,
        None if state.enabled else state.paused_ms,
        len(state.run_now),
        [list(r) for r in state.backfill],
        state.options.to_json(),
    )


def get(store: DelayStore, name: str) -> EntryStatus | None:
    """Entry ``name`` (None if it is neither registered nor stored)."""
    item = store.get(item_id(name))
    if item is None and not store.client.hexists(check_registry(store), name):
        return None
    return _status(name, item)


def _status_of(store: DelayStore, name: str) -> EntryStatus:
    found = get(store, name)
    if found is None:
        raise EntryNotFound(name)
    return found


def statuses(store: DelayStore) -> list[EntryStatus]:
    """Every registered entry, with its schedule, last run and next run."""
    return _listed(store, read_registry(store))


def status_page(store: DelayStore, cursor: int = 0, count: int = PAGE) -> tuple[int, list[EntryStatus]]:
    """One page of the entries (:func:`~.registry.registry_page`: about ``count`` of them, by
    name) and the next page's cursor (0: this was the last): what one request reads is bounded
    whatever the registry holds, and every entry is on some page."""
    cursor, registry = registry_page(store, cursor, count)
    return cursor, _listed(store, registry)


def _listed(store: DelayStore, registry: Registry) -> list[EntryStatus]:
    out = [EntryStatus(shown, "", f"unreadable: {fix}") for shown, fix in sorted(registry.unreadable.items())]
    for name in registry.names:
        try:
            ident = item_id(name)
        except InvalidIdError as exc:  # a hand write: named with the fix, the others listed
            key = periodic_key(store.config.prefix)
            out.append(EntryStatus(name, "", f"unreadable: {exc}; remove its field of {key} (redis-cli HDEL)"))
            continue
        out.append(_status(name, store.get(ident)))
    return out


# -- sync from code --------------------------------------------------------------------------------


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
    #: code entries whose name a runtime entry has: the runtime one wins, left as it is
    shadowed: list[str] = field(default_factory=list)
    #: why nothing was synced (an older or conflicting version, an empty code set's kept entries)
    refused: str = ""
    #: code entries kept although the code set is empty
    kept: int = 0
    #: the registry sweep, when it did not finish in the sync's time: finish it
    #: (:meth:`Sweep.finish_in_background`); ``removed``, ``kept`` and ``errors`` grow meanwhile
    sweep: Sweep | None = None

    def describe(self) -> str:
        if self.refused:
            return f"nothing synced: {self.refused}"
        parts = [f"{len(getattr(self, k))} {k}" for k in ("added", "changed", "unchanged", "removed")]
        return (
            ", ".join(parts)
            + (f", {len(self.shadowed)} shadowed by runtime entries" if self.shadowed else "")
            + (f", {len(self.newer)} left to a newer release" if self.newer else "")
            + (f", {len(self.errors)} refused" if self.errors else "")
            + (f"; {self.kept} code entries not in this sync kept" if self.kept else "")
            + (f"; {self.sweep.progress()} so far, the rest in the background" if self.sweep else "")
        )


def sync_code(
    store: DelayStore,
    specs: Sequence[EntrySpec],
    *,
    kind: str,
    errors: Mapping[str, str] | None = None,
    version: Any = None,
    wait: float | None = None,
    sweep_seconds: float | None = None,
    version_setting: str = VERSION_SETTING,
) -> SyncReport:
    """Make the store's code entries of envelope target ``kind`` those of ``specs`` (all of
    source ``code``), by name: new ones added (first period after now), changed ones replaced
    (their run history, pause and pending actions kept), those gone from the code removed.

    Rules: runtime entries are never touched (one with a code entry's name is ``shadowed``);
    names in ``errors`` (entries that could not be built) are kept as stored; an empty code set
    removes nothing; with ``version`` (an int growing per deploy), a version lower than the one
    synced last, or equal with another set, changes nothing (``refused``), and an unversioned
    sync is refused once a versioned one ran (:func:`~.registry.record_code_sync`).

    Args:
        sweep_seconds: how long the sweep of the registry for entries gone from the code may
            take (None: to its end); one unfinished is the report's ``sweep``, to finish later.
        version_setting: where the kind's users set ``version`` (named when a sync lacks one).

    Raises:
        PeriodicError: the registry or the version record is damaged (naming the fix).
    """
    version = check_version(version)
    errors = dict(errors or {})
    report = SyncReport(errors=dict(errors))
    for spec in specs:
        if spec.source != CODE or spec.template.envelope.target != kind:
            raise ValueError(f"sync_code: entry {spec.name!r} is not a code entry of kind {kind!r}")
    check_registry(store)
    fingerprint = code_fingerprint([(s.name, s.fingerprint) for s in specs] + [(n, "!") for n in errors])
    unrecorded = record_missing(store, kind)
    if unrecorded:
        report.refused = _unrecorded(store, specs, kind)
        if report.refused:
            return report
    try:
        record_code_sync(store, version, fingerprint, kind=kind, version_setting=version_setting)
    except PeriodicError as exc:
        if type(exc) is PeriodicError:  # a damaged record: the caller says so, nothing synced
            raise
        report.refused = str(exc)
        return report
    deadline = _deadline(store, wait)
    for spec in specs:
        try:
            outcome = _upsert(store, spec, deadline)
        except PeriodicError as exc:
            report.errors[spec.name] = str(exc)
            continue
        getattr(report, outcome).append(spec.name)
    # an empty code set removes nothing; nor does a sync that met no record (a deleted one: an
    # older deploy lacking a newer entry must not remove it), which records itself for the next
    keep = unrecorded or (not specs and not errors)
    sweep = Sweep(store, kind, frozenset(s.name for s in specs) | set(errors), report, keep=keep)
    if not sweep.run(sweep_seconds):
        report.sweep = sweep
    return report


def _unrecorded(store: DelayStore, specs: Sequence[EntrySpec], kind: str) -> str:
    """Why a sync of ``specs`` may not go ahead while no code schedule of ``kind`` is recorded
    (a deleted record), or "" when it may: none of its names is a stored code entry of ``kind``
    (a first sync), or it changes none of them (the current deploy's, which records itself
    again). A late older deploy's set differs: with nothing to compare versions with, it must
    not win. Only the sync's own names are read (bounded by the code schedule, whatever the
    registry holds); code entries the sync lacks are kept by its sweep (``sync_code``)."""
    stored = {s.name: _code_fingerprint(store.get(item_id(s.name)), kind) for s in specs}
    if not any(stored.values()):
        return ""
    changes = [s.name for s in specs if stored[s.name] != s.fingerprint]
    if not changes:
        return ""
    key = periodic_code_key(store.config.prefix)
    return (
        f"the record of the code schedule synced last ({key}) is missing, and this sync would change the stored "
        f"code entries {sorted(changes)[:5]}: without the record nothing tells whether this deploy's schedule is "
        f"the current one. If it is, record the version before it with an operator's credential (`redis-cli HSET "
        f"{key} {kind}:version <previous version>`, or for unversioned syncs `{kind}:fp restored`), then sync again"
    )


def _code_fingerprint(item: ScheduledItem | None, kind: str) -> str | None:
    """The fingerprint of an entry's stored ``item`` if it is a code entry of kind ``kind``, else
    None (none, another kind or source, unreadable)."""
    if item is None:
        return None
    try:
        envelope = Envelope.decode(item.envelope)
        state = state_of(envelope)
    except EnvelopeError:
        return None
    return state.fingerprint if envelope.target == kind and state.source == CODE else None


@dataclass
class Sweep:
    """A sync's walk of the registry for its kind's code entries gone from the code: removed
    (or, for an empty code set or a sync that met no record, ``keep``: only counted), a
    :func:`~.registry.registry_page` per step, so a call of :meth:`run` costs a bounded time
    whatever the registry holds (200,000 junk fields must not hold a starting forwarder). A name
    with no item (an entry removed halfway, or junk) is any sync's to remove, in one
    round per page; a name with an item is read, and removed if it is a code entry of ``kind``.
    Its report's ``removed``, ``kept`` and ``errors`` grow as it goes."""

    store: DelayStore = field(repr=False)
    kind: str
    keep_names: frozenset[str] = field(repr=False)
    report: SyncReport = field(repr=False)
    keep: bool = False
    cursor: int = 0
    checked: int = 0
    started: bool = False

    @property
    def done(self) -> bool:
        return self.started and self.cursor == 0

    def progress(self) -> str:
        """How far it got, for the log and the sync's report line."""
        total = self.store.client.hlen(periodic_key(self.store.config.prefix))
        verb = "counted" if self.keep else "removed"
        count = self.report.kept if self.keep else len(self.report.removed)
        return f"registry sweep: {self.checked} fields checked ({total} registered now), {count} code entries {verb}"

    def step(self) -> None:
        """One page of the registry."""
        self.cursor, page = registry_page(self.store, self.cursor)
        self.started = True
        self.checked += len(page.names) + len(page.unreadable)
        self.report.errors.update(page.unreadable)
        names = [n for n in page.names if n not in self.keep_names]
        stored = _stored(self.store, names)
        bare = [n for n, has in zip(names, stored) if not has]
        code = [n for n, has in zip(names, stored) if has and _is_code_of(self.store, n, self.kind)]
        if self.keep:  # code entries only: a line naming no item is junk, or an entry removed halfway
            self.report.kept += len(code)
            code = []
        if bare or code:
            self.report.removed += _remove(self.store, code, bare=bare)

    def run(self, seconds: float | None = None, *, idle: float = 0.0) -> bool:
        """Steps until the sweep is done (True) or ``seconds`` passed (None: no limit), resting
        ``idle`` times each step's time after it (the background's share of the process)."""
        deadline = None if seconds is None else time.monotonic() + seconds
        if self.done:
            return True
        while not self.done and (deadline is None or time.monotonic() < deadline):
            began = time.monotonic()
            self.step()
            if idle:
                time.sleep(idle * (time.monotonic() - began))
        if self.done and self.keep and self.report.kept:
            log.warning(
                "%d code entries not in this sync kept (the code schedule is empty, or its record was missing: "
                "a sync with a record removes them; or remove them by name)",
                self.report.kept,
            )
        return self.done

    def finish_in_background(self, every: float = 5.0) -> threading.Thread:
        """Finish the sweep in a daemon thread, idle half the time (the forwarder's loop in the
        same process comes first), a progress line in the log every ``every`` seconds and one
        at the end (a failure is logged: the next sync sweeps again)."""

        def finish() -> None:
            try:
                while not self.run(every, idle=1.0):
                    log.info("periodic %s; continuing", self.progress())
                log.info("periodic %s; done", self.progress())
            except Exception as exc:  # the store went away: the next sync sweeps again
                log.warning("periodic registry sweep stopped (%r); the next sync sweeps again", exc)

        thread = threading.Thread(target=finish, name="delayq-registry-sweep", daemon=True)
        thread.start()
        return thread


def _stored(store: DelayStore, names: Sequence[str]) -> list[bool]:
    """Whether each of ``names`` has a store item, in one pipelined round (a name that can be
    no item id has none)."""
    idents: list[str | None] = []
    with store.client.pipeline(transaction=False) as pipe:
        for name in names:
            try:
                ident: str | None = item_id(name)
            except ValueError:
                ident = None
            idents.append(ident)
            if ident is not None:
                pipe.hexists(store.keys(store.shard_of(ident)).items, ident)
        replies = iter(pipe.execute() if len(pipe) else [])
    return [ident is not None and bool(next(replies)) for ident in idents]


def _is_code_of(store: DelayStore, name: str, kind: str) -> bool:
    """Entry ``name`` is a code entry of kind ``kind`` (a sync of that kind may remove it). A
    registered name with no item is removable by any sync; an unreadable item is no one's."""
    item = store.get(item_id(name))
    return item is None or _code_fingerprint(item, kind) is not None
