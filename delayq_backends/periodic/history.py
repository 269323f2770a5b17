"""Each periodic entry's recent runs and its dead-man's-switch counters.

Every run of an entry carries its entry and period (Celery header, RQ job meta
:data:`RUN_HEADER` = ``{"name": ..., "due": <ms>}``, and ``"kind"`` for a manual or backfill
run), so whoever handles the run can record it without reading the entry: the forwarder records
``published`` once the broker confirmed it and the entry was rearmed, the worker ``started`` and
``finished`` (with the outcome). Each event is one script call (``periodic_run.lua``) on two
keys in the shard of the entry's item, so history costs no cross-slot call on a cluster:

- :meth:`ShardKeys.periodic_runs <delayq_backends.keys.ShardKeys.periodic_runs>`: the last
  :data:`HISTORY_SIZE` runs by due time (older ones are dropped);
- :meth:`ShardKeys.periodic_history <delayq_backends.keys.ShardKeys.periodic_history>`: each
  kept run's record, and the entry's ``missed`` and ``late`` counts and ``last_success``.

Both expire :data:`HISTORY_TTL_MS` after the last event, so a removed entry's history goes by
itself. History is a report, never a gate: an event that cannot be recorded (the store away, a
refused permission) is logged and dropped (:func:`reported`), and a hand write in these keys reads
as absent (a record or counter that is none, a key of another type) and is replaced by the next event.

Neutral: no Celery or RQ import, so RQ's worker hook (:mod:`delayq_backends.rq.history`) and
Celery's (:mod:`delayq_backends.celery.history`) both record through here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..keys import ShardKeys, normalize_id, shard_of
from ..scripts.library import ScriptCall
from ..scripts.store import PeriodicRun, RunEvent
from ..store import HistoryRead, PeriodicRecords, StoreCore
from .registry import EntryNotFound

__all__ = [
    "HISTORY_SIZE",
    "HISTORY_TTL_MS",
    "KINDS",
    "LATE_MS",
    "OUTCOMES",
    "RUN_HEADER",
    "EntryHistory",
    "Fired",
    "RunMark",
    "RunRecord",
    "SentRun",
    "entry_history",
    "history_keys",
    "read_histories",
    "read_history",
    "record_finished",
    "record_published",
    "record_started",
    "report_fired",
    "report_published",
    "reported",
]

log = logging.getLogger("delayq.periodic.history")

#: The Celery header and RQ job meta key naming a run's entry and period.
RUN_HEADER = "delayq_periodic"
#: Runs kept per entry (the oldest by due time are dropped).
HISTORY_SIZE = 50
#: An entry's history expires this long after its last event (a removed entry's goes by itself;
#: an entry that runs less often than this starts afresh).
HISTORY_TTL_MS = 35 * 86_400_000
#: A run published more than this after its due time counts as late (a backfill's run never:
#: it was asked for now, for a period long past).
LATE_MS = 1000
KINDS = ("scheduled", "manual", "backfill")
OUTCOMES = ("success", "failure", "retry", "revoked")


@dataclass(frozen=True)
class RunMark:
    """What a run carries about its entry: the entry's name, its period's due time, its kind."""

    name: str
    due_ms: int
    kind: str = "scheduled"

    def header(self) -> dict[str, Any]:
        """The run's :data:`RUN_HEADER` value (``kind`` only when not a scheduled run)."""
        extra = {} if self.kind == "scheduled" else {"kind": self.kind}
        return {"name": self.name, "due": self.due_ms, **extra}

    @classmethod
    def parse(cls, value: Any) -> RunMark | None:
        """The mark in a header's value; None for none or one no release wrote (a task sent with
        a header of that name by hand is simply not recorded)."""
        if not isinstance(value, Mapping):
            return None
        name, due, kind = value.get("name"), value.get("due"), value.get("kind", "scheduled")
        if not isinstance(name, str) or not name or type(due) is not int or kind not in KINDS:
            return None
        try:
            normalize_id(name)
        except ValueError:
            return None
        return cls(name, due, kind)


@dataclass(frozen=True)
class RunRecord:
    """One run as its history has it (ms since the epoch; None: not (yet) recorded)."""

    run_id: str
    due_ms: int
    kind: str = "scheduled"
    published_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    outcome: str | None = None
    lateness_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "due": self.due_ms,
            "kind": self.kind,
            "published": self.published_ms,
            "started": self.started_ms,
            "finished": self.finished_ms,
            "outcome": self.outcome,
            "lateness_ms": self.lateness_ms,
        }

    @classmethod
    def from_stored(cls, run_id: str, raw: bytes | None) -> RunRecord | None:
        """A stored record (``<due>:<kind>:<published>:<started>:<finished>:<outcome>``, times in ms
        after the due time); None for a missing one or one that is no record (a hand write)."""
        found = _RECORD.fullmatch(raw.decode("ascii", "replace")) if raw is not None else None
        if found is None:
            return None
        due, kind, published, started, finished, outcome = found.groups()
        at = [None if t == "" else int(due) + int(t) for t in (published, started, finished)]
        return cls(
            run_id,
            int(due),
            kind if kind in KINDS else "scheduled",
            at[0],
            at[1],
            at[2],
            outcome if outcome in OUTCOMES else None,
            None if published == "" else int(published),
        )


