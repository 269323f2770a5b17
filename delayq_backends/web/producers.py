"""Scheduling for producers that are not Python: a Celery task by name, an RQ job by function path.

Both store exactly what the Python adapters store, so forwarders and workers cannot tell an item
scheduled over HTTP from one scheduled by ``apply_async(eta=…)`` or ``Queue.enqueue_at``:
Celery messages are built by :class:`~delayq_backends.celery.template.TaskTemplate` (Celery's own
task sender, run once per task and options) and RQ jobs are saved by
:meth:`delayq_backends.rq.Queue.schedule_job` (RQ's own job hash). Neither imports user code.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Literal, Mapping, Optional, Sequence

import redis

from ..errors import ConfigError, DelayqError
from ..keys import normalize_id
from ..store import DelayStore
from ..timeutil import from_ms

__all__ = ["CeleryProducer", "ProducerUnavailable", "RQProducer", "ScheduleResult"]

#: What scheduling an id did: a new item, one replaced, or one kept as it was (``mode="keep"``).
ScheduleResult = Literal["added", "replaced", "kept"]

#: Task templates kept per (task, options): each costs one run of Celery's sender to build.
TEMPLATE_CACHE = 256


class ProducerUnavailable(DelayqError):
    """This server cannot schedule for that framework (extra not installed, no RQ Redis)."""


class CeleryProducer:
    """Stores Celery task messages as the Celery adapter stores an ``apply_async`` with an eta.

    Args:
        store: where the messages wait.
        broker_url: the workers' broker; with the app's defaults it decides the routing
            (exchange, routing key, queue declarations) the message is stored with.

    Raises:
        ProducerUnavailable: Celery is not installed.
    """

    def __init__(self, store: DelayStore, broker_url: Optional[str] = None) -> None:
        try:
            from celery import Celery

            from ..celery.template import TaskTemplate
        except ImportError as exc:
            raise ProducerUnavailable(
                f"scheduling Celery tasks needs Celery where the dashboard runs ({exc}): "
                'pip install "delayq_backends[celery]"'
            ) from exc
        self.store = store
        self.app = Celery("delayq-web", set_as_current=False)
        if broker_url:
            self.app.conf.broker_url = broker_url
        self._template_class = TaskTemplate
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
            [(item_id, ready_ms, self.store.check_payload(item_id, envelope))], mode=mode
        )
        return "added" if counts.added else "replaced" if counts.replaced else "kept"

    def close(self) -> None:
        self.app.close()


class RQProducer:
    """Saves RQ jobs and schedules their ids as ``delayq_backends.rq.Queue.enqueue_at`` does.

    Args:
        store: the delay store; when it is on ``connection``'s server, the job hash and the store
            entry are written in one transaction.
        connection: RQ's Redis (a single server, not a cluster).

    Raises:
        ProducerUnavailable: RQ is not installed.
    """

    def __init__(self, store: DelayStore, connection: redis.Redis) -> None:
        try:
            from rq.job import JobStatus

            from ..rq import Queue
        except ImportError as exc:
            raise ProducerUnavailable(
                f'scheduling RQ jobs needs RQ where the dashboard runs ({exc}): pip install "delayq_backends[rq]"'
            ) from exc
        self.store = store
        self.connection = connection
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
            ConfigError: RQ refused the id or an option (its message says which).
        """
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
