"""Changing one periodic entry: each change is one compare-and-set of the entry's store item
(:meth:`DelayStore.replace_if`): read it, compute its new state, write it if nobody changed it
meanwhile (else read again) and no forwarder is firing it (else wait, at most a lease). The
registry line is written first on an add and last on a removal, so an entry is always listed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import cast

from ..envelope import Envelope
from ..errors import EnvelopeError, NewerFormatError
from ..keys import periodic_key
from ..models import CancelOutcome, RearmOutcome
from ..store import DelayStore
from ..timeutil import from_ms
from .registry import CodeEntryError, EntryNotFound, PeriodicError, check_registry
from .schedules import Every, Schedule
from .spec import EntrySpec, item_id
from .state import CODE, RUNTIME, PeriodicState, state_of, with_state
from .trust import forget, record

__all__ = [
    "DUE_WAIT_MS",
    "StoredEntry",
    "change_state",
    "wait_until",
    "keep_alignment",
    "preview",
    "read_entry",
    "remove",
    "remove_names",
    "upsert",
    "upsert_within",
]

log = logging.getLogger("delayq.periodic")

#: how long after a period came due (or a killed holder's lease ran out) a change of its entry's
#: schedule waits for a forwarder to fire it: twice the forwarders' default poll (a due item is
#: claimed within a poll even with no wake-up, as after a lease runs out)
DUE_WAIT_MS = 2000


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
            stored = read_entry(store, name)
        except PeriodicError:  # unreadable or newer: the upsert that follows says so
            stored = None
        old = stored.state.schedule if stored is not None else None
        aligned = isinstance(old, Every) and old.aligned
    return replace(schedule, aligned=aligned)


@dataclass(frozen=True)
class StoredEntry:
    """An entry's item as read: its bytes (the compare-and-set's expected value), envelope, state,
    and its lease's deadline (None unless a forwarder claimed it; kept past the deadline until
    another claims it or the holder's rearm)."""

    raw: bytes
    envelope: Envelope
    state: PeriodicState
    leased_until_ms: int | None
    ready_ms: int


def read_entry(store: DelayStore, name: str, *, required: bool = False) -> StoredEntry | None:
    """Entry ``name``'s item as read; None when there is none, or with ``required`` EntryNotFound."""
    item = store.get(item_id(name))
    if item is None and required:
        raise EntryNotFound(name)
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
    return StoredEntry(item.envelope, envelope, state, item.leased_until_ms, item.ready_ms)


def _ready(state: PeriodicState, now_ms: int) -> datetime:
    """When an entry's item is due: now with a pending action, else as its state says."""
    return from_ms(now_ms if state.pending else state.ready_ms())


def wait_until(store: DelayStore, wait: float | None) -> float:
    return time.monotonic() + (store.config.lease_seconds + 1 if wait is None else wait)


def _firing_due(stored: StoredEntry, new: PeriodicState, now_ms: int) -> bool:
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


def change_state(
    store: DelayStore,
    name: str,
    change: Callable[[PeriodicState, int], PeriodicState],
    *,
    wait: float | None = None,
) -> PeriodicState:
    """Apply ``change`` (state, now ms -> new state) to entry ``name`` as one compare-and-set."""
    deadline = wait_until(store, wait)
    while True:
        stored = cast(StoredEntry, read_entry(store, name, required=True))
        now = store.clock()
        new = change(stored.state, now)
        if new == stored.state:
            return new
        payload = with_state(stored.envelope, new)
        outcome = store.replace_if(item_id(name), stored.raw, _ready(new, now), payload, rank=new.rank, now=now)
        if outcome is RearmOutcome.REPLACED:
            return new
        if outcome is RearmOutcome.HELD:
            _held(name, deadline)  # NOT_FOUND: read again, which raises


def upsert(store: DelayStore, spec: EntrySpec, *, detach: bool = False, wait: float | None = None) -> str:
    """Add or update entry ``spec.name``; returns ``added``, ``changed`` or ``unchanged``.

    Raises:
        CodeEntryError: a runtime change of an entry from code, without ``detach`` (which makes
            it a runtime entry the sync no longer manages).
    """
    if spec.source == CODE:
        raise CodeEntryError(f"entry {spec.name!r}: code entries are written by a sync from code (sync_code)")
    return upsert_within(store, spec, wait_until(store, wait), detach=detach)


def upsert_within(store: DelayStore, spec: EntrySpec, deadline: float, *, detach: bool = False) -> str:
    """Add or update one entry: ``added``, ``changed``, ``unchanged``, ``shadowed`` (a code spec
    meeting a runtime entry) or ``newer`` (an entry a newer release wrote: left alone)."""
    ident = item_id(spec.name)
    if not store.register_entry(spec.name, ident):  # first: always listed
        check_registry(store)
    while True:
        now = store.clock()
        try:
            stored = read_entry(store, spec.name)
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
        stored = read_entry(store, spec.name)
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
                stored = read_entry(store, name)
            except PeriodicError:  # unreadable: removing it is the fix
                continue
            if stored is not None and stored.state.source == CODE:
                raise CodeEntryError(
                    f"entry {name!r} comes from code: the next sync adds it back. Remove it from the code (and "
                    "deploy), or pause it; force=True (--force) removes it until then"
                )
    return remove_names(store, names)


def remove_names(store: DelayStore, names: Iterable[str], *, bare: Sequence[str] = ()) -> list[str]:
    """Remove entries ``names`` (item, then registry line) and ``bare``, names known to have no
    item, whose registry lines go in one pipelined round; returns those that were there."""
    check_registry(store)
    removed = []
    for name in names:
        cancelled = store.cancel(item_id(name))
        if _unregister(store, [name]) != [False] or cancelled is not CancelOutcome.NOT_FOUND:
            removed.append(name)
    removed += [name for name, there in zip(bare, _unregister(store, bare)) if there]
    forget(store, removed)
    return removed


def _unregister(store: DelayStore, names: Sequence[str]) -> list[bool]:
    """Remove the registry lines of ``names``: whether each was there.

    Raises:
        PeriodicError: the registry is of another type (a hand write), naming the fix.
    """
    gone = store.unregister_entries(names)
    if gone is None:
        check_registry(store)
        raise PeriodicError(f"the periodic registry {periodic_key(store.config.prefix)} is not a hash")
    return gone
