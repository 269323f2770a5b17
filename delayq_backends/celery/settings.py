"""Celery's ``delayq_*`` settings, read in one place, and the delay store of an app.

Settings are lower-case like Celery's own (``app.conf.delayq_url = "redis://..."``); each is a
:class:`~delayq_backends.config.Setting` of the record it configures: the store's
:class:`~delayq_backends.config.Config`, the forwarder's settings and flow control (read by
``celery -A proj delayq forward``, whose flags win), and :class:`CelerySettings` for the
plugin's own. docs/configuration.md lists them all, generated from those records.

``delayq_duplicate_id`` decides what a second ``apply_async`` with the id of a task still waiting
in the store does. Native Celery would run both sends (two runs sharing one result). ``replace``
(the default) makes the second send win, as a reschedule: it is what the plugin always did, so a
store in use keeps its meaning, and a send repeated after a timeout (which may have been stored)
stays harmless. ``keep`` lets the first win (an idempotent "schedule once" per id); ``error``
refuses the second send with :class:`DuplicateTaskIdError` and keeps the first.

``delayq_dedupe`` and ``delayq_dedupe_ttl`` are read by workers (:mod:`.dedupe`; set them before
:func:`~delayq_backends.celery.install`), ``delayq_slot_limits`` at send (:mod:`.slots`).

A wrong value fails loudly at first use, naming the setting: a silent fallback would bring
back worker-side ETAs, the very thing the plugin removes.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, replace
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery

from ..config import Config, Setting, check_settings, setting, settings_of
from ..connection import connect, redact_url
from ..envelope import Slot
from ..errors import ConfigError, DelayqError, InvalidSlotError
from ..flow import FlowControl
from ..forwarder.settings import LOSSLESS, LOSSLESS_WINDOW, ForwarderSettings
from ..periodic.registry import check_version
from ..store import RUN_HOLD_MS, DelayStore
from ..storecache import StoreCache

__all__ = [
    "DEFAULT_DEDUPE_TTL",
    "KNOWN",
    "LAZY_FUNCTIONS",
    "SCHEDULE_VERSION",
    "SETTINGS",
    "CelerySettings",
    "DuplicateTaskIdError",
    "StoreUnavailableError",
    "attach_store",
    "attached_store",
    "detach_store",
    "forget_store",
    "store_for",
]


class StoreUnavailableError(DelayqError):
    """The delay store could not be reached: what the message names was not done there."""


class DuplicateTaskIdError(DelayqError):
    """``delayq_duplicate_id = "error"`` and a task with this id already waits in the store."""


DUPLICATE_ID_MODES = ("replace", "keep", "error")
#: A run's "started" record outlives any plausible re-delivery: a forwarder's lease (30 s by
#: default) plus the time the duplicate then waits in the broker's queue behind a backlog.
DEFAULT_DEDUPE_TTL = 86400
_REDIS_SCHEMES = ("redis://", "rediss://", "valkey://", "valkeys://", "unix://")


def _slot_limits(value: Any, label: str) -> tuple[tuple[str, int], ...]:
    """``delayq_slot_limits`` checked: a dict of glob pattern -> limit (or those pairs, once checked)."""
    if isinstance(value, tuple):
        return value
    try:
        if not isinstance(value, dict):
            raise InvalidSlotError(f"{value!r} is no dict")
        return tuple((pattern, Slot.parse({"key": pattern, "limit": n}).limit or 0) for pattern, n in value.items())
    except InvalidSlotError as exc:
        raise ConfigError(
            f"Celery setting delayq_slot_limits: {exc}; use a dict of key pattern (glob) -> limit, e.g. "
            "{'customer-*': 2}"
        ) from exc


@dataclass(frozen=True)
class CelerySettings:
    """The plugin's settings of one Celery app: the store's, those of ``celery -A proj delayq
    forward``'s forwarder (flow control, lossless mode), and the plugin's own below."""

    # fmt: off
    # (a table: one setting per entry)
    config: Config
    forwarder: ForwarderSettings = ForwarderSettings()
    min_delay: float = setting(0.0, "Seconds; a nearer eta is published directly.", low=0, celery="delayq_min_delay")
    enabled: bool = setting(True, "False: the plugin publishes as Celery does.", celery="delayq_enabled")
    duplicate_id: str = setting("replace", "What a second send of a task id still waiting in the store does: "
        "replace it, keep the first, or raise DuplicateTaskIdError.", choices=DUPLICATE_ID_MODES,
        celery="delayq_duplicate_id")
    dedupe: bool = setting(False, "Workers drop a second delivery of a task run that already started (docs/dedupe.md).",
        celery="delayq_dedupe")
    dedupe_ttl: float = setting(float(DEFAULT_DEDUPE_TTL), "Seconds a run's started record is kept: longer than a "
        "duplicate can take to arrive (a forwarder's lease plus the broker's backlog).", low=1, high=366 * 86400,
        celery="delayq_dedupe_ttl", envvar="DELAYQ_DEDUPE_TTL")
    slot_limits: tuple[tuple[str, int], ...] = setting((),
        "Key pattern (glob) -> limit: a delayq_slot header naming no limit takes the first matching pattern's; "
        "a limit set at runtime wins (docs/slots.md).", celery="delayq_slot_limits", parse=_slot_limits)
    slot_hold: float = setting(RUN_HOLD_MS / 1000, "Seconds a worker's slot hold lasts after the task's start or "
        "last heartbeat (renewed every third of it): what a worker killed mid-task costs.", low=1, high=3600,
        celery="delayq_slot_hold", envvar="DELAYQ_SLOT_HOLD")
    worker_beat: float = setting(5.0, "Seconds between a worker's beats: on a Redis broker a worker that missed two "
        "is dead and its unacknowledged tasks go back.", low=0.5, high=300, celery="delayq_worker_beat")
    # fmt: on

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def dedupe_ttl_ms(self) -> int:
        return int(self.dedupe_ttl * 1000)

    @property
    def slot_hold_ms(self) -> int:
        return int(self.slot_hold * 1000)

    @property
    def worker_beat_s(self) -> float:
        return self.worker_beat

    @classmethod
    def of(cls, app: Celery) -> CelerySettings:
        """Read and check ``app.conf.delayq_*``.

        Raises:
            ConfigError: an unknown ``delayq_*`` name, a bad value, or no Redis to use.
        """
        conf = app.conf
        unknown = sorted(k for k in conf if isinstance(k, str) and k.startswith("delayq_") and k not in KNOWN)
        if unknown:
            raise ConfigError(_unknown_settings(unknown))
        if conf.get("task_protocol", 2) != 2:
            raise ConfigError(
                f"task_protocol={conf.get('task_protocol')}: delayq needs Celery's message protocol 2 "
                "(the default since Celery 4): remove the task_protocol setting"
            )
        own = {s.name: s.check(_get(conf, s), s.celery) for s in settings_of(cls)}
        attached = _attached.get(app)
        config = attached.config if attached is not None else _config(app)
        return cls(config, _forwarder(conf, own["dedupe"], own["dedupe_ttl"]), **own)

    def slot(self, value: Any) -> Slot:
        """The slot of a ``delayq_slot`` header: its own limit, else that of the first pattern of
        ``delayq_slot_limits`` its key matches, else none.

        Raises:
            InvalidSlotError: the header is no slot.
        """
        slot = Slot.parse(value)
        if slot.limit is not None:
            return slot
        limit = next((n for pattern, n in self.slot_limits if fnmatch.fnmatchcase(slot.key, pattern)), None)
        return slot if limit is None else replace(slot, limit=limit)


#: read where they are used (:mod:`.lazy`, :func:`schedule_version`), so no field holds them
LAZY_FUNCTIONS = Setting(
    "`module:qualname` paths of the functions a beat_schedule's lazy values may call.",
    (),
    celery="delayq_lazy_functions",
    name="lazy_functions",
)
SCHEDULE_VERSION = Setting(
    "Grows per deploy: an older beat_schedule never rolls a newer back.",
    None,
    kind=int,
    flag="--schedule-version",
    envvar="DELAYQ_SCHEDULE_VERSION",
    celery="delayq_schedule_version",
    shown="unversioned",
    name="schedule_version",
)

#: every Celery setting: those of the records it configures, and its own
SETTINGS = (*settings_of(Config), *settings_of(ForwarderSettings), LOSSLESS, *settings_of(FlowControl),
            *settings_of(CelerySettings), LAZY_FUNCTIONS, SCHEDULE_VERSION)  # fmt: skip
KNOWN = frozenset(s.celery for s in SETTINGS if s.celery)


def _get(conf: Any, s: Setting) -> Any:
    """The app's value of ``s``, its default when unset (or None)."""
    value = conf.get(s.celery)
    return s.default if value is None else value


