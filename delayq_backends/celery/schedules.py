"""Celery's schedule objects (``crontab``, ``schedule``, seconds, ``timedelta``) as delayq's
neutral ones (:mod:`delayq_backends.periodic.schedules`), with the crontab's own time zone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from dateutil import tz

from ..errors import ConfigError
from ..periodic.schedules import Cron, Schedule, interval, zone_named

__all__ = ["crontab_zone", "from_celery"]

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
        return interval(value.run_every, relative or bool(value.relative))
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return interval(value, relative)
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


def _field(values: Any, full: range) -> str:
    chosen = sorted(int(v) for v in values)
    return "*" if set(chosen) == set(full) else ",".join(map(str, chosen))
