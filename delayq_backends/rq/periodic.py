"""When the next run of a periodic or cron job is due: rq-scheduler's rules.

The schedule lives in ``job.meta`` under rq-scheduler's own keys (``interval``, ``repeat``,
``cron_string``, ``use_local_timezone``), so jobs migrated from rq-scheduler keep repeating
and code that reads those keys keeps working.

Cron strings are read in one of two syntaxes (the envelope's schedule names it as
``cron_syntax``):

- ``"rq-scheduler"`` (:data:`RQ_SCHEDULER`, the default for new jobs): what rq-scheduler 0.14
  does, with the ``crontab`` package it uses: 5 to 7 fields (a 6th is a *year*, a 7th makes
  the first one seconds), ``@hourly`` and the other macros, day-of-month AND day-of-week
  both when both are given, and the fields read in the local time of the host that computes
  the run (``use_local_timezone`` only changes how rq-scheduler *reports* the time).
- ``"cron"`` (:data:`STANDARD_CRON`): standard cron through croniter (day-of-month OR
  day-of-week, a 6th field is seconds), in UTC or, with ``use_local_timezone``, the local zone
  with cron's DST rules. Envelopes written before the syntax was recorded read this way,
  because this is how delayq scheduled them.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from datetime import datetime, timezone, tzinfo
from typing import Any

import crontab
from croniter import croniter
from dateutil import tz

from ..errors import DelayqError

__all__ = [
    "CRON_SYNTAXES",
    "RQ_SCHEDULER",
    "STANDARD_CRON",
    "InvalidScheduleError",
    "advance",
    "due_between",
    "check_cron",
    "check_interval",
    "next_cron_time",
]

#: rq-scheduler 0.14's cron strings (the ``crontab`` package, host-local time).
RQ_SCHEDULER = "rq-scheduler"
#: Standard cron (croniter), in UTC or the local zone with ``use_local_timezone``.
STANDARD_CRON = "cron"
CRON_SYNTAXES = (RQ_SCHEDULER, STANDARD_CRON)
#: The envelope schedule key naming the syntax; absent means :data:`STANDARD_CRON` (older envelopes).
SYNTAX_KEY = "cron_syntax"

#: Cron's macros as five fields (croniter reads them too; the DST rule and rq cron entries need the fields).
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class InvalidScheduleError(DelayqError, ValueError):
    """A repeat, interval or cron string that cannot make a schedule."""


def zone(use_local_timezone: bool) -> tzinfo:
    """UTC, or the machine's local zone with its DST rules (not today's fixed offset)."""
    return tz.tzlocal() if use_local_timezone else timezone.utc


def check_syntax(syntax: Any) -> str:
    if syntax not in CRON_SYNTAXES:
        raise InvalidScheduleError(
            f"cron_syntax={syntax!r}: use {RQ_SCHEDULER!r} (rq-scheduler's) or {STANDARD_CRON!r}"
        )
    return str(syntax)


def check_cron(cron_string: str, syntax: str = RQ_SCHEDULER) -> None:
    """Raise :class:`InvalidScheduleError` unless ``cron_string`` parses in ``syntax``."""
    check_syntax(syntax)
    if isinstance(cron_string, str):
        if syntax == STANDARD_CRON and croniter.is_valid(cron_string):
            return
        if syntax == RQ_SCHEDULER:
            try:
                crontab.CronTab(cron_string)
                return
            except ValueError as exc:
                raise InvalidScheduleError(
                    f"cron string {cron_string!r} is not valid for rq-scheduler ({exc}): use five fields, "
                    "e.g. '*/5 * * * *' (every 5 minutes), optionally a sixth (the year), or a macro like '@hourly'"
                ) from None
    raise InvalidScheduleError(
        f"cron string {cron_string!r} is not valid: use five fields, e.g. '*/5 * * * *' (every 5 minutes)"
    )


def check_interval(interval: Any) -> None:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval):
        raise InvalidScheduleError(f"interval={interval!r}: pass a number of seconds > 0")
    if interval <= 0:
        raise InvalidScheduleError(f"interval={interval!r}: pass a number of seconds > 0")


def next_cron_time(
    cron_string: str, after: float, *, use_local_timezone: bool = False, syntax: str = STANDARD_CRON
) -> float | None:
    """The first time strictly after ``after`` (epoch seconds) that ``cron_string`` matches;
    None when there is none (rq-scheduler's year field, all of whose years have passed).

    In the rq-scheduler syntax, as rq-scheduler 0.14 computes it: the wall clock of this host
    (whatever ``use_local_timezone`` says), the naive result read back as local time.

    In standard cron, the fields are read in UTC, or in the local zone (with its DST rules) when
    ``use_local_timezone``. Across DST it does what cron does: a time skipped when clocks go
    forward runs right after the jump, and a job at a fixed hour runs once, not twice, in the
    hour repeated when clocks go back (jobs whose hour field is a wildcard run every real hour).
    """
    if syntax == RQ_SCHEDULER:
        return _rq_scheduler_next(crontab.CronTab(cron_string), after)
    zone_ = zone(use_local_timezone)
    start = datetime.fromtimestamp(after, tz=zone_)
    walls_back = not MACROS.get(cron_string.strip(), cron_string).split()[1].startswith("*")
    times = croniter(cron_string, start)
    while True:
        following = float(times.get_next(float))
        wall = datetime.fromtimestamp(following, tz=zone_).replace(tzinfo=None)
        if not (walls_back and wall <= start.replace(tzinfo=None)):
            return following


def _rq_scheduler_next(cron: crontab.CronTab, after: float) -> float | None:
    """rq-scheduler's next run: the next matching wall time of this host after ``after``, read
    back as local time, with two fixes for the wall times DST makes odd, where rq-scheduler
    computes a time already past and so re-enqueues the job on every poll:

    - in the hour repeated in autumn, a wall time whose first pass is over is its second pass;
    - a wall time skipped by the spring jump (02:30 in New York) runs once, at the instant
      rq-scheduler first computes (its wall read with the offset before the jump: 01:30 EST);
      the next run is the next day's, not 03:30 after the jump too.
    """
    wall = datetime.fromtimestamp(after)  # naive host-local, as rq-scheduler's datetime.now()
    while True:
        following_wall = cron.next(now=wall, default_utc=False, return_datetime=True)
        if following_wall is None:  # no later match (a year field in the past)
            return None
        following = float(following_wall.astimezone().timestamp())
        if following > after:
            return following
        if datetime.fromtimestamp(following) == following_wall:  # exists: autumn's repeated hour
            return float(following_wall.replace(fold=1).astimezone().timestamp())
        wall = following_wall  # skipped in spring, and its one run is over


def advance(meta: MutableMapping[str, Any], *, now: float) -> float | None:
    """Count one run down and return when the next is due (epoch seconds), or None if none is
    (``repeat`` used up, or a cron string with no later match).

    rq-scheduler's rules: ``repeat`` counts the runs left, this one included (``repeat=3``
    runs three times; ``None`` forever), and an ``interval`` runs again ``interval`` seconds
    after this run was moved. ``now`` is never before this run's own time, so a forwarder
    whose clock lags cannot schedule the same cron minute twice.
    """
    interval, repeat, cron_string = meta.get("interval"), meta.get("repeat"), meta.get("cron_string")
    if repeat:
        meta["repeat"] = int(repeat) - 1
    if not interval and not cron_string:
        return None
    if repeat is not None and meta["repeat"] == 0:
        return None
    if interval:
        return now + float(interval)
    return next_cron_time(
        str(cron_string),
        now,
        use_local_timezone=bool(meta.get("use_local_timezone")),
        syntax=str(meta.get(SYNTAX_KEY, STANDARD_CRON)),
    )


#: At most this many periods are counted by :func:`due_between` (a cron schedule is walked).
MAX_COUNTED = 10_000


def due_between(schedule: MutableMapping[str, Any], start: float, end: float) -> int:
    """How many periods of ``schedule`` (rq-scheduler's keys) fall due after ``start`` and up
    to ``end`` (epoch seconds), at most :data:`MAX_COUNTED`: the periods a periodic job's run
    waiting for its slot passed over (``buffer_one``)."""
    interval, cron_string = schedule.get("interval"), schedule.get("cron_string")
    if end <= start:
        return 0
    if interval:
        return min(MAX_COUNTED, int((end - start) // float(interval)))
    if not cron_string:
        return 0
    count, at = 0, start
    local, syntax = bool(schedule.get("use_local_timezone")), str(schedule.get(SYNTAX_KEY, STANDARD_CRON))
    while count < MAX_COUNTED:
        following = next_cron_time(str(cron_string), at, use_local_timezone=local, syntax=syntax)
        if following is None or following > end:
            return count
        count, at = count + 1, following
    return count