def _config(app: Celery) -> Config:
    """The store's settings of the app."""
    try:
        values = {s.name: s.check(_get(app.conf, s), s.celery) for s in settings_of(Config) if s.celery}
        return Config(**{**values, "url": _store_url(app)})
    except ConfigError as exc:
        raise ConfigError(f"Celery setting delayq_*: {exc}") from exc


def _forwarder(conf: Any, dedupe: bool, dedupe_ttl: float) -> ForwarderSettings:
    """The app's flow control and lossless mode, checked against dedupe."""
    flow = settings_of(FlowControl)
    try:
        limits = FlowControl.from_mappings(*(_get(conf, s) for s in flow))
    except ConfigError as exc:
        raise ConfigError(f"Celery setting {' / '.join(str(s.celery) for s in flow)}: {exc}") from exc
    lossless = LOSSLESS.check(_get(conf, LOSSLESS), LOSSLESS.celery)
    [window_setting] = (s for s in settings_of(ForwarderSettings) if s.name == "lossless_window")
    window = window_setting.check(_get(conf, replace(window_setting, default=LOSSLESS_WINDOW)), window_setting.celery)
    if not lossless:
        return ForwarderSettings(flow=limits)
    if not dedupe:
        raise ConfigError(
            "delayq_lossless=True needs delayq_dedupe=True: lossless mode publishes a task again when no worker "
            "recorded its start, and only workers with dedupe record it (without, every task would run again "
            "after each window)"
        )
    if window >= dedupe_ttl:
        raise ConfigError(
            f"delayq_lossless_window={window!r} must be shorter than delayq_dedupe_ttl={dedupe_ttl!r}: a start "
            "record that expired before the forwarder looks reads as never started, and the task would run again"
        )
    return ForwarderSettings(flow=limits, lossless_window=float(window))