@dataclass(frozen=True)
class EntryHistory:
    """An entry's last runs (newest first) and its dead-man's-switch counters."""

    name: str
    runs: list[RunRecord] = field(default_factory=list)
    missed: int = 0
    late: int = 0
    last_success_ms: int | None = None

    def last_success_age_ms(self, now_ms: int) -> int | None:
        """How long ago its last run succeeded; None if none has (in its kept history)."""
        return None if self.last_success_ms is None else max(0, now_ms - self.last_success_ms)

    def unsucceeded_since_ms(self) -> int | None:
        """The due time of the oldest kept run after the last success that has not succeeded
        (running, failed, never started): since when the entry owes a success. None if every
        kept run after the last success succeeded (or none is kept)."""
        owed = None
        for run in self.runs:  # newest first
            if run.outcome == "success":
                break
            owed = run.due_ms
        return owed

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "missed": self.missed,
            "late": self.late,
            "last_success": self.last_success_ms,
            "runs": [r.to_json() for r in self.runs],
        }


#: A run's record as periodic_run.lua writes it.
_RECORD = re.compile(r"(\d{1,15}):([a-z]+):((?:-?\d{1,15})?):((?:-?\d{1,15})?):((?:-?\d{1,15})?):([a-z]*)")


def _count(raw: Any) -> int:
    """A counter (or time) as the script writes it; 0 for a missing one or a hand write."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else ""
    return int(text) if text.isdigit() and len(text) <= 15 else 0


def history_keys(store: StoreCore, name: str) -> tuple[str, str]:
    """Entry ``name``'s history hash and runs ZSET, in the shard of its item ``periodic:<name>``.

    Raises:
        ValueError: no entry can have ``name`` (its item id would be empty, too long or not text).
    """
    keys: ShardKeys = store.keys(shard_of(normalize_id(f"periodic:{name}"), store.config.shards))
    return keys.periodic_history(name), keys.periodic_runs(name)


def _record(store: StoreCore, name: str, event: RunEvent, keep: int) -> int:
    call = PeriodicRun.call(
        history_keys(store, name), event, keep=keep, ttl_ms=HISTORY_TTL_MS, late_ms=LATE_MS, now=store.clock()
    )
    return store.scripts.run(call)


def record_published(
    store: StoreCore, mark: RunMark, run_id: str, *, missed: int = 0, keep: int = HISTORY_SIZE
) -> bool:
    """Record that run ``run_id`` of ``mark``'s entry went to the broker now (its lateness is
    now minus its due time), and ``missed`` periods its firing did not run; False if it was
    recorded before (a run sent again after a forwarder died counts once)."""
    event = RunEvent("published", run_id, mark.due_ms, mark.kind, str(missed))
    return _record(store, mark.name, event, keep) == 1


def record_started(store: StoreCore, mark: RunMark, run_id: str, *, keep: int = HISTORY_SIZE) -> None:
    """Record that a worker started run ``run_id`` (again, for a retry: its outcome is cleared)."""
    _record(store, mark.name, RunEvent("started", run_id, mark.due_ms, mark.kind), keep)


def record_finished(store: StoreCore, mark: RunMark, run_id: str, outcome: str, *, keep: int = HISTORY_SIZE) -> None:
    """Record that run ``run_id`` ended with ``outcome`` (one of :data:`OUTCOMES`); a success
    moves the entry's last success to now."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r}: use one of {OUTCOMES}")
    _record(store, mark.name, RunEvent("finished", run_id, mark.due_ms, mark.kind, outcome), keep)


@dataclass(frozen=True)
class SentRun:
    """A run a forwarder published: its mark, its run (task) id, and since when it counts as
    late (None: its due time; the resume for a period that came due while its entry was paused)."""

    mark: RunMark
    run_id: str
    late_from_ms: int | None = None

    @property
    def late_ms(self) -> int:
        """How late after its due time it may be published and not count as late."""
        since = self.mark.due_ms if self.late_from_ms is None else self.late_from_ms
        return LATE_MS + max(0, since - self.mark.due_ms)


