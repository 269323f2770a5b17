"""Sync from code: make the store's code entries of one kind those of the code schedule.

It touches only entries of its source (``code``) and kind: a runtime entry of the same name wins
(``shadowed``), an empty code set removes nothing, and a versioned code set older than the one
synced last changes nothing (:mod:`.registry`). The sweep of the registry for entries gone from
the code is paged (:class:`Sweep`), so a starting forwarder is not held by a large registry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..keys import periodic_code_key
from ..models import ScheduledItem
from ..store import DelayStore
from .registry import (
    VERSION_SETTING,
    PeriodicError,
    check_registry,
    check_version,
    code_fingerprint,
    record_code_sync,
    record_missing,
    registry_page,
)
from .spec import EntrySpec, item_id
from .state import CODE, read_state
from .writes import remove_names, upsert_within, wait_until

__all__ = ["START_SWEEP_SECONDS", "Sweep", "SyncReport", "code_fingerprint_of", "sync_code"]

log = logging.getLogger("delayq.periodic")

#: how long a forwarder's sync at start sweeps the registry (:class:`Sweep`) before it forwards:
#: the rest of the sweep runs in the background, however much junk the registry holds
START_SWEEP_SECONDS = 1.0


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
    deadline = wait_until(store, wait)
    for spec in specs:
        try:
            outcome = upsert_within(store, spec, deadline)
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
    stored = {s.name: code_fingerprint_of(store.get(item_id(s.name)), kind) for s in specs}
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


def code_fingerprint_of(item: ScheduledItem | None, kind: str) -> str | None:
    """The fingerprint of an entry's stored ``item`` if it is a code entry of kind ``kind``, else
    None (none, another kind or source, unreadable)."""
    read = read_state(item)
    if read is None:
        return None
    envelope, state = read
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
        total = self.store.registry_size()
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
            self.report.removed += remove_names(self.store, code, bare=bare)

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
    for name in names:
        try:
            idents.append(item_id(name))
        except ValueError:
            idents.append(None)
    replies = iter(store.items_stored([i for i in idents if i is not None]))
    return [ident is not None and next(replies) for ident in idents]


def _is_code_of(store: DelayStore, name: str, kind: str) -> bool:
    """Entry ``name`` is a code entry of kind ``kind`` (a sync of that kind may remove it). A
    registered name with no item is removable by any sync; an unreadable item is no one's."""
    item = store.get(item_id(name))
    return item is None or code_fingerprint_of(item, kind) is not None
