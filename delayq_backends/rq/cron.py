"""A user's ``rq cron`` config, run by delayq's forwarders: leaderless, with time zones and misfires.

RQ's ``rq cron config.py`` loads a module whose ``rq.cron.register(func, queue_name, ...)``
calls define cron jobs, then enqueues them from one process, with no lock (two ``rq cron``
processes enqueue every job twice), in the host's local time and with nothing for the runs
missed while it was down. :func:`load_config` loads the same module with RQ's own loader
(``CronScheduler.load_config_from_file``: a dotted module path or a ``.py`` file) without
starting RQ's scheduler, and yields each registered job as a :class:`CronEntry`: a name, a
schedule, and the RQ job template its runs are made from (:mod:`.entries`). ``delayq rq-cron
sync CONFIG`` and ``delayq forward --rq-cron CONFIG`` store them as periodic entries of kind
``rq-periodic``, which any number of forwarders fire.

The config needs no change. To give an entry a time zone, a misfire or an overlap policy,
register it with :func:`register`, a drop-in for ``rq.cron.register`` taking ``tz=``,
``misfire=``, ``misfire_grace=``, ``misfire_max=`` and ``overlap=`` besides; ``rq cron`` still
loads such a config (it ignores them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
from croniter import croniter
from rq import Queue as RQQueue
from rq import Worker
from rq import cron as rq_cron
from rq.defaults import DEFAULT_RESULT_TTL

from ..errors import ConfigError, DelayqError
from ..overlap_policy import ALLOW, check_policy
from ..periodic.ops import EntrySpec, RunTemplate, SyncReport, sync_code
from ..periodic.options import RunOptions, check_import_path
from ..periodic.schedules import Cron, Misfire, Schedule
from ..periodic.schedules import interval as interval_of
from ..periodic.state import CODE, RUNTIME
from ..store import DelayStore
from .entries import KIND, JobTemplate, capture
from .periodic import MACROS

__all__ = [
    "CronConfig",
    "CronEntry",
    "CronOptions",
    "code_entries",
    "entry",
    "load_config",
    "register",
    "runtime_entry",
    "sync",
    "workers_on",
]

log = logging.getLogger("delayq.rq.cron")


@dataclass(frozen=True)
class CronOptions:
    """What :func:`register` takes besides ``rq.cron.register``'s arguments."""

    tz: str | None = None
    misfire: Misfire = field(default_factory=Misfire)
    overlap: str = ALLOW


#: (the job data dict ``rq.cron.register`` returned, its options) of each :func:`register` call
#: since the last load; matched by identity, as RQ's loader hands the same dicts to its scheduler.
_registered: list[tuple[dict[str, Any], CronOptions]] = []


def register(
    func: Callable[..., Any],
    queue_name: str,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    interval: int | None = None,
    cron: str | None = None,
    job_timeout: int | None = None,
    result_ttl: int = DEFAULT_RESULT_TTL,
    ttl: int | None = None,
    failure_ttl: int | None = None,
    meta: dict[str, Any] | None = None,
    webhooks: Sequence[Any] | None = None,
    name: str = "",
    *,
    tz: str | None = None,
    misfire: str | None = None,
    misfire_grace: float | None = None,
    misfire_max: int | None = None,
    overlap: str | None = None,
) -> dict[str, Any]:
    """``rq.cron.register`` with delayq's options: the job is registered with RQ as it is (so
    ``rq cron`` runs this config unchanged), and the options are kept for :func:`load_config`.

    Args:
        tz: the IANA time zone ``cron`` is read in (default: this host's zone, as ``rq cron``).
        misfire: ``run_once`` (default), ``run_all`` or ``skip``, with ``misfire_grace`` (seconds,
            for ``skip``) and ``misfire_max`` (for ``run_all``): see docs/celery-periodic.md.
        overlap: ``allow`` (default), ``skip`` or ``buffer_one`` (runs hold the entry's slot
            under ``rq worker --worker-class delayq_backends.rq.SlotWorker``).

    Raises:
        ConfigError: an unknown policy or time zone, named with the fix.
    """
    options = {"delayq_misfire": misfire, "delayq_misfire_grace": misfire_grace, "delayq_misfire_max": misfire_max}
    label = name or f"{getattr(func, '__module__', '?')}.{getattr(func, '__name__', '?')}"
    chosen = CronOptions(
        tz=_check_zone(tz) if tz is not None else None,
        misfire=Misfire.from_options({k: v for k, v in options.items() if v is not None}),
        overlap=check_policy(label, overlap or ALLOW),
    )
    data: dict[str, Any] = rq_cron.register(
        func, queue_name, args=args, kwargs=kwargs, interval=interval, cron=cron, job_timeout=job_timeout,
        result_ttl=result_ttl, ttl=ttl, failure_ttl=failure_ttl, meta=meta, webhooks=webhooks, name=name,
    )  # fmt: skip
    _registered.append((data, chosen))
    return data


