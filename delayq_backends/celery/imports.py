"""The entries of celery-redbeat and django-celery-beat, read where those schedulers keep them,
as delayq periodic entries (``delayq periodic import --from redbeat|django-celery-beat``).

Neither package is imported: a team moving off one may run the import where it is not
installed, and what is read is the data both document.

- **redbeat** keeps an entry in a hash ``<prefix><name>`` (prefix ``redbeat:`` by default,
  ``redbeat_key_prefix``), listed in the sorted set ``<prefix>:schedule``: field ``definition``
  (JSON: name, task, args, kwargs, options, schedule, enabled) and ``meta`` (JSON: last_run_at,
  total_run_count), its datetimes and schedules tagged with ``__type__`` (redbeat's
  ``RedBeatJSONEncoder``). A crontab there has no zone of its own: beat reads it in the app's.
- **django-celery-beat** keeps ``PeriodicTask`` rows, each with one of ``IntervalSchedule``,
  ``CrontabSchedule`` (with its own time zone), ``SolarSchedule`` or ``ClockedSchedule``. They
  are read through the Django ORM (the project's own settings: any database Django reaches), or
  straight from an SQLite file with the tables' names Django gives them (datetimes stored in
  UTC, Django's ``USE_TZ=True``).

Each becomes an entry as its scheduler runs it: its task message built by Celery's own sender
with the app's routing and the entry's options (queue, exchange, routing key, priority,
headers, ``expires``; django-celery-beat's ``periodic_task_name`` header, as its scheduler adds
it), its enabled flag, start and end (django-celery-beat's ``start_time`` and absolute
``expires``, after which its scheduler stops it), one-off runs (a clocked time: one run;
``one_off``: at most one run), and its last run and run count (:class:`~..periodic.ops.Carried`:
the first period is the first after that last run). A schedule delayq cannot run (solar,
redbeat's ``rrule``) or an option a periodic run cannot have is refused with the reason, named
by entry; the others are read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from zoneinfo import ZoneInfo

import redis
from celery import Celery
from celery.schedules import crontab, schedule

from ..errors import ConfigError, DelayqError
from ..periodic.ops import Carried, EntrySpec
from ..periodic.schedules import Once, Schedule
from ..timeutil import to_ms
from .periodic import entry_spec, zone_of
from .schedules import from_celery

__all__ = [
    "REDBEAT_PREFIX",
    "BeatEntry",
    "Read",
    "django_entries",
    "read_django_orm",
    "read_django_sqlite",
    "read_redbeat",
    "specs_of",
]

#: redbeat's default ``redbeat_key_prefix``
REDBEAT_PREFIX = "redbeat:"


class Unsupported(DelayqError):
    """A schedule of a kind delayq entries cannot run (a solar event, an rrule)."""


@dataclass(frozen=True)
class BeatEntry:
    """One entry as a beat scheduler stores it. ``schedule`` is a Celery ``schedule`` or
    ``crontab`` (read in ``zone``, else the app's), or delayq's :class:`Once`; ``options`` are
    ``apply_async`` options; times are UTC ms."""

    name: str
    task: str
    schedule: Any
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    last_run_ms: int | None = None
    runs: int = 0
    start_ms: int | None = None
    end_ms: int | None = None
    one_off: bool = False
    zone: str | None = None


@dataclass
class Read:
    """What a reader found: the entries, and the ones it could not read (name -> why)."""

    entries: list[BeatEntry] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def specs_of(app: Celery, read: Read, *, zone: str | None = None) -> tuple[list[EntrySpec], dict[str, str]]:
    """The runtime entries of ``read``'s entries, built with ``app``'s routing (crontabs without
    a zone of their own in ``zone``, by default the app's), and the refused ones, name -> why."""
    specs, refused = [], dict(read.refused)
    for entry in read.entries:
        try:
            specs.append(_spec(app, entry, zone or zone_of(app)))
        except (DelayqError, ValueError, TypeError) as exc:
            refused[entry.name] = str(exc)
    return specs, refused


def _spec(app: Celery, entry: BeatEntry, zone: str) -> EntrySpec:
    if isinstance(entry.schedule, Unsupported):
        raise entry.schedule
    value = entry.schedule
    when: Schedule = value if isinstance(value, Once) else from_celery(value, zone=entry.zone or zone)
    options: dict[str, Any] = {**entry.options, "delayq_enabled": entry.enabled}
    for key, ms in (("delayq_start", entry.start_ms), ("delayq_end", entry.end_ms)):
        if ms is not None:
            options[key] = ms / 1000
    if entry.one_off and not isinstance(when, Once):
        options["delayq_max_runs"] = 1  # at most one run, then finished (its scheduler disables it)
    conf = {"task": entry.task, "schedule": when, "args": entry.args, "kwargs": entry.kwargs, "options": options}
    return replace(entry_spec(app, entry.name, conf), carried=Carried(entry.last_run_ms, entry.runs))


# -- redbeat ---------------------------------------------------------------------------------------


def read_redbeat(client: redis.Redis, prefix: str = REDBEAT_PREFIX) -> Read:
    """Every entry listed in redbeat's ``<prefix>:schedule``, by name."""
    read = Read()
    keys = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in client.zrange(f"{prefix}:schedule", 0, -1))
    for key in keys:
        name = key.removeprefix(prefix)
        try:
            definition, meta = client.hmget(key, ["definition", "meta"])
            if definition is None:
                raise ValueError(f"{key} has no definition (deleted while listed): delete it from {prefix}:schedule")
            read.entries.append(_redbeat_entry(name, _redbeat_json(definition), _redbeat_json(meta or b"{}")))
        except (ValueError, TypeError, KeyError, redis.ResponseError) as exc:  # a hand write: named, the rest read
            read.refused[name] = f"unreadable redbeat entry {key}: {exc}"
    return read


def _redbeat_entry(name: str, definition: Mapping[str, Any], meta: Mapping[str, Any]) -> BeatEntry:
    last = meta.get("last_run_at")
    return BeatEntry(
        name=str(definition.get("name") or name),
        task=str(definition["task"]),
        schedule=definition["schedule"],
        args=list(definition.get("args") or ()),
        kwargs=dict(definition.get("kwargs") or {}),
        options=dict(definition.get("options") or {}),
        enabled=definition.get("enabled", True) is not False,
        last_run_ms=None if last is None else to_ms(last),
        runs=int(meta.get("total_run_count") or 0),
    )


def _redbeat_json(raw: bytes | str) -> Any:
    return json.loads(raw, object_hook=_redbeat_value)


def _redbeat_value(data: dict[str, Any]) -> Any:
    """A value redbeat's encoder tagged with ``__type__``, as its decoder reads it back."""
    kind = data.get("__type__")
    if kind is None:
        return data
    if kind == "datetime":
        zone = data.get("timezone", "UTC")
        tz = timezone(timedelta(seconds=zone)) if isinstance(zone, (int, float)) else ZoneInfo(str(zone))
        year, month, day, hour, minute, second, micro = (
            int(data[f]) for f in ("year", "month", "day", "hour", "minute", "second", "microsecond")
        )
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    if kind == "interval":
        return schedule(run_every=timedelta(seconds=float(data["every"])), relative=bool(data.get("relative")))
    if kind == "crontab":
        return crontab(**{k: data[k] for k in ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")})
    return Unsupported(
        f"redbeat's {kind!r} schedule is not supported by delayq periodic entries: express it as an interval or a "
        "crontab, or keep this entry in redbeat"
    )


# -- django-celery-beat ----------------------------------------------------------------------------

_SOLAR = (
    "solar schedules are not supported by delayq periodic entries (no forwarder-side ephemeris): use a crontab "
    "near the event's time, or keep this entry in django-celery-beat"
)

#: the row a reader yields per PeriodicTask: its columns and its schedule's, flat
_COLUMNS = (
    "name", "task", "args", "kwargs", "queue", "exchange", "routing_key", "headers", "priority", "expires",
    "expire_seconds", "one_off", "start_time", "enabled", "last_run_at", "total_run_count", "interval_every",
    "interval_period", "crontab_minute", "crontab_hour", "crontab_day_of_week", "crontab_day_of_month",
    "crontab_month_of_year", "crontab_timezone", "solar_event", "clocked_time",
)  # fmt: skip

_SQL = """
SELECT t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers, t.priority, t.expires,
       t.expire_seconds, t.one_off, t.start_time, t.enabled, t.last_run_at, t.total_run_count, i.every, i.period,
       c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year, c.timezone, s.event, k.clocked_time
FROM django_celery_beat_periodictask t
LEFT JOIN django_celery_beat_intervalschedule i ON t.interval_id = i.id
LEFT JOIN django_celery_beat_crontabschedule c ON t.crontab_id = c.id
LEFT JOIN django_celery_beat_solarschedule s ON t.solar_id = s.id
LEFT JOIN django_celery_beat_clockedschedule k ON t.clocked_id = k.id
ORDER BY t.name
"""


def read_django_sqlite(url: str) -> Read:
    """django-celery-beat's tables in the SQLite database ``url`` (``sqlite:///path``, as
    dj-database-url writes it), read-only.

    Raises:
        ConfigError: not an SQLite URL, or no django-celery-beat tables there.
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigError(
            f"--database {url!r}: only sqlite:///path is read directly; for another database set "
            "DJANGO_SETTINGS_MODULE (the import reads through the Django ORM, with your project's settings)"
        )
    path = Path(unquote(parts.path)[1:])  # sqlite:///relative, sqlite:////absolute (dj-database-url's reading)
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = connection.execute(_SQL).fetchall()
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise ConfigError(
            f"{path}: no django-celery-beat tables to read ({exc}): is it the project's database?"
        ) from exc
    return django_entries(dict(zip(_COLUMNS, row)) for row in rows)


def read_django_orm() -> Read:
    """django-celery-beat's ``PeriodicTask`` rows through the Django ORM, with the settings
    ``DJANGO_SETTINGS_MODULE`` names (``django.setup()`` is called here)."""
    import django

    django.setup()
    from django_celery_beat.models import PeriodicTask

    def flat(task: Any) -> dict[str, Any]:
        row = {k: getattr(task, k) for k in _COLUMNS[:16]}
        for kind, names in (
            ("interval", ("every", "period")),
            ("crontab", ("minute", "hour", "day_of_week", "day_of_month", "month_of_year", "timezone")),
            ("solar", ("event",)),
            ("clocked", ("clocked_time",)),
        ):
            linked = getattr(task, kind)
            for column in names:
                row[column if kind == "clocked" else f"{kind}_{column}"] = getattr(linked, column, None)
        return row

    related = PeriodicTask.objects.select_related("interval", "crontab", "solar", "clocked").order_by("name")
    return django_entries(flat(task) for task in related)


def django_entries(rows: Iterator[dict[str, Any]]) -> Read:
    """The entries of django-celery-beat rows (:data:`_COLUMNS`, whichever reader made them)."""
    read = Read()
    for row in rows:
        try:
            read.entries.append(_django_entry(row))
        except (ValueError, TypeError, KeyError) as exc:
            read.refused[str(row["name"])] = f"unreadable PeriodicTask row: {exc}"
    return read


def _django_entry(row: Mapping[str, Any]) -> BeatEntry:
    name = str(row["name"])
    options = {k: row[k] for k in ("queue", "exchange", "routing_key", "priority") if row[k] not in (None, "")}
    options["headers"] = {**json.loads(row["headers"] or "{}"), "periodic_task_name": name}  # as its scheduler sends
    expires = _utc_ms(row["expires"])
    if expires is not None:
        options["expires"] = datetime.fromtimestamp(expires / 1000, timezone.utc)
    elif row["expire_seconds"]:  # 0 sets none, as its scheduler reads it (expires or expire_seconds)
        options["expires"] = int(row["expire_seconds"])
    return BeatEntry(
        name=name,
        task=str(row["task"]),
        schedule=_django_schedule(row),
        args=list(json.loads(row["args"] or "[]")),
        kwargs=dict(json.loads(row["kwargs"] or "{}")),
        options=options,
        enabled=bool(row["enabled"]),
        last_run_ms=_utc_ms(row["last_run_at"]),
        runs=int(row["total_run_count"] or 0),
        start_ms=_utc_ms(row["start_time"]),
        end_ms=expires,  # its scheduler disables the entry once `expires` has passed
        one_off=bool(row["one_off"]),
        zone=None if row["crontab_timezone"] in (None, "") else str(row["crontab_timezone"]),
    )


def _django_schedule(row: Mapping[str, Any]) -> Any:
    if row["interval_every"] is not None:
        return schedule(run_every=timedelta(**{str(row["interval_period"]): int(row["interval_every"])}))
    if row["crontab_minute"] is not None:
        fields = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
        return crontab(**{f: str(row[f"crontab_{f}"]) for f in fields})
    if row["clocked_time"] is not None:
        at = _utc_ms(row["clocked_time"])
        assert at is not None
        return Once(at)
    if row["solar_event"] is not None:
        return Unsupported(f"solar schedule ({row['solar_event']}): {_SOLAR}")
    raise ValueError("it has no schedule (no interval, crontab, solar or clocked row)")


def _utc_ms(value: datetime | str | None) -> int | None:
    """A datetime as Django stores it (aware from the ORM; text in SQLite, UTC) in UTC ms."""
    if value is None or value == "":
        return None
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return to_ms(when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc))