@dataclass(frozen=True)
class Fired:
    """One firing of an entry, as its history records it: the runs it published and the
    periods it missed (counted with its latest run, or alone when it sent none)."""

    name: str
    runs: Sequence[SentRun]
    missed: int = 0


def report_published(store: StoreCore, name: str, runs: Sequence[SentRun], *, missed: int = 0) -> None:
    """The forwarder's report of one firing of entry ``name`` (:func:`report_fired`)."""
    report_fired(store, [Fired(name, runs, missed)])


def report_fired(store: StoreCore, firings: Sequence[Fired]) -> None:
    """The forwarder's report of its firings, once their runs were confirmed and their entries
    rearmed: each run published, and the periods each missed. One round trip for them all (one
    call per event on a cluster): a call per run on the forwarder's path cost a wait for the
    CPU each on a busy machine. Failures are logged per event, as :func:`reported` does."""
    events = [(what, f.name, event, late) for f in firings for what, event, late in _events(f)]
    calls: list[ScriptCall[int] | Exception] = []
    try:
        now = store.clock()
        calls = [_call_or_error(store, name, event, now, late) for _, name, event, late in events]
        answered = store.run_each([c for c in calls if not isinstance(c, Exception)])
    except Exception as exc:  # the store away: every event of the round trip is lost
        calls, answered = [exc] * len(events), []
    replies = iter(answered)
    for (what, *_), call in zip(events, calls):
        outcome = call if isinstance(call, Exception) else next(replies)
        if isinstance(outcome, Exception):
            _not_recorded(what, outcome)


def _events(fired: Fired) -> Iterator[tuple[str, RunEvent, int]]:
    """The events one firing records, each with what it is (for the log line if it is lost) and
    the lateness past which its run counts as late."""
    for i, run in enumerate(fired.runs):
        missed = fired.missed if i == len(fired.runs) - 1 else 0
        event = RunEvent("published", run.run_id, run.mark.due_ms, run.mark.kind, str(missed))
        yield f"run {run.run_id} of {fired.name!r} published", event, run.late_ms
    if fired.missed and not fired.runs:
        alone = RunEvent("missed", "", 0, detail=str(fired.missed))
        yield f"{fired.missed} missed period(s) of {fired.name!r}", alone, LATE_MS


def _call_or_error(store: StoreCore, name: str, event: RunEvent, now: int, late_ms: int) -> ScriptCall[int] | Exception:
    """The script call recording ``event`` of entry ``name``, or why there is none (a name no
    entry can have)."""
    try:
        return PeriodicRun.call(
            history_keys(store, name), event, keep=HISTORY_SIZE, ttl_ms=HISTORY_TTL_MS, late_ms=late_ms, now=now
        )
    except ValueError as exc:
        return exc


def _not_recorded(what: str, exc: BaseException) -> None:
    log.warning("periodic history: %s not recorded (%s: %s)", what, type(exc).__name__, exc)


@contextmanager
def reported(what: str) -> Iterator[None]:
    """Around one history write of a worker or forwarder: a failure is logged, never raised
    (the run itself matters; its history is a report)."""
    try:
        yield
    except Exception as exc:
        _not_recorded(what, exc)


def read_history(store: PeriodicRecords, name: str, *, limit: int = HISTORY_SIZE) -> EntryHistory:
    """Entry ``name``'s last ``limit`` runs (newest first) and counters; empty when it has none
    (never ran, expired, or a hand write in its keys)."""
    return read_histories(store, [name], limit=limit)[0]


def entry_history(store: PeriodicRecords, name: str, *, limit: int = HISTORY_SIZE) -> EntryHistory:
    """As :func:`read_history`, for an entry that is registered or has a history.

    Raises:
        EntryNotFound: neither.
        ValueError: no entry can have ``name``.
    """
    found = read_history(store, name, limit=limit)
    if not found.runs and not store.is_registered(name):
        raise EntryNotFound(name)
    return found


def read_histories(store: PeriodicRecords, names: Sequence[str], *, limit: int = HISTORY_SIZE) -> list[EntryHistory]:
    """The histories of ``names``, in their order (one store read of two rounds), for ``periodic
    history`` and the exporter's gauges.

    Raises:
        RedisError: the store cannot be read (a key of another type reads as empty instead).
    """
    reads = store.history_reads([history_keys(store, n) for n in names], limit)
    return [_history(name, read) for name, read in zip(names, reads)]


def _history(name: str, read: HistoryRead) -> EntryHistory:
    records = (RunRecord.from_stored(i, raw) for i, raw in zip(read.run_ids, read.records))
    missed, late, success = read.counters
    return EntryHistory(
        name, [r for r in records if r is not None], _count(missed), _count(late), _count(success) or None
    )