@dataclass(frozen=True)
class CronEntry:
    """One registered cron job as a periodic entry: its name (the job's ``name``, else the
    function's dotted path, as RQ names it; a second job of the same name is ``name#2``), schedule,
    policies and run template."""

    name: str
    schedule: Schedule
    template: JobTemplate
    misfire: Misfire = field(default_factory=Misfire)
    overlap: str = ALLOW

    def spec(self, *, source: str = CODE, **fields: Any) -> EntrySpec:
        """The entry for :mod:`delayq_backends.periodic.ops`: as a sync from code stores it, or
        with ``source="runtime"`` for ``ops.upsert``, with further :class:`EntrySpec` fields
        (``start_ms``, ``end_ms``, ``max_runs``, ``jitter_ms``, ``enabled``)."""
        what = [self.template.fingerprint(), self.schedule.to_json(), self.misfire.to_json()]
        fingerprint = hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
        # as Celery's: a new schedule is a change; its job's data is code to run: an operator's definition
        run = RunTemplate(self.template.to_envelope(), fingerprint, trust=self.template.digest())
        return EntrySpec(self.name, run, self.schedule, self.misfire, self.overlap, source=source, **fields)


def entry(
    name: str,
    func: str | Callable[..., Any],
    queue: str,
    *,
    interval: float | None = None,
    cron: str | None = None,
    tz: str | None = None,
    misfire: Misfire | None = None,
    overlap: str = ALLOW,
    **job: Any,
) -> CronEntry:
    """An RQ periodic entry from its parts, as ``cron.register`` takes them (``func`` may be a
    dotted path: nothing is imported), for a runtime add::

        ops.upsert(store, entry("nightly", "myapp.jobs.report", "reports", cron="0 2 * * *",
                                tz="Europe/Berlin", args=("daily",)).spec(source="runtime"))

    ``job`` takes ``args``, ``kwargs``, ``job_timeout``, ``result_ttl``, ``ttl``,
    ``failure_ttl``, ``meta``, ``webhooks`` and the retry and callbacks of
    :meth:`~delayq_backends.periodic.options.RunOptions.rq`.

    Raises:
        PeriodicError: ``func`` given as text that is no import path.
        ConfigError: neither or both of ``interval`` and ``cron``, a bad cron string or zone.
        TemplateError: a job RQ cannot make (see :func:`~.entries.capture`).
    """
    if (interval is None) == (cron is None):
        raise ConfigError(f"entry {name!r}: pass interval= (seconds) or cron= (a cron string), one of them")
    schedule: Schedule = interval_of(interval) if interval is not None else _cron(str(cron), tz or _local_zone())
    template = capture(check_import_path(func, "func") if isinstance(func, str) else func, queue, **job)
    return CronEntry(name, schedule, template, misfire or Misfire(), check_policy(name, overlap))


