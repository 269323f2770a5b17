"""A periodic entry's definition, whatever its kind: what an operator gives
(:class:`EntryDefinition`, from ``delayq periodic add|update`` or ``POST /periodic``), and what
is stored (:class:`EntrySpec`: the run template the kind built, the schedule, the entry's own
fields). Pure: no store, no Celery or RQ.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from ..envelope import Envelope
from ..keys import normalize_id
from ..overlap_policy import ALLOW, POLICIES
from .options import RunOptions
from .registry import PeriodicError
from .schedules import END, Cron, Misfire, Once, Period, Schedule
from .state import RUNTIME, SOURCES, LastRun, PeriodicState, first_slot

__all__ = ["ID_PREFIX", "Carried", "EntryDefinition", "EntrySpec", "RunTemplate", "item_id"]

ID_PREFIX = "periodic:"


def item_id(name: str) -> str:
    """The store item of entry ``name``."""
    return normalize_id(f"{ID_PREFIX}{name}")


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

    def first_slot(self, schedule: Schedule, now_ms: int, start_ms: int | None) -> Period:
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


@dataclass(frozen=True)
class EntryDefinition:
    """A runtime entry as an operator defines it, whichever the door: ``delayq periodic
    add|update`` and ``POST /periodic`` each read their input into one, checked as far as no
    framework is needed, and hand it to the kind's builder (:meth:`celery_conf` for Celery's
    ``entry_spec``, :meth:`rq_fields` for RQ's ``runtime_entry``).

    ``run``: the Celery task's name, or the RQ function's import path. ``queue``: None for the
    kind's routing (Celery's, RQ's ``default``). ``misfire``, ``overlap`` and ``enabled`` None: the
    kind's default (a stored entry keeps its flag).
    """

    name: str
    kind: str
    run: str
    schedule: Schedule
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_runs: int | None = None
    jitter_ms: int = 0
    misfire: Misfire | None = None
    overlap: str | None = None
    enabled: bool | None = None
    options: RunOptions = field(default_factory=RunOptions)

    def celery_conf(self) -> dict[str, Any]:
        """The entry as a ``beat_schedule`` entry (the Celery adapter's ``entry_spec`` reads it)."""
        options: dict[str, Any] = self.options.celery()
        m = self.misfire
        misfire = {} if m is None else dict(zip(Misfire.OPTIONS, (m.policy, m.grace, m.max_runs)))
        own = {
            "queue": self.queue,
            "delayq_overlap": self.overlap,
            "delayq_start": None if self.start_ms is None else self.start_ms / 1000,
            "delayq_end": None if self.end_ms is None else self.end_ms / 1000,
            "delayq_max_runs": self.max_runs,
            "delayq_jitter": self.jitter_ms / 1000 if self.jitter_ms else None,
            "delayq_enabled": self.enabled,
        }
        options.update(misfire, **{k: v for k, v in own.items() if v is not None})
        return {
            "task": self.run,
            "schedule": self.schedule,
            "args": self.args,
            "kwargs": self.kwargs,
            "options": options,
        }

    def rq_fields(self) -> dict[str, Any]:
        """The keyword arguments of the RQ adapter's ``runtime_entry`` (and the HTTP API's RQ
        producer) besides the name and the function."""
        return {
            "queue": self.queue or "default",
            "args": self.args,
            "kwargs": self.kwargs,
            "schedule": self.schedule,
            "misfire": self.misfire or Misfire(),
            "overlap": self.overlap or ALLOW,
            "options": self.options,
            "enabled": self.enabled,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "max_runs": self.max_runs,
            "jitter_ms": self.jitter_ms,
        }
