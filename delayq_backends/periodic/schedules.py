"""When a periodic entry runs: intervals, crontabs (in a named time zone, DST-correct) and one-off
times, and what to do with runs missed during an outage. Pure: no Redis, no broker, no Celery or
RQ (their schedule objects are converted in ``celery/schedules.py`` and ``rq/``).

A schedule is a sequence of **slots**. A slot is one period: ``key`` names it (task ids of its
run derive from it, so a re-sent run of the same period carries the same id) and ``at_ms`` is
when it is due. The store holds one item per entry, due at its next slot.

Crontab and DST. An entry whose hour field covers every hour runs by the real clock, like
cron's wildcard jobs: every matching minute that exists, so in the hour repeated when clocks go
back it runs in both (they are two real hours), and in the hour skipped when clocks go forward
there is nothing to run. Any other crontab runs **once per wall-clock time**: a time in the
repeated hour runs at its first occurrence only; a time skipped when clocks go forward runs at
the jump (03:00 in Berlin for a 02:30 entry); never twice, never lost.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, ClassVar, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import ConfigError, install_hint
from ..timeutil import MAX_MS, from_ms

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_POLICY",
    "END",
    "MAX_BACKFILL",
    "POLICIES",
    "SCHEDULE_KINDS",
    "Cron",
    "Every",
    "Misfire",
    "Once",
    "Plan",
    "Schedule",
    "Slot",
    "describe_time",
    "interval",
    "run_task_id",
    "schedule_from_json",
    "zone_named",
]

#: What to do with runs missed during an outage (see :class:`Misfire`).
POLICIES = ("run_once", "run_all", "skip")
DEFAULT_POLICY = "run_once"
#: seconds: how late a run may be and still go out under ``skip``
DEFAULT_GRACE = 60.0
#: the most runs ``run_all`` sends for one outage (the latest ones)
DEFAULT_MAX_RUNS = 100
_MAX_RUNS_LIMIT = 10_000
#: the most periods one backfill request may run
MAX_BACKFILL = 10_000

#: Task ids of periodic runs are ``uuid5(_NAMESPACE, "<entry name>\\0<slot key>")``.
_NAMESPACE = uuid.UUID("6d1a7c0e-5a55-4b3e-9c53-8f0d1e2a7b61")


@dataclass(frozen=True)
class Slot:
    """One period of a schedule: ``key`` names it, ``at_ms`` is when it is due (UTC ms)."""

    key: str
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "at": self.at_ms}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Slot:
        return cls(str(data["key"]), int(data["at"]))


#: the slot after a schedule's last period (a one-off's run, an entry's end or maximum runs): it is
#: never due, so an entry there is ``finished`` (listed, never fired)
END = Slot("end", MAX_MS)


def run_task_id(entry: str, slot: Slot) -> str:
    """The Celery task id of entry ``entry``'s run for ``slot``: the same for every send of that
    period, so a duplicate (a forwarder killed between publish and ack) can be recognised."""
    return str(uuid.uuid5(_NAMESPACE, f"{entry}\0{slot.key}"))


@dataclass(frozen=True)
class Every:
    """Every ``every_ms``; the first run one period after the sync (as ``celery beat`` does), or
    with ``aligned`` (Celery's ``relative=True``) on multiples of the period since the epoch."""

    every_ms: int
    aligned: bool = False

    KEY: ClassVar[str] = "every_ms"
    newer_format = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Every:
        return cls(int(data["every_ms"]), bool(data.get("aligned")))

    def first_after(self, ms: int) -> Slot:
        at = (ms // self.every_ms + 1) * self.every_ms if self.aligned else ms + self.every_ms
        return Slot(str(at), at)

    def following(self, slot: Slot) -> Slot:
        at = slot.at_ms + self.every_ms
        return Slot(str(at), at)

    def due(self, slot: Slot, now_ms: int, keep: int) -> tuple[list[Slot], int, Slot]:
        """(the last ``keep`` slots due at ``now_ms`` from ``slot`` on, how many are due, the next)."""
        count = (now_ms - slot.at_ms) // self.every_ms + 1
        first = max(0, count - keep)
        slots = [Slot(str(at), at) for at in (slot.at_ms + i * self.every_ms for i in range(first, count))]
        nxt = slot.at_ms + count * self.every_ms
        return slots, count, Slot(str(nxt), nxt)

    def between(self, anchor: Slot, start_ms: int, end_ms: int, limit: int) -> list[Slot]:
        """The periods in ``[start_ms, end_ms]`` of this schedule as it runs from ``anchor`` (the
        entry's next period), at most ``limit`` (the first ones)."""
        first = -((anchor.at_ms - start_ms) // self.every_ms)  # ceil((start - anchor) / every)
        last = (end_ms - anchor.at_ms) // self.every_ms
        ats = (anchor.at_ms + i * self.every_ms for i in range(first, min(last + 1, first + limit)))
        return [Slot(str(at), at) for at in ats]

    def count(self, anchor: Slot, start_ms: int, end_ms: int) -> int:
        """How many periods from ``anchor`` on fall in ``[start_ms, end_ms]`` (arithmetic: a
        1 ms interval paused for a week is counted, not listed)."""
        first = max(0, -((anchor.at_ms - start_ms) // self.every_ms))
        return max(0, (end_ms - anchor.at_ms) // self.every_ms - first + 1)

    def to_json(self) -> dict[str, Any]:
        return {"every_ms": self.every_ms, "aligned": self.aligned}

    def describe(self) -> str:
        text = str(timedelta(milliseconds=self.every_ms))
        seconds = self.every_ms / 1000
        short = f"{seconds:g}s" if seconds < 60 else text
        return f"every {short}" + (" (aligned)" if self.aligned else "")


def _croniter() -> Any:
    """croniter, imported when a crontab is first used: the package root and the CLI import this
    module, and croniter comes with the ``celery`` and ``rq`` extras only."""
    try:
        from croniter import croniter
    except ImportError as exc:  # a core install: no kind of entry can run without an extra anyway
        raise ConfigError(f"crontab schedules need croniter: {install_hint('celery')} (or rq)") from exc
    return croniter


@dataclass(frozen=True)
class Cron:
    """A crontab in time zone ``zone`` (an IANA name, ``UTC`` or ``local``), fields as cron reads
    them (``minute hour day-of-month month day-of-week``, Sunday 0).

    With both day fields set, a day matching both runs (Celery's crontab), or with ``day_or`` a
    day matching either (cron's and RQ's reading: ``0 9 1 * 1`` is the 1st and every Monday).
    ``day_or`` is kept only where it changes the schedule (:meth:`of`), so every other crontab is
    stored as before it existed.
    """

    expression: str
    zone: str
    day_or: bool = False

    KEY: ClassVar[str] = "cron"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cron:
        return cls(str(data["cron"]), str(data["tz"]), data.get("day_or") is True)

    @property
    def newer_format(self) -> bool:
        """An older reader reads both day fields as both, not either."""
        return self.day_or

    @classmethod
    def of(cls, expression: str, zone: str, *, day_or: bool) -> Cron:
        """A crontab with ``day_or`` only when both day fields are set (else it reads the same)."""
        fields = expression.split()
        return cls(expression, zone, day_or and fields[2] != "*" and fields[4] != "*")

    @property
    def wall(self) -> bool:
        """Runs once per wall-clock time (the hour field is not every hour)."""
        return self.expression.split()[1] != "*"

    @property
    def tz(self) -> tzinfo:
        return zone_named(self.zone)

    def first_after(self, ms: int) -> Slot:
        if not self.wall:
            return self._real_after(ms)
        zone = self.tz
        times = self._times(from_ms(ms).astimezone(zone).replace(tzinfo=None))
        while True:  # a wall time of the repeated hour may lie before ms: it ran in the first pass
            wall = times.get_next(datetime)
            at = _instant(wall, zone)
            if at > ms:
                return Slot(wall.isoformat(), at)

    def following(self, slot: Slot) -> Slot:
        if not self.wall:
            return self._real_after(slot.at_ms)
        wall = self._times(datetime.fromisoformat(slot.key)).get_next(datetime)
        return Slot(wall.isoformat(), _instant(wall, self.tz))

    def latest(self, ms: int) -> Slot:
        """The last period at or before ``ms``, found without stepping through the ones before
        it (an entry moved in with a last run long ago catches up from there)."""
        zone = self.tz
        start = from_ms(ms + 1).astimezone(zone)
        if not self.wall:
            at = int(self._times(start).get_prev(float) * 1000)
            return Slot(str(at), at)
        wall = self._times(start.replace(tzinfo=None)).get_prev(datetime)
        return Slot(wall.isoformat(), _instant(wall, zone))

    def _real_after(self, ms: int) -> Slot:
        start = from_ms(ms).astimezone(self.tz)
        at = int(self._times(start).get_next(float) * 1000)
        return Slot(str(at), at)

    def _times(self, start: datetime) -> Any:
        """croniter's times after ``start``, the day fields read as this crontab reads them."""
        return _croniter()(self.expression, start, day_or=self.day_or)

    def due(self, slot: Slot, now_ms: int, keep: int) -> tuple[list[Slot], int, Slot]:
        slots: list[Slot] = []
        count = 0
        while slot.at_ms <= now_ms:
            slots.append(slot)
            if len(slots) > keep:
                del slots[0]
            count += 1
            slot = self.following(slot)
        return slots, count, slot

    def between(self, anchor: Slot, start_ms: int, end_ms: int, limit: int) -> list[Slot]:
        """The periods in ``[start_ms, end_ms]``, at most ``limit`` (the first ones)."""
        slots: list[Slot] = []
        slot = self.first_after(start_ms - 1)
        while slot.at_ms <= end_ms and len(slots) < limit:
            slots.append(slot)
            slot = self.following(slot)
        return slots

    def count(self, anchor: Slot, start_ms: int, end_ms: int) -> int:
        """How many periods from ``anchor`` on fall in ``[start_ms, end_ms]`` (stepped, as
        :meth:`due` steps through the same periods)."""
        found, slot = 0, anchor
        while slot.at_ms <= end_ms:
            found += slot.at_ms >= start_ms
            slot = self.following(slot)
        return found

    @classmethod
    def checked(cls, expression: str, zone: str, *, day_or: bool = False) -> Cron:
        """A crontab from user input: five fields croniter reads, in a zone :func:`zone_named` knows;
        ``day_or`` for RQ's reading of both day fields (see the class).

        Raises:
            ConfigError: naming the field syntax or the zone.
        """
        fields = expression.split()
        if len(fields) != 5 or not _croniter().is_valid(expression):
            raise ConfigError(
                f"crontab {expression!r}: use five fields 'minute hour day-of-month month day-of-week', "
                "e.g. '*/5 * * * *' or '30 2 * * 1-5'"
            )
        zone_named(zone)
        return cls.of(" ".join(fields), zone, day_or=day_or)

    def to_json(self) -> dict[str, Any]:
        return {"cron": self.expression, "tz": self.zone, **({"day_or": True} if self.day_or else {})}

    def describe(self) -> str:
        return f"crontab {self.expression} ({self.zone}{', either day' if self.day_or else ''})"


@dataclass(frozen=True)
class Once:
    """One run at ``at_ms`` (a clocked, one-off entry); then the entry is finished. A time in the
    past when it is added runs at once."""

    at_ms: int

    KEY: ClassVar[str] = "once_ms"
    newer_format = True  # an older reader cannot read it

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Once:
        return cls(int(data["once_ms"]))

    def first_after(self, ms: int) -> Slot:
        return Slot(str(self.at_ms), self.at_ms)

    def following(self, slot: Slot) -> Slot:
        return END

    def due(self, slot: Slot, now_ms: int, keep: int) -> tuple[list[Slot], int, Slot]:
        if slot == END or slot.at_ms > now_ms:
            return [], 0, slot
        return [slot], 1, END

    def between(self, anchor: Slot, start_ms: int, end_ms: int, limit: int) -> list[Slot]:
        return [Slot(str(self.at_ms), self.at_ms)] if start_ms <= self.at_ms <= end_ms and limit > 0 else []

    def count(self, anchor: Slot, start_ms: int, end_ms: int) -> int:
        return int(anchor != END and start_ms <= self.at_ms <= end_ms)

    def to_json(self) -> dict[str, Any]:
        return {"once_ms": self.at_ms}

    def describe(self) -> str:
        return f"once at {describe_time(self.at_ms)}"


#: The kinds of schedule: a new one is a class with the methods and class attributes (``KEY``, the
#: field of its JSON that says the kind; ``from_json``; ``newer_format``: a reader before kinds of
#: schedule misreads it, so its entry is stored as state v2) of these three, and its place here.
Schedule = Every | Cron | Once
SCHEDULE_KINDS: tuple[type[Schedule], ...] = get_args(Schedule)


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    """The schedule ``to_json`` wrote (KeyError: no kind's)."""
    kind = next((k for k in SCHEDULE_KINDS if k.KEY in data), None)
    if kind is None:
        raise KeyError(f"a schedule of no known kind: {sorted(data)}")
    return kind.from_json(data)


def interval(value: float | timedelta, aligned: bool = False) -> Every:
    """An :class:`Every` from seconds or a ``timedelta``.

    Raises:
        ConfigError: not at least 1 ms.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ConfigError(f"interval {value!r}: use at least 1 ms (a number of seconds or a timedelta)")
    return Every(round(seconds * 1000), aligned)


def zone_named(name: str) -> tzinfo:
    """``UTC``, ``local`` (this machine's zone, with its DST rules) or an IANA zone."""
    if name == "UTC":
        return timezone.utc
    if name == "local":
        from dateutil import tz  # with croniter (the celery and rq extras)

        local: tzinfo = tz.tzlocal()
        return local
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"time zone {name!r} is unknown: use an IANA name such as 'Europe/Berlin', UTC or local"
        ) from exc


def _instant(wall: datetime, zone: tzinfo) -> int:
    """The UTC ms of wall-clock time ``wall`` in ``zone``: its first occurrence when the hour
    repeats, the moment of the jump when clocks skip it."""
    first = wall.replace(tzinfo=zone, fold=0)
    if first.astimezone(timezone.utc).astimezone(zone).replace(tzinfo=None) == wall:
        return _ms(first)
    # skipped: find the first second whose wall clock reads later than `wall` (the jump)
    lo, hi = sorted(int(wall.replace(tzinfo=zone, fold=f).timestamp()) for f in (0, 1))
    while lo < hi:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz=zone).replace(tzinfo=None) > wall:
            hi = mid
        else:
            lo = mid + 1
    return lo * 1000


def _ms(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


# -- misfires -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one firing of an entry does: ``runs`` to send now (oldest first), how many due
    periods are ``missed`` (collapsed or skipped), and the ``next`` slot to schedule."""

    runs: list[Slot]
    missed: int
    next: Slot


@dataclass(frozen=True)
class Misfire:
    """What an entry does with periods that came due while nothing could fire it.

    - ``run_once`` (default, what ``celery beat`` does after downtime): one run for all of them,
      the latest period's; then on schedule.
    - ``run_all``: one run per missed period, at most ``max_runs`` (the latest); then on schedule.
    - ``skip``: the latest period runs only if it is at most ``grace`` seconds late; the missed
      ones never; then on schedule.

    Periods that DST puts on one instant (a skipped wall time and the time after the jump) are
    one group: ``run_once`` and ``skip`` send each period of the latest group.
    """

    policy: str = DEFAULT_POLICY
    grace: float = DEFAULT_GRACE
    max_runs: int = DEFAULT_MAX_RUNS

    #: the entry ``options`` that set it (taken out before the message is built)
    OPTIONS = ("delayq_misfire", "delayq_misfire_grace", "delayq_misfire_max")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Misfire:
        unknown = sorted(k for k in options if isinstance(k, str) and k.startswith("delayq_") and k not in cls.OPTIONS)
        if unknown:  # delayq_overlap is read (and taken out) before, by the entry
            known = [*cls.OPTIONS, "delayq_overlap"]
            raise ConfigError(f"unknown option(s) {unknown}: the periodic options are {known}")
        policy = options.get("delayq_misfire", DEFAULT_POLICY)
        if policy not in POLICIES:
            raise ConfigError(f"delayq_misfire={policy!r}: use one of {list(POLICIES)}")
        grace = options.get("delayq_misfire_grace", DEFAULT_GRACE)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < math.inf:
            raise ConfigError(f"delayq_misfire_grace={grace!r}: use a number of seconds >= 0")
        most = options.get("delayq_misfire_max", DEFAULT_MAX_RUNS)
        if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= _MAX_RUNS_LIMIT:
            raise ConfigError(f"delayq_misfire_max={most!r}: use an int in 1..{_MAX_RUNS_LIMIT}")
        return cls(str(policy), float(grace), most)

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "grace": self.grace, "max": self.max_runs}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Misfire:
        return cls(str(data["policy"]), float(data["grace"]), int(data["max"]))

    def describe(self) -> str:
        if self.policy == "run_all":
            return f"run_all (max {self.max_runs})"
        if self.policy == "skip":
            return f"skip (grace {self.grace:g}s)"
        return self.policy

    def plan(self, schedule: Schedule, slot: Slot, now_ms: int) -> Plan:
        """The runs of an entry whose next period is ``slot``, fired at ``now_ms``.

        The store said it is due, so a clock that reads a little early still fires ``slot``.
        """
        keep = self.max_runs if self.policy == "run_all" else _MAX_RUNS_LIMIT
        due, count, nxt = schedule.due(slot, max(now_ms, slot.at_ms), keep)
        if self.policy != "run_all":
            latest = due[-1].at_ms
            due = [s for s in due if s.at_ms == latest]
            if self.policy == "skip" and now_ms - latest > self.grace * 1000:
                due = []
        return Plan(due, count - len(due), nxt)


def describe_time(ms: int | None, zone: tzinfo | None = None) -> str:
    """An ISO time for listings (UTC unless ``zone``), or ``-``."""
    if ms is None:
        return "-"
    return from_ms(ms).astimezone(zone or timezone.utc).isoformat(timespec="seconds")