def runtime_entry(
    name: str,
    func: str,
    *,
    queue: str,
    schedule: Schedule,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    misfire: Misfire | None = None,
    overlap: str = ALLOW,
    options: RunOptions | None = None,
    **fields: Any,
) -> EntrySpec:
    """A runtime entry running ``func`` (an import path, checked as one but not imported here) on
    ``schedule``, its job template captured as a config's are (:func:`~.entries.capture`) with the
    entry's run ``options`` (:class:`~delayq_backends.periodic.options.RunOptions`: timeout,
    result_ttl, ttl, meta, retry, callbacks); ``fields`` are :class:`EntrySpec`'s own
    (``enabled``, ``start_ms``, ``end_ms``, ``max_runs``, ``jitter_ms``). The HTTP API (after its
    function allowlist) and ``delayq periodic add --kind rq`` build theirs here.

    Raises:
        PeriodicError: ``func`` is not an import path (the message says what to give).
        TemplateError: RQ cannot make a job of it (a ValueError: its message says why).
    """
    options = options or RunOptions()
    template = capture(check_import_path(func, "func"), queue, args=args, kwargs=kwargs, **options.rq())
    code = CronEntry(name, schedule, template, misfire or Misfire(), check_policy(name, overlap))
    return code.spec(source=RUNTIME, options=options, **fields)  # its fingerprint, as a sync's


def workers_on(connection: redis.Redis, queue: str) -> int:
    """How many RQ workers listen on ``queue`` now (RQ's worker registry)."""
    return len(Worker.all(connection=connection, queue=RQQueue(queue, connection=connection)))


@dataclass
class CronConfig:
    """A loaded config: its entries, and the registrations that cannot be entries (name → why)."""

    path: str
    entries: list[CronEntry] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


class _Loader(rq_cron.CronScheduler):
    """RQ's CronScheduler, used only for its config loader: each job its loader registers
    becomes a :class:`CronEntry` (never enqueued; the client never connects)."""

    def __init__(self) -> None:
        super().__init__(connection=redis.Redis(), logging_level=logging.WARNING)
        self.config = CronConfig("")
        self._calls = 0

    def register(self, func: Callable[..., Any], queue_name: str, **job: Any) -> Any:  # type: ignore[override]
        pending = rq_cron._job_data_registry
        data = pending[self._calls] if self._calls < len(pending) else None
        self._calls += 1
        options = next((o for d, o in _registered if d is data), CronOptions())
        name = self._unique(job.get("name") or f"{func.__module__}.{func.__name__}")  # RQ's CronJob's name
        try:
            registered = super().register(func, queue_name, **job)  # RQ's own checks (interval or cron)
            entry = _entry(name, func, queue_name, job, options)
        except (DelayqError, ValueError, TypeError) as exc:
            self.config.errors[name] = str(exc)
            return None
        self.config.entries.append(entry)
        return registered

    def _unique(self, name: str) -> str:
        """``name``, or ``name#2``, ``name#3``, ... for the second and later registrations of it:
        RQ 3 runs every registration, and several may share a name (a function registered twice
        without ``name=``), while an entry's name is its key in the store. Numbered in the
        config's order, so every forwarder loading the config names them alike; ``name=`` on each
        keeps their names (and run history) when the config's order changes."""
        taken = {e.name for e in self.config.entries} | set(self.config.errors)
        number = 1
        unique = name
        while unique in taken:
            number += 1
            unique = f"{name}#{number}"
        if number > 1:
            log.info("rq cron job %r is registered more than once: its entry no. %d is named %r", name, number, unique)
        return unique


def sync(
    store: DelayStore,
    config: CronConfig,
    *,
    version: Any = None,
    wait: float | None = None,
    sweep_seconds: float | None = None,
) -> SyncReport:
    """Make the store's RQ code entries those of ``config`` (:func:`~delayq_backends.periodic.ops.sync_code`
    for kind ``rq-periodic``): by name, new ones added, changed ones replaced (their next run
    kept while their schedule is), those gone from the config removed; runtime entries and
    Celery ones untouched; an empty config removes nothing; a ``version`` lower than the one
    synced last changes nothing.

    Raises:
        PeriodicError: the registry or the version record is damaged (naming the fix).
    """
    specs, errors = code_entries(config)
    return sync_code(
        store, specs, kind=KIND, errors=errors, version=version, wait=wait, sweep_seconds=sweep_seconds,
        version_setting="--schedule-version (DELAYQ_SCHEDULE_VERSION) of `delayq rq-cron sync` or `delayq forward`",
    )  # fmt: skip