def schedule_version(app: Celery) -> int | None:
    """``app.conf.delayq_schedule_version``: the version of its ``beat_schedule``, which grows per
    deploy, so an older one never rolls a newer back (None: unversioned).

    Raises:
        ConfigError: not a whole number in range.
    """
    try:
        return check_version(app.conf.get("delayq_schedule_version"))
    except DelayqError as exc:
        raise ConfigError(f"delayq_schedule_version: {exc}") from exc


def _unknown_settings(unknown: list[str]) -> str:
    """Name each unknown ``delayq_*`` setting with its likeliest meant name (a typo is the usual
    cause); the whole list only when no name is close."""
    # compared without the shared "delayq_", which would make every name look close
    known = {name.removeprefix("delayq_"): name for name in KNOWN}
    guesses = {name: difflib.get_close_matches(name.removeprefix("delayq_"), known, n=1) for name in unknown}
    named = ", ".join(f"{n} (did you mean {known[g[0]]}?)" if g else n for n, g in guesses.items())
    if all(guesses.values()):
        return f"unknown Celery setting(s): {named}"
    return f"unknown Celery setting(s): {named}; the delayq settings are {sorted(KNOWN)}"


def _store_url(app: Celery) -> str:
    url = app.conf.get("delayq_url")
    if url:
        if not isinstance(url, str):
            raise ConfigError(f"delayq_url={url!r}: use a redis:// or rediss:// URL")
        return url
    broker = app.conf.broker_write_url or app.conf.broker_url
    first = broker.split(";")[0].strip() if isinstance(broker, str) else ""
    if first.startswith(_REDIS_SCHEMES):
        return first
    raise ConfigError(
        f"set delayq_url: the broker ({redact_url(first) if first else 'not set'}) is not Redis, so "
        "delayq needs the URL of a Redis/Valkey to keep delayed tasks in, e.g. "
        "app.conf.delayq_url = 'redis://127.0.0.1:6379/0'"
    )


_stores: StoreCache[Celery] = StoreCache(weak=True)
#: stores given to an app by :func:`attach_store` (tests): no ``delayq_url`` is needed then
_attached: WeakKeyDictionary[Celery, DelayStore] = WeakKeyDictionary()


def attach_store(app: Celery, store: DelayStore) -> None:
    """Make ``store`` the app's delay store (an in-process one in tests, see
    :mod:`delayq_backends.celery.testing`), whatever ``delayq_url`` says or whether it is set."""
    forget_store(app)
    with _stores.lock:
        _attached[app] = store
        _stores.put(app, store)
    app.amqp.__dict__.pop("delayq_settings", None)  # re-read: the store's config replaces delayq_url


def detach_store(app: Celery) -> None:
    """Undo :func:`attach_store`: the app's settings decide its store again."""
    with _stores.lock:
        store = _attached.pop(app, None)
        if store is not None and _stores.peek(app) is store:
            _stores.pop(app)
    app.amqp.__dict__.pop("delayq_settings", None)


def attached_store(app: Celery) -> DelayStore | None:
    """The store :func:`attach_store` gave ``app``, or None."""
    return _attached.get(app)


def store_for(app: Celery, settings: CelerySettings | None = None) -> DelayStore:
    """The app's delay store, opened and checked on first use and shared afterwards.

    Raises:
        ConfigError: the store is unreachable or its shard count differs (names the setting).
    """
    return _stores.get(app, lambda: _open((settings or CelerySettings.of(app)).config))


def _open(config: Config) -> DelayStore:
    try:
        store = DelayStore(connect(config.url), config)
        store.check_meta()
    except DelayqError as exc:
        raise type(exc)(f"delayq_url={redact_url(config.url)!r}, delayq_prefix={config.prefix!r}: {exc}") from exc
    except Exception as exc:  # a Redis error at first contact: say which setting to fix
        raise ConfigError(f"delayq_url={redact_url(config.url)!r} cannot be used: {exc}") from exc
    return store


def forget_store(app: Celery) -> None:
    """Drop the cached store (after changing ``delayq_*`` settings at run time, e.g. in tests)."""
    with _stores.lock:
        if app in _attached:
            return  # a test's store stays until detach_store
        store = _stores.pop(app)
    if store is not None:
        store.close()
