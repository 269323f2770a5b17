"""Periodic tasks without ``celery beat``: the app's ``beat_schedule``, fired by the forwarders.

Each entry of ``app.conf.beat_schedule`` is **one store item**, id ``periodic:<name>``, due at
the entry's next period. Its envelope (kind ``celery-periodic``) holds the task message, built
once by Celery's own sender at sync time, and the schedule. When it comes due, a forwarder
claims it like any item; :class:`PeriodicTarget` publishes the period's run (a Celery message
with task id ``uuid5(name, period)``) through the Celery target, then **acks it and schedules
the next period in one script call** (``rearm.lua``), only while the claim's lease is still
ours. So any number of forwarders run active-active with no lock and no leader:

- each period's next run is written exactly once: a forwarder killed before the rearm leaves
  the item leased; when the lease runs out another forwarder fires it (and rearms), so no
  period is skipped; one killed after it has done its part;
- a kill between the publish and the rearm sends that period's run twice (at-least-once,
  like any item); both sends carry the same task id.

An entry's ``options={"delayq_overlap": "skip"}`` (or ``"buffer_one"``; ``"allow"`` by default)
keeps its runs from overlapping (:mod:`delayq_backends.overlap_policy`): each run carries the
entry's concurrency slot (header ``delayq_slot``, key ``periodic:<name>``, limit 1, held by the
worker while it runs under ``install(app)``), and a period whose previous run still holds it is
skipped and counted (``skipped`` in the entry's state), or under ``buffer_one`` waits as a
slotted task of its own (item id = the run's task id) while no other does.

``sync`` makes the store's code entries follow the config (``celery -A proj delayq forward``
syncs at start), under the rules of :func:`delayq_backends.periodic.ops.sync_code`: runtime
entries are never touched, an empty ``beat_schedule`` removes nothing, and with
``delayq_schedule_version`` an older deploy's schedule changes nothing. :func:`entry_spec` builds
an entry from the same definition for the runtime actions (:mod:`delayq_backends.periodic.ops`).
The firing itself is :mod:`delayq_backends.periodic.firing`'s; this module adds the Celery run
message (:class:`CeleryRuns`). An entry with ``BeatLazyFunc`` arguments has its run message
rebuilt per run, where the forwarder has the app (:mod:`.lazy`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from numbers import Real
from typing import Any

from celery import Celery
from kombu.utils.json import dumps as kombu_json_dumps

from ..envelope import Envelope
from ..errors import DelayqError
from ..overlap_policy import ALLOW, check_policy, overlap_slot
from ..periodic.firing import EntryWaits, FiringTarget, Run
from ..periodic.history import RUN_HEADER, RunMark
from ..periodic.ops import EntrySpec, RunTemplate, SyncReport, item_id, sync_code
from ..periodic.options import CELERY as CELERY_ENTRY
from ..periodic.options import OPTION_FIELDS, RunOptions
from ..periodic.registry import PeriodicError
from ..periodic.schedules import SCHEDULE_KINDS, Misfire, Schedule, run_task_id
from ..periodic.state import CODE, LAZY_META, META, RUNTIME, PeriodicState, state_of
from ..store import DelayStore
from ..targets import Delivery, Target
from ..timeutil import from_ms, parse_iso, to_ms
from ..tracing import FIELDS as TRACE_FIELDS
from .lazy import LazyArgs, allowed_functions, split_lazy
from .message import KIND as CELERY_KIND
from .message import StoredMessage, TaskView, priority_rank
from .schedules import from_celery
from .settings import schedule_version, store_for
from .slots import SLOT_HEADER
from .template import Capture

__all__ = [
    "ENTRY_OPTIONS",
    "KIND",
    "CeleryRuns",
    "PeriodicTarget",
    "entries_of",
    "entry_spec",
    "sync",
    "task_json",
    "task_of",
    "task_view",
    "zone_of",
]

log = logging.getLogger("delayq.celery.periodic")

#: ``Envelope.target`` of periodic entries: a forwarder without :class:`PeriodicTarget` (an older
#: version) leaves them alone and says so, instead of sending the template as a one-off task.
KIND = "celery-periodic"
#: ``beat_schedule`` entry keys we read (``relative`` as Celery's ``schedule(relative=True)``)
_ENTRY_KEYS = {"task", "schedule", "args", "kwargs", "options", "relative"}
#: ``apply_async`` options a periodic entry cannot have: each run is sent when due, on its own
#: the entry option naming its overlap policy (:mod:`delayq_backends.overlap_policy`)
OVERLAP_OPTION = "delayq_overlap"
#: the ``apply_async`` options of :data:`~delayq_backends.periodic.options.OPTION_FIELDS` (expires, priority,
#: headers, exchange, routing_key): checked, and kept in the entry's state to read back
RUN_OPTIONS = tuple(f.name for f in OPTION_FIELDS if f.kind == CELERY_ENTRY)
_REFUSED_OPTIONS = {"countdown", "eta", "task_id", "link", "link_error", "chain", "chord", "group_id", "producer"}


def _message_of(envelope: Envelope) -> StoredMessage:
    """The template message of a periodic envelope; EnvelopeError if it is none."""
    meta = {k: v for k, v in envelope.meta.items() if k not in (META, LAZY_META)}
    return StoredMessage.from_envelope(replace(envelope, target=CELERY_KIND, meta=meta))


def _decode(envelope: Envelope) -> tuple[StoredMessage, PeriodicState]:
    """The message and state of a periodic envelope; EnvelopeError if it is none."""
    return _message_of(envelope), state_of(envelope)


class CeleryRuns:
    """The run maker of ``celery-periodic`` entries (:class:`~delayq_backends.periodic.firing.RunMaker`).

    Args:
        app: the user's Celery app, to evaluate an entry's ``BeatLazyFunc`` arguments per run and
            build its message with them (:mod:`.lazy`); without it such an entry waits.
    """

    kind = KIND
    slot_run = 0  # a worker with install(app) names a run by its task id and retries

    def __init__(self, app: Celery | None = None) -> None:
        self.app = app
        self._allowed = allowed_functions(app) if app is not None else set()

    def template(self, envelope: Envelope) -> StoredMessage:
        return _message_of(envelope)

    def run(self, entry: Delivery, template: StoredMessage, state: PeriodicState, run: Run, now_ms: int) -> Delivery:
        """The delivery of one run of entry item ``entry``: id ``<item>#<task id>``; its message
        names its entry, period and kind (header ``delayq_periodic``, for the entry's history)
        and, with an overlap policy, the entry's concurrency slot for the worker to hold."""
        task_id = run.task_id(state.name)
        lazy = LazyArgs.of(entry.envelope)
        if lazy is not None:
            template = self._evaluated(state.name, lazy)
        headers: dict[str, Any] = {RUN_HEADER: RunMark(state.name, run.slot.at_ms, run.kind).header()}
        if state.overlap != ALLOW:
            headers[SLOT_HEADER] = {"key": overlap_slot(state.name).key, "limit": 1}
        message = _run_message(template, task_id, state.expires, now_ms, headers)
        return Delivery(f"{entry.id}#{task_id}", message.to_envelope(), entry.attempts, run.slot.at_ms)

    def _evaluated(self, name: str, lazy: LazyArgs) -> StoredMessage:
        """The message of one run of an entry with lazy arguments: evaluated now, and built by
        Celery's sender as the sync built its template.

        Raises:
            EntryWaits: no app here to evaluate them, or an evaluation failed.
        """
        if self.app is None:
            raise EntryWaits(
                f"entry {name!r} has arguments evaluated per run (BeatLazyFunc), and this forwarder has no Celery "
                "app to evaluate them (`delayq forward --celery-broker`); it never sends them unevaluated: run "
                "`celery -A proj delayq forward` to fire it"
            )
        args, kwargs = lazy.evaluate(self._allowed)
        return _message(self.app, lazy.task, args, kwargs, dict(lazy.options))[0]


def _run_message(
    message: StoredMessage, task_id: str, expires: float | None, now_ms: int, extra: Mapping[str, Any]
) -> StoredMessage:
    """The message of one run: its own task id (and root id: a run starts its own workflow, as a
    beat send does), ``expires`` counted from this send, and ``extra`` headers."""
    headers = {**message.headers, **extra, "id": task_id, "root_id": task_id}
    if expires is not None:
        headers["expires"] = (from_ms(now_ms) + timedelta(seconds=expires)).isoformat()
    return replace(message, headers=headers, properties={**message.properties, "correlation_id": task_id})


# -- entries of the app --------------------------------------------------------------------------


def entries_of(app: Celery) -> tuple[list[EntrySpec], dict[str, str]]:
    """The app's ``beat_schedule`` as code entries, and the ones that cannot be used (name → why)."""
    schedule = app.conf.beat_schedule or {}
    entries: list[EntrySpec] = []
    errors: dict[str, str] = {}
    for name, conf in schedule.items():
        try:
            entries.append(entry_spec(app, str(name), conf, source=CODE))
        except (DelayqError, ValueError, TypeError) as exc:
            errors[str(name)] = str(exc)
    return entries, errors


def zone_of(app: Celery) -> str:
    """The app's time zone, as its crontabs read it unless they name their own: ``timezone``,
    else UTC (``enable_utc``) or local."""
    name = app.conf.timezone
    if name:
        return str(name)
    return "UTC" if app.conf.enable_utc else "local"


def entry_spec(app: Celery, name: str, conf: Any, *, source: str = RUNTIME) -> EntrySpec:
    """An entry from a ``beat_schedule``-style definition: ``task``, ``schedule`` (seconds, a
    ``timedelta``, a Celery ``schedule``/``crontab``, or delayq's ``Every``/``Cron``/``Once``),
    ``args``, ``kwargs`` (``BeatLazyFunc`` values evaluated per run: :mod:`.lazy`), ``options``
    (``apply_async`` options, the misfire and overlap options, and the entry's own:
    :data:`ENTRY_OPTIONS`), ``relative``. The run message is built once, by Celery's own sender,
    with the app's routing.

    Raises:
        PeriodicError, ConfigError: naming what is wrong with the definition.
    """
    if not isinstance(conf, Mapping) or "task" not in conf or "schedule" not in conf:
        raise PeriodicError(f"entry {name!r}: use a dict with 'task' and 'schedule' (as celery beat reads it)")
    unknown = sorted(set(conf) - _ENTRY_KEYS)
    if unknown:
        raise PeriodicError(f"entry {name!r}: unknown key(s) {unknown}; known are {sorted(_ENTRY_KEYS)}")
    item_id(name)  # a name with control characters cannot make an id
    options = dict(conf.get("options") or {})
    run_options = _run_options(options)
    overlap = check_policy(name, options.pop(OVERLAP_OPTION, ALLOW))
    own = {key: options.pop(key) for key in ENTRY_OPTIONS if key in options}
    misfire = Misfire.from_options(options)
    for key in Misfire.OPTIONS:
        options.pop(key, None)
    refused = sorted(_REFUSED_OPTIONS & set(options))
    if refused:
        raise PeriodicError(f"entry {name!r}: option(s) {refused} cannot apply to a periodic run; remove them")
    task = str(conf["task"])
    args, kwargs, lazy = split_lazy(name, task, conf.get("args") or (), conf.get("kwargs") or {}, options)
    value = conf["schedule"]
    schedule = (
        value
        if isinstance(value, SCHEDULE_KINDS)
        else from_celery(value, zone=zone_of(app), relative=bool(conf.get("relative")))
    )
    message, expires = _message(app, task, args, kwargs, dict(options))
    driver = str(app.connection_for_write().transport.driver_type)  # no connection is made
    rank = priority_rank(message.properties.get("priority"), driver)
    fingerprint = _fingerprint(message, schedule, misfire, expires, rank, overlap, lazy)
    envelope = replace(message.to_envelope(), target=KIND)
    if lazy is not None:
        envelope = replace(envelope, meta={**envelope.meta, LAZY_META: lazy.encode()})
    template = RunTemplate(envelope, fingerprint, rank, expires)
    fields = _entry_fields(name, own)
    return EntrySpec(name, template, schedule, misfire, overlap, source, options=run_options, **fields)


def _run_options(options: Mapping[str, Any]) -> RunOptions:
    """The run options among an entry's ``apply_async`` options, kept to read back (an edit form,
    ``periodic show``). The CLI and the API checked them before; a ``beat_schedule`` may hold what
    Celery takes and the table does not (a kombu ``Exchange``, by its name here; headers kombu
    serializes but JSON does not): it is sent as Celery takes it, and read back as far as it can."""
    given = {k: options[k] for k in RUN_OPTIONS if k in options}
    if "exchange" in given:
        given["exchange"] = getattr(given["exchange"], "name", given["exchange"])
    try:
        return RunOptions.parse(given, CELERY_ENTRY)
    except PeriodicError:
        return RunOptions()


#: a beat_schedule entry's own options (each optional): when it may run, how often, how spread
ENTRY_OPTIONS = ("delayq_start", "delayq_end", "delayq_max_runs", "delayq_jitter", "delayq_enabled")


def _entry_fields(name: str, own: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`EntrySpec` fields of an entry's own options."""
    fields: dict[str, Any] = {}
    for key in ("delayq_start", "delayq_end"):
        if key in own:
            fields[key.removeprefix("delayq_") + "_ms"] = _time_ms(name, key, own[key])
    runs = own.get("delayq_max_runs")
    if runs is not None:
        if type(runs) is not int or runs < 1:
            raise PeriodicError(f"entry {name!r}: delayq_max_runs={runs!r}: use an int >= 1")
        fields["max_runs"] = runs
    jitter = own.get("delayq_jitter", 0)
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 86400:
        raise PeriodicError(f"entry {name!r}: delayq_jitter={jitter!r}: use seconds in 0..86400")
    fields["jitter_ms"] = round(jitter * 1000)
    enabled = own.get("delayq_enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise PeriodicError(f"entry {name!r}: delayq_enabled={enabled!r}: use True or False")
    fields["enabled"] = enabled
    return fields


def _time_ms(name: str, key: str, value: Any) -> int:
    """An entry's start or end: an aware datetime, an ISO 8601 time with its offset, or epoch seconds."""
    try:
        return to_ms(parse_iso(value) if isinstance(value, str) else value)
    except (DelayqError, ValueError) as exc:
        raise PeriodicError(f"entry {name!r}: {key}={value!r}: {exc}") from exc


def _message(
    app: Celery, task: str, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]
) -> tuple[StoredMessage, float | None]:
    """The task message as ``celery beat`` would send it (``app.send_task``, with the task's own
    options when it is registered here), captured from Celery's sender; and a relative
    ``expires`` in seconds, which each run counts from its own send."""
    registered = app.tasks.get(task)
    if registered is not None:
        defaults = {k: v for k, v in registered._get_exec_options().items() if v is not None}
        options = {**defaults, **options}
    expires = options.pop("expires", None)
    relative = float(expires) if isinstance(expires, Real) and not isinstance(expires, bool) else None
    headers = {**(options.pop("headers", None) or {}), "celery_beat_task": True}  # as beat marks its sends
    time_limit, soft_time_limit = options.pop("time_limit", None), options.pop("soft_time_limit", None)
    ignore_result, shadow = options.pop("ignore_result", None), options.pop("shadow", None)
    options = app.amqp.router.route(options, task, args, kwargs, registered)
    options["headers"] = headers
    message = app.amqp.create_task_message(
        str(_PLACEHOLDER_ID), task, args, kwargs,
        expires=expires, time_limit=time_limit, soft_time_limit=soft_time_limit, reply_to=app.thread_oid,
        shadow=shadow, ignore_result=ignore_result, **options,
    )  # fmt: skip
    capture = Capture()
    app.amqp.send_task_message(capture, task, message, **options)
    if capture.body is None:
        raise PeriodicError(f"task {task!r}: Celery's sender published nothing to capture")
    message = StoredMessage.capture(capture.body, capture.kwargs)
    # a run has no producer: a trace context captured here (Celery's instrumentation on during the
    # sync) would make every run of the entry continue the sync's trace; each run starts its own
    return replace(message, headers={k: v for k, v in message.headers.items() if k not in TRACE_FIELDS}), relative


#: the task id of the stored template; each run gets its own (:func:`run_task_id`)
_PLACEHOLDER_ID = "00000000-0000-0000-0000-000000000000"
#: headers and properties that differ between two builds of the same entry (host, process, send time)
_VOLATILE_HEADERS = {"id", "origin", "root_id", "parent_id"}
_VOLATILE_PROPERTIES = {"correlation_id", "reply_to"}


def _fingerprint(
    message: StoredMessage,
    schedule: Schedule,
    misfire: Misfire,
    expires: float | None,
    rank: int,
    overlap: str,
    lazy: LazyArgs | None = None,
) -> str:
    """A hash of everything that makes the entry's runs, so a sync can tell "unchanged"."""
    headers = {k: v for k, v in message.headers.items() if k not in _VOLATILE_HEADERS}
    if expires is not None:
        headers.pop("expires", None)
    what = {
        "body": message.body.hex(),
        "ct": message.content_type,
        "ce": message.content_encoding,
        "h": headers,
        "p": {k: v for k, v in message.properties.items() if k not in _VOLATILE_PROPERTIES},
        "x": message.exchange,
        "rk": message.routing_key,
        "q": message.declare,
        "s": schedule.to_json(),
        "m": misfire.to_json(),
        "e": expires,
        "r": rank,
        **({} if overlap == ALLOW else {"o": overlap}),  # an entry stored before overlap policies: unchanged
        **({} if lazy is None else {"l": lazy.encode()}),
    }
    return hashlib.sha1(kombu_json_dumps(what, sort_keys=True).encode()).hexdigest()[:16]


# -- sync ------------------------------------------------------------------------------------------


def sync(
    app: Celery,
    store: DelayStore | None = None,
    *,
    wait: float | None = None,
    version: int | None = None,
    sweep_seconds: float | None = None,
) -> SyncReport:
    """Make the store's code entries of kind ``celery-periodic`` those of ``app.conf.beat_schedule``
    (:func:`~delayq_backends.periodic.ops.sync_code`: runtime entries are never touched, an empty
    ``beat_schedule`` removes nothing, an older version changes nothing).

    Args:
        wait: seconds to wait for a forwarder that is firing a changed entry right now
            (default: the store's lease, after which a holder is presumed dead).
        version: the schedule's version; by default ``app.conf.delayq_schedule_version``.
        sweep_seconds: how long to sweep the registry for entries gone from the code (None:
            to the end; the rest is the report's ``sweep``).
    """
    store = store or store_for(app)
    if version is None:
        version = schedule_version(app)
    entries, errors = entries_of(app)
    return sync_code(
        store, entries, kind=KIND, errors=errors, version=version, wait=wait, sweep_seconds=sweep_seconds,
        version_setting="delayq_schedule_version (or --schedule-version)",
    )  # fmt: skip


def task_of(envelope: Envelope) -> str:
    """The task a stored entry runs, for listings."""
    return _message_of(envelope).task


def task_json(envelope: Envelope) -> dict[str, Any] | None:
    """:func:`task_view` as JSON values: how listings show Celery items (:mod:`delayq_backends.kinds`)."""
    view = task_view(envelope)
    return None if view is None else view.as_dict()


def task_view(envelope: Envelope) -> TaskView | None:
    """What a waiting Celery item will send, for ``delayq list|get`` and the dashboard's item view:
    a plain task as stored; a periodic entry as its next run (that run's task id, the entry's
    name in ``periodic``); None for items of other kinds.

    Raises:
        EnvelopeError: a Celery or periodic envelope that cannot be read.
    """
    if envelope.target == CELERY_KIND:
        return StoredMessage.from_envelope(envelope).view()
    if envelope.target != KIND:
        return None
    message, state = _decode(envelope)
    return replace(message.view(), id=run_task_id(state.name, state.slot), periodic=state.name)


# -- the forwarder's side ----------------------------------------------------------------------


class PeriodicTarget(FiringTarget):
    """Fires ``celery-periodic`` items (:class:`~delayq_backends.periodic.firing.FiringTarget`
    with :class:`CeleryRuns`): publishes each due period's run through ``inner``, the
    forwarder's Celery target.

    Args:
        inner: the target of kind ``celery`` that publishes the runs.
        app: the user's app, to evaluate ``BeatLazyFunc`` arguments per run (``celery -A proj
            delayq forward``); without it (``delayq forward --celery-broker``) such entries wait.
    """

    kind = KIND

    def __init__(
        self,
        inner: Target,
        *,
        app: Celery | None = None,
    ) -> None:
        if inner.kind != CELERY_KIND:
            raise ValueError(f"PeriodicTarget publishes through a {CELERY_KIND!r} target, not {inner.kind!r}")
        super().__init__(CeleryRuns(app), inner)
