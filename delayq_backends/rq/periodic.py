"""When the next run of a periodic or cron job is due: rq-scheduler's rules, DST-correct.

The schedule lives in ``job.meta`` under rq-scheduler's own keys (``interval``, ``repeat``,
``cron_string``, ``use_local_timezone``), so jobs migrated from rq-scheduler keep repeating
and code that reads those keys keeps working.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone, tzinfo
from typing import Any, MutableMapping, Optional

from croniter import croniter
from dateutil import tz

from ..errors import DelayqError

__all__ = ["InvalidScheduleError", "advance", "check_cron", "check_interval", "next_cron_time"]


class InvalidScheduleError(DelayqError, ValueError):
    """A repeat, interval or cron string that cannot make a schedule."""


def zone(use_local_timezone: bool) -> tzinfo:
    """UTC, or the machine's local zone with its DST rules (not today's fixed offset)."""
    return tz.tzlocal() if use_local_timezone else timezone.utc


def check_cron(cron_string: str) -> None:
    if not isinstance(cron_string, str) or not croniter.is_valid(cron_string):
        raise InvalidScheduleError(
            f"cron string {cron_string!r} is not valid: use five fields, e.g. '*/5 * * * *' (every 5 minutes)"
        )


def check_interval(interval: Any) -> None:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval):
        raise InvalidScheduleError(f"interval={interval!r}: pass a number of seconds > 0")
    if interval <= 0:
        raise InvalidScheduleError(f"interval={interval!r}: pass a number of seconds > 0")


def next_cron_time(cron_string: str, after: float, *, use_local_timezone: bool = False) -> float:
    """The first time strictly after ``after`` (epoch seconds) that ``cron_string`` matches.

    The fields are read in UTC, or in the local zone (with its DST rules) when
    ``use_local_timezone``. Across DST it does what cron does: a time skipped when clocks go
    forward runs right after the jump, and a job at a fixed hour runs once, not twice, in the
    hour repeated when clocks go back (jobs whose hour field is a wildcard run every real hour).
    """
    zone_ = zone(use_local_timezone)
    start = datetime.fromtimestamp(after, tz=zone_)
    walls_back = not cron_string.split()[1].startswith("*")
    times = croniter(cron_string, start)
    while True:
        following = float(times.get_next(float))
        wall = datetime.fromtimestamp(following, tz=zone_).replace(tzinfo=None)
        if not (walls_back and wall <= start.replace(tzinfo=None)):
            return following


def advance(meta: MutableMapping[str, Any], *, now: float) -> Optional[float]:
    """Count one run down and return when the next is due (epoch seconds), or None if none is.

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
    return next_cron_time(str(cron_string), now, use_local_timezone=bool(meta.get("use_local_timezone")))
