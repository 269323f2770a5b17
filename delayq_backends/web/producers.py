"""Scheduling for producers that are not Python: a Celery task by name, an RQ job by function path.

Both store exactly what the Python adapters store, so forwarders and workers cannot tell an item
scheduled over HTTP from one scheduled by ``apply_async(eta=…)`` or ``Queue.enqueue_at``:
Celery messages are built by :class:`~delayq_backends.celery.template.TaskTemplate` (Celery's own
task sender, run once per task and options) and RQ jobs are saved by
:meth:`delayq_backends.rq.Queue.schedule_job` (RQ's own job hash). Neither imports user code.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from ..errors import ConfigError, DelayqError, install_hint
from ..keys import normalize_id
from ..models import ScheduleItem
from ..periodic.ops import EntrySpec
from ..periodic.options import RunOptions
from ..periodic.schedules import Misfire, Schedule
from ..periodic.state import RUNTIME
from ..store import DelayStore
from ..timeutil import from_ms

__all__ = [
    "CeleryProducer",
    "FunctionAllowlist",
    "FunctionRefused",
    "ProducerUnavailable",
    "RQProducer",
    "ScheduleResult",
]

#: What scheduling an id did: a new item, one replaced, or one kept as it was (``mode="keep"``).
ScheduleResult = Literal["added", "replaced", "kept"]

#: Task templates kept per (task, options): each costs one run of Celery's sender to build.
TEMPLATE_CACHE = 256


class ProducerUnavailable(DelayqError):
    """This server cannot schedule for that framework (extra not installed, no RQ Redis)."""


class FunctionRefused(DelayqError):
    """An RQ function the operator did not allow (``delayq dashboard --rq-allow``)."""


#: A dotted Python path: identifiers joined by dots.
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class FunctionAllowlist:
    """The RQ functions ``POST /api/v1/rq`` may schedule: whoever holds the API token chooses the
    function an RQ worker imports and calls, so without a list that is code execution on the
    workers (``os.system``, ``builtins.eval``). Empty, nothing is allowed.

    Each entry is a module path (``app.tasks``, a trailing dot is allowed) or one function's path.
    A function is allowed when it is an entry, or an entry followed by **one** more component that
    does not start with ``_``: ``app.tasks`` allows ``app.tasks.send`` but neither
    ``app.tasksevil.x`` (components are matched whole) nor ``app.tasks.os.system`` (RQ resolves
    the path attribute by attribute, so that would reach ``os.system`` through an ``import os``
    in ``app.tasks``). Functions of a sub-module need the sub-module's own entry. What a module
    imports by name (``from os import system``) is reachable as its attribute: allow modules
    that hold only job functions.
    """

    entries: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> FunctionAllowlist:
        """Raises ConfigError for an entry that is not a dotted path."""
        parsed = []
        for entry in entries:
            path = entry.strip().rstrip(".")
            if not DOTTED.fullmatch(path):
                raise ConfigError(
                    f"--rq-allow {entry!r} is not a module or function path: name one like app.tasks "
                    "(its functions) or app.tasks.send (one function)"
                )
            parsed.append(path)
        return cls(tuple(parsed))

    def allows(self, func: str) -> bool:
        for entry in self.entries:
            if func == entry:
                return True
            if func.startswith(entry + "."):
                rest = func[len(entry) + 1 :]
                if "." not in rest and not rest.startswith("_"):
                    return True
        return False

    def check(self, func: str) -> None:
        """Raises FunctionRefused, saying how to allow ``func``."""
        if self.allows(func):
            return
        if not self.entries:
            raise FunctionRefused(
                f"scheduling RQ jobs over HTTP is off: the token would let its holder run any function "
                f"({func!r}) on the workers; start `delayq dashboard` with --rq-allow MODULE "
                "(e.g. --rq-allow app.tasks, repeatable, or DELAYQ_RQ_ALLOW) to allow that module's functions"
            )
        raise FunctionRefused(
            f"RQ function {func!r} is not allowed (allowed: {', '.join(self.entries)} and their functions); "
            f"add its module with `delayq dashboard --rq-allow {func.rpartition('.')[0]}` if workers may run it"
        )


class CeleryProducer:
    """Stores Celery task messages as the Celery adapter stores an ``apply_async`` with an eta.

    Task names need no allowlist: a Celery worker runs only the tasks its app registered and
    rejects any other name, so the token lets its holder call registered tasks with arguments of
    its choice, nothing else. (RQ workers import whatever path a job names; see
    :class:`FunctionAllowlist`.)

    Args:
        store: where the messages wait.
        broker_url: the workers' broker; with the app's defaults it decides the routing
            (exchange, routing key, queue declarations) the message is stored with.

    Raises:
        ProducerUnavailable: Celery is not installed.
    """

    def __init__(self, store: DelayStore, broker_url: str | None = None) -> None:
        try:
            from celery import Celery

            from ..celery.periodic import entry_spec
            from ..celery.template import TaskTemplate
        except ImportError as exc:
            raise ProducerUnavailable(
                f"scheduling Celery tasks needs Celery where the dashboard runs ({exc}): {install_hint('celery')}"
            ) from exc
        self.store = store
        self.app = Celery("delayq-web", set_as_current=False)
        if broker_url:
            self.app.conf.broker_url = broker_url
        self._template_class = TaskTemplate
        self._entry_spec = entry_spec
        self._templates: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def _template(self, task: str, options: Mapping[str, Any]) -> Any:
        key = json.dumps([task, options], sort_keys=True)
        with self._lock:  # Celery's sender is not meant to run in many threads at once
            template = self._templates.get(key)
            if template is None:
                template = self._templates[key] = self._template_class(self.app, task, **options)
                if len(self._templates) > TEMPLATE_CACHE:
                    self._templates.popitem(last=False)
            else:
                self._templates.move_to_end(key)
        return template

    def schedule(
        self,
        task: str,
        item_id: str,
        ready_ms: int,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        options: Mapping[str, Any],
        mode: str = "replace",
    ) -> ScheduleResult:
        """Store one call of ``task``; returns ``added``, ``replaced`` or ``kept``.

        Args:
            options: ``apply_async`` routing options (``queue``, ``routing_key``, ``exchange``,
                ``priority``); None values are left out.
        """
        item_id = normalize_id(item_id)
        chosen = {k: v for k, v in options.items() if v is not None}
        envelope = self._template(task, chosen).envelope(item_id, ready_ms, list(args), dict(kwargs))
        counts = self.store.schedule_checked(
            [ScheduleItem(item_id, ready_ms, self.store.check_payload(item_id, envelope))], mode=mode
        )
        return "added" if counts.added else "replaced" if counts.replaced else "kept"

    def entry(self, name: str, conf: Mapping[str, Any]) -> EntrySpec:
        """A runtime periodic entry of ``conf`` (a ``beat_schedule`` entry), its run message built
        by Celery's sender with this server's routing, as ``celery -A proj delayq periodic add``
        builds one with the app's.

        Raises:
            PeriodicError, ConfigError: naming what is wrong with the definition.
        """
        with self._lock:  # Celery's sender is not meant to run in many threads at once
            spec: EntrySpec = self._entry_spec(self.app, name, conf, source=RUNTIME)
        return spec

    def close(self) -> None:
        self.app.close()


class RQProducer:
    """Saves RQ jobs and schedules their ids as ``delayq_backends.rq.Queue.enqueue_at`` does.

    Args:
        store: the delay store; when it is on ``connection``'s server, the job hash and the store
            entry are written in one transaction.
        connection: RQ's Redis (a single server, not a cluster).
        allowed: the functions it may schedule; any other is refused before anything is written.

    Raises:
        ProducerUnavailable: RQ is not installed.
    """

    def __init__(self, store: DelayStore, connection: redis.Redis, allowed: FunctionAllowlist) -> None:
        try:
            from rq.job import JobStatus

            from ..rq import Queue
        except ImportError as exc:
            raise ProducerUnavailable(
                f"scheduling RQ jobs needs RQ where the dashboard runs ({exc}): {install_hint('rq')}"
            ) from exc
        self.store = store
        self.connection = connection
        self.allowed = allowed
        self._queue_class = Queue
        self._scheduled = JobStatus.SCHEDULED

    def schedule(
        self,
        func: str,
        item_id: str,
        ready_ms: int,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        queue: str,
        job_options: Mapping[str, Any],
    ) -> None:
        """Save the job of ``func`` (an import path, not imported here) and schedule it.

        Raises:
            FunctionRefused: ``func`` is not allowed.
            ConfigError: RQ refused the id or an option (its message says which).
        """
        self.allowed.check(func)
        item_id = normalize_id(item_id)
        rq_queue = self._queue_class(queue, connection=self.connection, delay_store=self.store)
        chosen = {k: v for k, v in job_options.items() if v is not None}
        try:
            job = rq_queue.create_job(
                func, args=tuple(args), kwargs=dict(kwargs), job_id=item_id, status=self._scheduled, **chosen
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"RQ refused job {item_id!r}: {exc}") from exc
        rq_queue.schedule_job(job, from_ms(ready_ms))

    def entry(
        self,
        name: str,
        func: str,
        *,
        queue: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        schedule: Schedule,
        misfire: Misfire,
        overlap: str,
        options: RunOptions,
        **fields: Any,
    ) -> EntrySpec:
        """A runtime periodic entry running ``func`` (an import path, not imported here): its job
        template captured as ``rq cron`` configs are (:func:`delayq_backends.rq.entries.capture`),
        with its run ``options``. ``fields`` are :class:`EntrySpec`'s own (``enabled``,
        ``start_ms``, ``end_ms``, ``max_runs``, ``jitter_ms``).

        Raises:
            FunctionRefused: ``func``, or a callback of ``options``, is not allowed: every run of
                the entry would call it.
            ProducerUnavailable: this RQ has no ``rq.cron`` (RQ entries need RQ 2.4 or later).
            TemplateError: RQ cannot make a job of it (a ValueError: its message says why).
        """
        for path in (func, options.on_success, options.on_failure):
            if path is not None:
                self.allowed.check(path)
        try:
            from ..rq.cron import runtime_entry
        except ImportError as exc:
            raise ProducerUnavailable(
                f"RQ periodic entries need RQ 2.4 or later where the dashboard runs ({exc}): pip install -U rq"
            ) from exc
        return runtime_entry(
            name, func, queue=queue, schedule=schedule, args=args, kwargs=dict(kwargs), misfire=misfire,
            overlap=overlap, options=options, **fields,
        )  # fmt: skip
