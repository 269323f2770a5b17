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

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..envelope import Envelope
from ..errors import EnvelopeError, InvalidIdError, NewerFormatError
from ..keys import periodic_key
from ..kinds import kind_of
from ..overlap_policy import ALLOW
from ..store import DelayStore
from ..timeutil import MAX_MS
from .registry import (
    PAGE,
    CodeEntryError,
    EntryNotFound,
    PeriodicError,
    Registry,
    check_registry,
    read_registry,
    registry_page,
)
from .schedules import MAX_BACKFILL
from .spec import ID_PREFIX, Carried, EntryDefinition, EntrySpec, RunTemplate, item_id
from .state import CODE, PeriodicState, state_of
from .sync import START_SWEEP_SECONDS, Sweep, SyncReport, sync_code
from .trust import UntrustedError, record
from .writes import DUE_WAIT_MS, change_state, keep_alignment, preview, remove, upsert

__all__ = [
    "DUE_WAIT_MS",
    "ID_PREFIX",
    "START_SWEEP_SECONDS",
    "Carried",
    "CodeEntryError",
    "EntryNotFound",
    "EntrySpec",
    "EntryDefinition",
    "EntryStatus",
    "entry",
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
    raw = store.dead_envelope(ident)
    return None if raw is None else Envelope.decode(raw)


def pause(store: DelayStore, name: str) -> EntryStatus:
    """Stop entry ``name`` from firing (its item is never due) until :func:`resume`. A forwarder
    that claimed it in a race rearms it without sending a run."""
    change_state(store, name, lambda s, now: s.paused(now))
    return entry(store, name)


def resume(store: DelayStore, name: str) -> EntryStatus:
    """Let entry ``name`` fire again: due at its next period, or now if that has passed (then its
    misfire policy decides what the periods that came due while paused send). Those periods are
    not missed, and a run of one is late only from now: a planned pause sets off no alert."""
    change_state(store, name, lambda s, now: s.resumed(now))
    return entry(store, name)


def run_now(store: DelayStore, name: str) -> EntryStatus:
    """One extra run of entry ``name``, sent by the next firing (due now), paused or not; its
    schedule is untouched. Task id ``uuid5(name, "manual:<request ms>")``."""
    change_state(store, name, lambda s, now: replace(s, run_now=(*s.run_now, now)))
    return entry(store, name)


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

    change_state(store, name, add)
    return entry(store, name)


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


def entry(store: DelayStore, name: str) -> EntryStatus:
    """Entry ``name``.

    Raises:
        EntryNotFound: it is neither registered nor stored.
    """
    item = store.get(item_id(name))
    if item is None and not _registered(store, name):
        raise EntryNotFound(name)
    return _status(name, item)


def get(store: DelayStore, name: str) -> EntryStatus | None:
    """Entry ``name`` (None if it is neither registered nor stored)."""
    try:
        return entry(store, name)
    except EntryNotFound:
        return None


def _registered(store: DelayStore, name: str) -> bool:
    """Entry ``name`` has a registry line (a registry of another type refused, naming the fix)."""
    check_registry(store)
    return store.is_registered(name)


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
