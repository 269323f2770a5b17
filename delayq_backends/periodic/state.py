"""What a periodic entry's store item carries besides its run template: its schedule, where it
is in it, how it fires, and the pending actions a forwarder applies at its next firing.

The state is JSON in the envelope's meta (``periodic``). Every field added with entries as data
(source, enabled, start/end, maximum runs, jitter, pending actions, a crontab's ``day_or``, run
options) is optional: absent means what an entry did before. An entry using one is written as
state ``"v": 2`` inside an envelope of format :data:`~delayq_backends.envelope.ENTRY_FORMAT_VERSION`,
so an older forwarder leaves it alone (a newer format) instead of firing it and dropping the
fields in its rearm.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..envelope import Envelope
from ..errors import EnvelopeError
from ..overlap_policy import ALLOW, POLICIES
from .options import RunOptions
from .schedules import END, Every, Misfire, Plan, Schedule, Slot, schedule_from_json

__all__ = [
    "CODE",
    "LAZY_META",
    "META",
    "RUNTIME",
    "SOURCES",
    "LastRun",
    "PeriodicState",
    "first_slot",
    "jitter_offset",
    "state_of",
    "with_state",
]

#: the envelope meta key holding an entry's :class:`PeriodicState`, whatever its kind
META = "periodic"

#: the envelope meta key of a template's arguments evaluated per run (Celery's ``BeatLazyFunc``):
#: an older forwarder would send the template's placeholders, so such an entry is always written
#: in the entry format, which it leaves alone
LAZY_META = "lazy"

#: an entry synced from code (``beat_schedule``, RQ cron config): a sync manages it
CODE = "code"
#: an entry added at runtime (Python API, CLI, HTTP, dashboard): no sync touches it
RUNTIME = "runtime"
SOURCES = (CODE, RUNTIME)


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


def jitter_offset(name: str, slot: Slot, jitter_ms: int) -> int:
    """The delay in ``[0, jitter_ms)`` of entry ``name``'s period ``slot``: from a hash, so every
    forwarder (and every re-fire of the period) computes the same one."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.sha1(f"{name}\0{slot.key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % jitter_ms


@dataclass(frozen=True)
class PeriodicState:
    """A periodic item's state (envelope meta ``periodic``), for every entry kind.

    ``slot`` is the next period (:data:`~.schedules.END` once ``finished``); ``run_now`` holds the
    request times (ms) of pending manual runs and ``backfill`` pending ``(from_ms, to_ms)`` ranges,
    both applied and cleared by the next firing, under its lease.
    """

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
    source: str = CODE
    enabled: bool = True
    #: when it was paused; kept after a resume until a firing has planned the periods of the pause
    paused_ms: int | None = None
    #: when it was last resumed: periods due in ``[paused_ms, resumed_ms)`` were paused, not missed
    resumed_ms: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_runs: int | None = None
    jitter_ms: int = 0
    run_now: tuple[int, ...] = ()
    backfill: tuple[tuple[int, int], ...] = ()
    #: the run options as given (:mod:`.options`): the run template applies them, this copy is what
    #: an edit form and ``periodic show`` read back
    options: RunOptions = RunOptions()

    @property
    def finished(self) -> bool:
        """Past its last period (one-off sent, end time passed, maximum runs reached): listed, never fired."""
        return self.slot == END

    @property
    def pending(self) -> bool:
        """A manual run or a backfill waits for the next firing."""
        return bool(self.run_now or self.backfill)

    def paused(self, now_ms: int) -> PeriodicState:
        """Paused from ``now_ms``, or from a pause whose periods no firing has planned yet (paused
        again before the firing after a resume: one pause from the first)."""
        if not self.enabled:
            return self
        return replace(self, enabled=False, paused_ms=now_ms if self.paused_ms is None else self.paused_ms)

    def resumed(self, now_ms: int) -> PeriodicState:
        """Enabled again at ``now_ms``; its pause kept for the next firing to tell paused periods
        from missed ones."""
        return self if self.enabled else replace(self, enabled=True, resumed_ms=now_ms)

    def pause_window(self) -> tuple[int, int] | None:
        """``[from, to)`` of the pause whose periods the next firing plans, if any: periods due in
        it were paused, so they are not missed, and a run of one is late only from the resume."""
        if not self.enabled or self.paused_ms is None or self.resumed_ms is None:
            return None
        return (self.paused_ms, self.resumed_ms) if self.paused_ms < self.resumed_ms else None

    @property
    def newer_format(self) -> bool:
        """Uses a field an older forwarder would drop in its rearm: stored as state v2."""
        return bool(self._new_fields()) or self.schedule.newer_format

    def ready_ms(self) -> int:
        """When its item is due: never while paused or finished; now with a pending action; else
        its next period plus the period's jitter."""
        if self.pending:
            return 0
        if not self.enabled or self.finished:
            return END.at_ms
        return self.slot.at_ms + jitter_offset(self.name, self.slot, self.jitter_ms)

    def _new_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.source != CODE:
            fields["source"] = self.source
        if not self.enabled:
            fields["enabled"] = False
        for key, value in (("start", self.start_ms), ("end", self.end_ms), ("max_runs", self.max_runs)):
            if value is not None:
                fields[key] = value
        if self.jitter_ms:
            fields["jitter"] = self.jitter_ms
        if self.run_now:
            fields["run_now"] = list(self.run_now)
        if self.backfill:
            fields["backfill"] = [list(r) for r in self.backfill]
        if self.options.given():
            fields["options"] = self.options.to_json()
        return fields

    def _pause_fields(self) -> dict[str, Any]:
        """When it was paused and resumed: kept in any format, since an older forwarder that drops
        them in its rearm loses only the telling of paused from missed periods (a report)."""
        times = (("paused", self.paused_ms), ("resumed", self.resumed_ms))
        return {key: value for key, value in times if value is not None}

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.overlap == ALLOW and not self.skipped else {"overlap": self.overlap, "skipped": self.skipped}
        return {
            **({"v": 2, **self._new_fields()} if self.newer_format else {}),
            **self._pause_fields(),
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
            source=RUNTIME if data.get("source") == RUNTIME else CODE,
            enabled=data.get("enabled", True) is not False,
            paused_ms=_time(data.get("paused")),
            resumed_ms=_time(data.get("resumed")),
            start_ms=_optional_int(data.get("start")),
            end_ms=_optional_int(data.get("end")),
            max_runs=_optional_int(data.get("max_runs")),
            jitter_ms=_count(data.get("jitter", 0)),
            run_now=tuple(int(ms) for ms in data.get("run_now") or ()),
            backfill=tuple((int(a), int(b)) for a, b in data.get("backfill") or ()),
            options=RunOptions.from_json(data.get("options")),
        )

    def fired(self, plan: Plan, now_ms: int, skipped: int = 0) -> PeriodicState:
        """The state after sending ``plan``'s runs (``skipped`` more periods skipped by the
        overlap policy; ``runs`` counts scheduled periods, not manual or backfill runs): due at
        ``plan.next``, no action pending, the periods of a past pause planned."""
        last = self.last
        if plan.runs or plan.missed:
            latest = plan.runs[-1] if plan.runs else self.slot
            last = LastRun(latest.key, latest.at_ms, now_ms, plan.missed)
        return replace(
            self,
            slot=plan.next,
            last=last,
            runs=self.runs + len(plan.runs),
            skipped=self.skipped + skipped,
            run_now=(),
            backfill=(),
            paused_ms=self.paused_ms if not self.enabled else None,
        )


def _policy(value: Any) -> str:
    """A stored overlap policy; one no release wrote (a hand write) reads as ``allow``."""
    return str(value) if value in POLICIES else ALLOW


def _count(value: Any) -> int:
    """A stored count; one that is none (a hand write) starts again from 0."""
    return value if type(value) is int and value >= 0 else 0


def _time(value: Any) -> int | None:
    """A stored pause or resume time; one that is none (a hand write) reads as absent: these
    only tell paused periods from missed ones."""
    return value if type(value) is int and value >= 0 else None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def state_of(envelope: Envelope) -> PeriodicState:
    """The state of a periodic entry's envelope (any kind).

    Raises:
        EnvelopeError: the envelope is no periodic entry's (no or a damaged ``periodic`` meta).
    """
    try:
        return PeriodicState.from_json(envelope.meta[META])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EnvelopeError(f"not a delayq periodic entry: {type(exc).__name__}: {exc}") from exc


def with_state(envelope: Envelope, state: PeriodicState) -> bytes:
    """``envelope`` carrying ``state``, encoded: in the entry format when the state uses a field
    an older forwarder would drop (see the module's docstring) or the template has arguments
    evaluated per run (:data:`LAZY_META`), else in the plain one."""
    out = replace(envelope, meta={**envelope.meta, META: state.to_json()})
    return out.encode_entry() if state.newer_format or LAZY_META in envelope.meta else out.encode()


def first_slot(schedule: Schedule, now_ms: int, start_ms: int | None = None) -> Slot:
    """The first period of a new entry (or one whose schedule changed): after now, and not before
    ``start_ms``; an interval that starts later runs first at its start."""
    if start_ms is None or start_ms <= now_ms:
        return schedule.first_after(now_ms)
    if isinstance(schedule, Every) and not schedule.aligned:
        return Slot(str(start_ms), start_ms)
    return schedule.first_after(start_ms - 1)