def code_entries(config: CronConfig) -> tuple[list[EntrySpec], dict[str, str]]:
    """The code entries of ``config``, and those that cannot be entries (name -> why)."""
    specs, errors = [], dict(config.errors)
    for entry in config.entries:
        try:
            specs.append(entry.spec())
        except DelayqError as exc:  # a name that cannot be an item id
            errors[entry.name] = str(exc)
    return specs, errors


def load_config(path: str, *, search_path: Sequence[str] = (".",)) -> CronConfig:
    """The entries of ``rq cron`` config ``path`` (a module path, ``app.cron_config``, or a
    ``.py`` file), loaded as ``rq cron`` loads it; the jobs that cannot be entries in ``errors``.

    Args:
        search_path: directories added to ``sys.path`` first, as ``rq cron --path`` (default
            the current directory, where the config's own imports are usually found).

    Raises:
        ConfigError: the config cannot be imported (its error is kept).
    """
    for directory in search_path:
        if os.path.abspath(directory) not in (os.path.abspath(p) for p in sys.path):
            sys.path.append(os.path.abspath(directory))
    loader = _Loader()
    _registered.clear()
    try:
        loader.load_config_from_file(path)
    except Exception as exc:  # RQ's loader wraps the config's own error
        raise ConfigError(f"cannot load the rq cron config {path!r}: {exc}") from exc
    finally:
        _registered.clear()
    loader.config.path = path
    return loader.config


def _entry(name: str, func: Callable[..., Any], queue: str, job: dict[str, Any], options: CronOptions) -> CronEntry:
    """One job RQ's loader registered, as an entry (``func`` the function: RQ names it itself,
    exactly as its enqueue does). ValueError names what RQ's job cannot be."""
    options_of_job = {k: job.get(k) for k in _JOB_OPTIONS}
    schedule = {"interval": job["interval"]} if job.get("interval") else {"cron": job.get("cron")}
    return entry(name, func, queue, tz=options.tz, misfire=options.misfire, overlap=options.overlap,
                 **schedule, **options_of_job)  # fmt: skip


#: The job options of ``cron.register`` a template is captured with.
_JOB_OPTIONS = ("args", "kwargs", "job_timeout", "result_ttl", "ttl", "failure_ttl", "meta", "webhooks")


def _cron(expression: str, zone: str) -> Cron:
    """A cron string as ``rq cron`` reads it (croniter: five fields, or six with seconds last;
    the macros; both day fields set run on either day, as cron's), in ``zone``.

    Raises:
        ConfigError: not a cron string.
    """
    fields = MACROS.get(expression.strip(), expression).split()
    text = " ".join(fields)
    if len(fields) not in (5, 6) or not croniter.is_valid(text):
        raise ConfigError(
            f"cron {expression!r}: use five fields 'minute hour day-of-month month day-of-week' (a sixth is "
            "seconds), e.g. '*/5 * * * *', or a macro like '@hourly'"
        )
    _check_zone(zone)
    return Cron.of(text, zone, day_or=True)


def _check_zone(name: str) -> str:
    if name in ("UTC", "local"):
        return name
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"tz={name!r} is not a time zone: use an IANA name such as 'Europe/Berlin'") from exc
    return name


def _local_zone() -> str:
    """This host's time zone by name, as ``rq cron`` reads cron strings in it: from ``TZ`` or
    ``/etc/localtime``, so every forwarder reads the entry in the zone of the host that synced it
    (not each its own); ``UTC`` on a host whose zone is UTC; else ``local``."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        target = os.path.realpath("/etc/localtime")
        candidates.append(target.partition("zoneinfo/")[2])
    except OSError:
        pass
    for name in filter(None, candidates):
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            continue
        return "UTC" if name in ("Etc/UTC", "UTC", "Universal", "Zulu", "Etc/Universal") else name
    return "local"
