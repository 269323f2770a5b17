"""When a periodic entry runs: intervals and crontabs (in the app's time zone, DST-correct), and
what to do with runs missed during an outage. Pure: no Redis, no broker.

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
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from dateutil import tz

from ..errors import ConfigError
from ..timeutil import from_ms

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_POLICY",
    "POLICIES",
    "Cron",
    "Every",
    "Misfire",
    "Plan",
    "Schedule",
    "Slot",
    "describe_time",
    "from_celery",
    "run_task_id",
    "crontab_zone",
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

    def to_json(self) -> dict[str, Any]:
        return {"every_ms": self.every_ms, "aligned": self.aligned}

    def describe(self) -> str:
        text = str(timedelta(milliseconds=self.every_ms))
        seconds = self.every_ms / 1000
        short = f"{seconds:g}s" if seconds < 60 else text
        return f"every {short}" + (" (aligned)" if self.aligned else "")


@dataclass(frozen=True)
class Cron:
    """A crontab in time zone ``zone`` (an IANA name, ``UTC`` or ``local``), fields as cron reads
    them (``minute hour day-of-month month day-of-week``, Sunday 0), day fields ANDed as
    Celery does."""

    expression: str
    zone: str

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
        times = croniter(self.expression, from_ms(ms).astimezone(zone).replace(tzinfo=None), day_or=False)
        while True:  # a wall time of the repeated hour may lie before ms: it ran in the first pass
            wall = times.get_next(datetime)
            at = _instant(wall, zone)
            if at > ms:
                return Slot(wall.isoformat(), at)

    def following(self, slot: Slot) -> Slot:
        if not self.wall:
            return self._real_after(slot.at_ms)
        wall = croniter(self.expression, datetime.fromisoformat(slot.key), day_or=False).get_next(datetime)
        return Slot(wall.isoformat(), _instant(wall, self.tz))

    def _real_after(self, ms: int) -> Slot:
        start = from_ms(ms).astimezone(self.tz)
        at = int(croniter(self.expression, start, day_or=False).get_next(float) * 1000)
        return Slot(str(at), at)

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

    def to_json(self) -> dict[str, Any]:
        return {"cron": self.expression, "tz": self.zone}

    def describe(self) -> str:
        return f"crontab {self.expression} ({self.zone})"


Schedule = Every | Cron


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    if "every_ms" in data:
        return Every(int(data["every_ms"]), bool(data.get("aligned")))
    return Cron(str(data["cron"]), str(data["tz"]))


def zone_named(name: str) -> tzinfo:
    """``UTC``, ``local`` (this machine's zone, with its DST rules) or an IANA zone."""
    if name == "UTC":
        return timezone.utc
    if name == "local":
        local: tzinfo = tz.tzlocal()
        return local
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"time zone {name!r} is unknown: set Celery's timezone to an IANA name") from exc


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


# -- from Celery ----------------------------------------------------------------------------------

_FULL = {"minute": range(60), "hour": range(24), "day_of_month": range(1, 32), "month_of_year": range(1, 13)}


def from_celery(value: Any, *, zone: str, relative: bool = False) -> Schedule:
    """Our schedule for a ``beat_schedule`` entry's ``schedule``: seconds, a ``timedelta``,
    ``celery.schedules.schedule`` or ``crontab``. ``zone`` is the app's time zone, for crontabs.

    Raises:
        ConfigError: a solar schedule or another kind (saying what to use instead).
    """
    from celery.schedules import crontab, schedule, solar

    if isinstance(value, solar):
        raise ConfigError(
            "solar schedules are not supported by delayq periodic entries (no forwarder-side ephemeris): "
            "use a crontab near the event's time, or keep this entry in `celery beat`"
        )
    if isinstance(value, crontab):
        fields = [_field(value.minute, _FULL["minute"]), _field(value.hour, _FULL["hour"])]
        fields += [
            _field(value.day_of_month, _FULL["day_of_month"]),
            _field(value.month_of_year, _FULL["month_of_year"]),
        ]
        fields.append(_field(value.day_of_week, range(7)))
        own = crontab_zone(value)
        zone_named(own or zone)
        return Cron(" ".join(fields), own or zone)
    if type(value) is schedule:  # noqa: E721 - a subclass (solar, custom) means other rules
        return _every(value.run_every, relative or bool(value.relative))
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return _every(value, relative)
    raise ConfigError(
        f"schedule {value!r} ({type(value).__name__}) is not supported: use a number of seconds, a timedelta, "
        "celery.schedules.schedule(run_every=...) or celery.schedules.crontab(...)"
    )


def crontab_zone(value: Any) -> str | None:
    """The time zone a crontab names for itself, or None (it follows the app's).

    Celery reads a crontab in its ``tz``: the app's, unless a subclass or the instance sets its
    own (django-celery-beat's ``TzAwareCrontab``), and before 5.7 in the zone of its ``nowfun``'s
    "now". Both are honoured when their zone has a name, so its DST rules are known; they must
    agree.

    Raises:
        ConfigError: a zone without a name (a fixed offset, a naive ``nowfun``), or two that differ.
    """
    from celery.schedules import BaseSchedule

    named: dict[str, str] = {}
    if type(value).tz is not BaseSchedule.tz or "tz" in vars(value):  # set, not the app's
        named["the crontab's tz"] = _zone_name("the crontab's tz", value.tz)
    if value.nowfun is not None:
        now = value.nowfun()
        if not isinstance(now, datetime) or now.tzinfo is None:
            raise ConfigError(
                f"the crontab's nowfun returned {now!r}, a time without a zone: return an aware datetime, e.g. "
                "datetime.now(ZoneInfo('America/New_York')), or drop nowfun to follow the app's timezone"
            )
        named["the crontab's nowfun"] = _zone_name("the crontab's nowfun", now.tzinfo)
    if len(set(named.values())) > 1:
        raise ConfigError(f"the crontab names two time zones ({named}): make them one")
    return next(iter(named.values()), None)


def _zone_name(where: str, zone: Any) -> str:
    """The IANA name (or ``UTC``, ``local``) of ``zone``, which :func:`zone_named` reads back."""
    if isinstance(zone, str):
        zone_named(zone)
        return zone
    name = getattr(zone, "key", None) or getattr(zone, "zone", None)  # zoneinfo, pytz
    if isinstance(name, str):
        return name
    if isinstance(zone, tz.tzlocal):
        return "local"
    if zone is timezone.utc or isinstance(zone, tz.tzutc):
        return "UTC"
    raise ConfigError(
        f"{where} is in time zone {zone!r}, which has no IANA name, so its DST rules cannot be known: use "
        "zoneinfo.ZoneInfo('Region/City') (a fixed UTC offset never follows DST)"
    )


def _every(value: float | timedelta, aligned: bool) -> Every:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ConfigError(f"interval {value!r}: use at least 1 ms (a number of seconds or a timedelta)")
    return Every(round(seconds * 1000), aligned)


def _field(values: Any, full: range) -> str:
    chosen = sorted(int(v) for v in values)
    return "*" if set(chosen) == set(full) else ",".join(map(str, chosen))


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
