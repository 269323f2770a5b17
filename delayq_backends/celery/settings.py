"""Celery's ``delayq_*`` settings, read in one place, and the delay store of an app.

Settings are lower-case like Celery's own::

    app.conf.delayq_url = "redis://127.0.0.1:6379/0"   # default: the broker URL if it is Redis
    app.conf.delayq_prefix = "delayq"
    app.conf.delayq_shards = 16
    app.conf.delayq_min_delay = 0       # seconds; a nearer eta is published directly
    app.conf.delayq_enabled = True
    app.conf.delayq_max_payload_bytes = 1024 * 1024   # a bigger task message is refused
    app.conf.delayq_max_queue_depth = {"celery": 10_000}  # forwarding pauses at this broker depth
    app.conf.delayq_rate_limits = {"celery": "500/s"}    # all forwarders together (N/s, N/m, N/h)
    app.conf.delayq_key_rate_limits = {"celery": "20/s"}  # each delayq_rate_key of the queue
    app.conf.delayq_durable_replicas = 0  # > 0: each delayed send waits (WAIT) until replicas have it
    app.conf.delayq_durable_timeout_ms = 1000
    app.conf.delayq_duplicate_id = "replace"  # a second send of a waiting task id: replace|keep|error
    app.conf.delayq_dedupe = False      # True: workers drop a second delivery of a started run
    app.conf.delayq_dedupe_ttl = 86400  # seconds a run's "started" record is kept
    app.conf.delayq_lossless = False    # True (needs delayq_dedupe): forwarders keep a published task
    app.conf.delayq_lossless_window = 60  # ... and publish it again if no start is recorded by then
    app.conf.delayq_slot_limits = {"customer-*": 2}  # a delayq_slot with no limit of its own: the first match's
    app.conf.delayq_slot_hold = 60      # seconds a worker's slot hold lasts after its last heartbeat
    app.conf.delayq_worker_beat = 5     # seconds between worker beats: a worker that missed two is dead
    app.conf.delayq_group_policies = {"tenant-*": {"limit": 2, "rate": "10/s"}}  # groups by pattern
    app.conf.delayq_schedule_version = 1234  # grows per deploy: an older beat_schedule never rolls a newer back

``delayq_duplicate_id`` decides what a second ``apply_async`` with the id of a task still waiting
in the store does. Native Celery would run both sends (two runs sharing one result). ``replace``
(the default) makes the second send win, as a reschedule: it is what the plugin always did, so a
store in use keeps its meaning, and a send repeated after a timeout (which may have been stored)
stays harmless. ``keep`` lets the first win (an idempotent "schedule once" per id); ``error``
refuses the second send with :class:`DuplicateTaskIdError` and keeps the first.

``delayq_dedupe`` and ``delayq_dedupe_ttl`` are read by workers: see
:mod:`delayq_backends.celery.dedupe` (set them before :func:`~delayq_backends.celery.install`).

``delayq_lossless`` and ``delayq_lossless_window`` are read by ``celery -A proj delayq forward``
(its ``--lossless`` / ``--lossless-window`` options win): lossless mode, see the README.

``delayq_slot_limits`` (glob pattern -> limit, first match wins) gives a task's ``delayq_slot``
that names no limit the limit of its key's pattern, at send (see
:mod:`delayq_backends.celery.slots`); a limit set at runtime (``set_slot_limit``) wins over both.

``delayq_group_policies`` (glob pattern -> ``{"limit", "rate", "weight"}``; for each value the
first pattern that sets it) is the policy of the groups matching it where neither the group's
runtime policy (``DelayStore.set_group``) nor the item sets one (see
:mod:`delayq_backends.group_policies`): read by ``celery -A proj delayq forward``, whose
``--group-policy`` options (and ``DELAYQ_GROUP_POLICIES``) go first.

``delayq_max_queue_depth``, ``delayq_rate_limits`` and ``delayq_key_rate_limits`` are read by
``celery -A proj delayq forward``; its ``--max-queue-depth``, ``--rate`` and ``--key-rate``
options win for the queues they name.

A wrong value fails loudly at first use, naming the setting: a silent fallback would bring
back worker-side ETAs, the very thing the plugin removes.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
from dataclasses import dataclass, replace
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery

from ..config import Config
from ..connection import connect, redact_url
from ..envelope import Slot
from ..errors import ConfigError, DelayqError, InvalidSlotError
from ..flow import FlowControl
from ..forwarder.settings import LOSSLESS_WINDOW
from ..group_policies import GroupPolicies
from ..periodic.registry import check_version
from ..store import RUN_HOLD_MS, DelayStore
from ..storecache import StoreCache

__all__ = [
    "DEFAULT_DEDUPE_TTL",
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


_KNOWN = {
    "delayq_url",
    "delayq_prefix",
    "delayq_shards",
    "delayq_min_delay",
    "delayq_enabled",
    "delayq_max_payload_bytes",
    "delayq_max_queue_depth",
    "delayq_rate_limits",
    "delayq_key_rate_limits",
    "delayq_durable_replicas",
    "delayq_durable_timeout_ms",
    "delayq_lazy_functions",
    "delayq_duplicate_id",
    "delayq_dedupe",
    "delayq_dedupe_ttl",
    "delayq_lossless",
    "delayq_lossless_window",
    "delayq_slot_limits",
    "delayq_slot_hold",
    "delayq_worker_beat",
    "delayq_group_policies",
    "delayq_schedule_version",
}
DUPLICATE_ID_MODES = ("replace", "keep", "error")
#: A run's "started" record outlives any plausible re-delivery: a forwarder's lease (30 s by
#: default) plus the time the duplicate then waits in the broker's queue behind a backlog.
DEFAULT_DEDUPE_TTL = 86400
_MAX_DEDUPE_TTL = 366 * 86400
_REDIS_SCHEMES = ("redis://", "rediss://", "valkey://", "valkeys://", "unix://")


@dataclass(frozen=True)
class CelerySettings:
    """The plugin's settings of one Celery app."""

    config: Config
    min_delay: float
    enabled: bool
    flow: FlowControl
    duplicate_id: str = "replace"
    dedupe: bool = False
    dedupe_ttl_ms: int = DEFAULT_DEDUPE_TTL * 1000
    #: lossless mode's window in seconds (None: off)
    lossless_window: float | None = None
    #: (glob pattern, limit) of ``delayq_slot_limits``, in their order
    slot_limits: tuple[tuple[str, int], ...] = ()
    #: how long a worker's slot hold lasts after the task's start or its last heartbeat
    slot_hold_ms: int = RUN_HOLD_MS
    #: seconds between a worker's beats (:mod:`~delayq_backends.celery.watch`)
    worker_beat_s: float = 5

    @classmethod
    def of(cls, app: Celery) -> CelerySettings:
        """Read and check ``app.conf.delayq_*``.

        Raises:
            ConfigError: an unknown ``delayq_*`` name, a bad value, or no Redis to use.
        """
        conf = app.conf
        unknown = sorted(k for k in conf if isinstance(k, str) and k.startswith("delayq_") and k not in _KNOWN)
        if unknown:
            raise ConfigError(_unknown_settings(unknown))
        if conf.get("task_protocol", 2) != 2:
            raise ConfigError(
                f"task_protocol={conf.get('task_protocol')}: delayq needs Celery's message protocol 2 "
                "(the default since Celery 4): remove the task_protocol setting"
            )
        min_delay = conf.get("delayq_min_delay", 0)
        if isinstance(min_delay, bool) or not isinstance(min_delay, (int, float)) or not math.isfinite(min_delay):
            raise ConfigError(f"delayq_min_delay={min_delay!r}: use a number of seconds >= 0")
        if min_delay < 0:
            raise ConfigError(f"delayq_min_delay={min_delay!r}: use a number of seconds >= 0")
        enabled = conf.get("delayq_enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"delayq_enabled={enabled!r}: use True or False")
        duplicate_id = conf.get("delayq_duplicate_id", "replace")
        if duplicate_id not in DUPLICATE_ID_MODES:
            raise ConfigError(f"delayq_duplicate_id={duplicate_id!r}: use one of {list(DUPLICATE_ID_MODES)}")
        dedupe = conf.get("delayq_dedupe", False)
        if not isinstance(dedupe, bool):
            raise ConfigError(f"delayq_dedupe={dedupe!r}: use True or False")
        dedupe_ttl = conf.get("delayq_dedupe_ttl", DEFAULT_DEDUPE_TTL)
        ttl_is_number = isinstance(dedupe_ttl, (int, float)) and not isinstance(dedupe_ttl, bool)
        if not ttl_is_number or not 1 <= dedupe_ttl <= _MAX_DEDUPE_TTL:
            raise ConfigError(
                f"delayq_dedupe_ttl={dedupe_ttl!r}: use seconds between 1 and {_MAX_DEDUPE_TTL}, longer than a "
                "duplicate can take to arrive (a forwarder's lease plus the broker's backlog)"
            )
        lossless_window = _lossless_window(conf, dedupe, dedupe_ttl)
        attached = _attached.get(app)
        try:
            config = (
                attached.config
                if attached is not None
                else Config(
                    url=_store_url(app),
                    prefix=conf.get("delayq_prefix", "delayq"),
                    shards=conf.get("delayq_shards", 16),
                    max_payload_bytes=conf.get("delayq_max_payload_bytes", Config.max_payload_bytes),
                    durable_replicas=conf.get("delayq_durable_replicas", Config.durable_replicas),
                    durable_timeout_ms=conf.get("delayq_durable_timeout_ms", Config.durable_timeout_ms),
                    group_policies=GroupPolicies.from_mapping(
                        conf.get("delayq_group_policies") or {}, source="delayq_group_policies"
                    ),
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"Celery setting delayq_*: {exc}") from exc
        try:
            flow = FlowControl.from_mappings(
                conf.get("delayq_max_queue_depth") or {},
                conf.get("delayq_rate_limits") or {},
                conf.get("delayq_key_rate_limits") or {},
            )
        except ConfigError as exc:
            raise ConfigError(
                f"Celery setting delayq_max_queue_depth / delayq_rate_limits / delayq_key_rate_limits: {exc}"
            ) from exc
        return cls(
            config=config,
            min_delay=float(min_delay),
            enabled=enabled,
            flow=flow,
            duplicate_id=duplicate_id,
            dedupe=dedupe,
            dedupe_ttl_ms=int(dedupe_ttl * 1000),
            lossless_window=lossless_window,
            slot_limits=_slot_limits(conf.get("delayq_slot_limits") or {}),
            slot_hold_ms=_slot_hold_ms(conf.get("delayq_slot_hold", RUN_HOLD_MS // 1000)),
            worker_beat_s=_worker_beat(conf.get("delayq_worker_beat", 5)),
        )

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
    known = {name.removeprefix("delayq_"): name for name in _KNOWN}
    guesses = {name: difflib.get_close_matches(name.removeprefix("delayq_"), known, n=1) for name in unknown}
    named = ", ".join(f"{n} (did you mean {known[g[0]]}?)" if g else n for n, g in guesses.items())
    if all(guesses.values()):
        return f"unknown Celery setting(s): {named}"
    return f"unknown Celery setting(s): {named}; the delayq settings are {sorted(_KNOWN)}"


def _slot_hold_ms(seconds: Any) -> int:
    """``delayq_slot_hold`` checked, in ms."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 1 <= seconds <= 3600:
        raise ConfigError(
            f"delayq_slot_hold={seconds!r}: use seconds between 1 and 3600: how long a killed worker's slots "
            "stay taken (a heartbeat renews a running task's every third of it)"
        )
    return int(seconds * 1000)


def _worker_beat(seconds: Any) -> float:
    """``delayq_worker_beat`` checked."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0.5 <= seconds <= 300:
        raise ConfigError(
            f"delayq_worker_beat={seconds!r}: use seconds between 0.5 and 300: how often a worker beats (on a "
            "Redis broker a worker that missed two beats is dead and its unacknowledged tasks go back)"
        )
    return float(seconds)


def _slot_limits(value: Any) -> tuple[tuple[str, int], ...]:
    """``delayq_slot_limits`` checked: a dict of glob pattern -> limit."""
    try:
        if not isinstance(value, dict):
            raise InvalidSlotError(f"{value!r} is no dict")
        return tuple((pattern, Slot.parse({"key": pattern, "limit": n}).limit or 0) for pattern, n in value.items())
    except InvalidSlotError as exc:
        raise ConfigError(
            f"Celery setting delayq_slot_limits: {exc}; use a dict of key pattern (glob) -> limit, e.g. "
            "{'customer-*': 2}"
        ) from exc


def _lossless_window(conf: Any, dedupe: bool, dedupe_ttl: float) -> float | None:
    """``delayq_lossless_window`` if ``delayq_lossless`` is on, checked against dedupe, else None."""
    lossless = conf.get("delayq_lossless", False)
    if not isinstance(lossless, bool):
        raise ConfigError(f"delayq_lossless={lossless!r}: use True or False")
    window = conf.get("delayq_lossless_window", LOSSLESS_WINDOW.default)
    if isinstance(window, bool) or not isinstance(window, (int, float)):
        raise ConfigError(f"delayq_lossless_window={window!r}: use seconds from {LOSSLESS_WINDOW.low:g} to "
                          f"{LOSSLESS_WINDOW.high:g}")  # fmt: skip
    LOSSLESS_WINDOW.check("delayq_lossless_window", window)
    if not lossless:
        return None
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
    return float(window)


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
