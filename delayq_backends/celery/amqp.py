"""Interception of Celery's delayed publishes, after routing.

Celery's task sender (``AMQP.send_task_message``) resolves the queue, exchange, routing key,
delivery mode and serializer, fires ``before_task_publish``, then calls
``producer.publish(body, **kwargs)``. We wrap that sender: when a message's ``eta`` lies more
than ``delayq_min_delay`` ahead, Celery's own sender runs against a producer proxy that stores
the message in the delay store instead of publishing it. Everything Celery decided is kept,
and any other publish (a task-sent event, a task without eta) goes through untouched. This
catches ``apply_async(eta=/countdown=)``, ``send_task``, ``Task.retry(countdown=)``, canvas
primitives and beat alike, because all of them end in this sender.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Callable

from celery import Celery
from celery.app.amqp import AMQP as CeleryAMQP
from celery.app.control import Control as CeleryControl
from kombu.entity import Exchange

from ..errors import DelayqError
from ..store import DelayStore
from .message import StoredMessage, parse_time, priority_rank
from .scheduled import revoke as revoke_scheduled
from .settings import CelerySettings, store_for

__all__ = ["AMQP", "Control", "StoreUnavailableError", "use_plugin_control"]

log = logging.getLogger("delayq.celery")

#: Celery >= 5.5 routes countdowns on quorum queues through RabbitMQ's own delayed delivery
#: (``celery_delayed_27`` topic exchange): those never wait in a worker, so we leave them be.
NATIVE_DELAYED_EXCHANGE = "celery_delayed_27"


class StoreUnavailableError(DelayqError):
    """The delay store could not take a delayed task: the task was not scheduled."""


class AMQP(CeleryAMQP):  # type: ignore[misc]
    """Celery's AMQP with delayed task messages diverted to the delay store.

    Use ``delayq_backends.celery.install(app)``, or ``Celery(amqp="delayq_backends.celery:AMQP")``.
    """

    def __init__(self, app: Celery) -> None:
        super().__init__(app)
        use_plugin_control(app)

    @cached_property
    def delayq_settings(self) -> CelerySettings:
        return CelerySettings.of(self.app)

    def _create_task_sender(self) -> Callable[..., Any]:
        send = super()._create_task_sender()

        def send_task_message(producer: Any, name: str, message: Any, **kwargs: Any) -> Any:
            settings = self.delayq_settings
            eta = parse_time(message.headers.get("eta")) if settings.enabled else None
            if eta is None or (eta - datetime.now(timezone.utc)).total_seconds() <= settings.min_delay:
                return send(producer, name, message, **kwargs)
            store = store_for(self.app, settings)
            return send(_StoringProducer(producer, store, message.headers["id"], eta), name, message, **kwargs)

        return send_task_message


class _StoringProducer:
    """Stands in for the kombu producer while Celery sends one delayed task.

    Only the publish of that task (matched by its id) is stored; anything else Celery publishes
    with the producer, such as the ``task-sent`` event, goes to the real producer.
    """

    def __init__(self, producer: Any, store: DelayStore, task_id: str, eta: datetime) -> None:
        self._producer = producer
        self._store = store
        self._task_id = task_id
        self._eta = eta
        self._stored = False

    def publish(self, body: Any, **kwargs: Any) -> Any:
        headers = kwargs.get("headers") or {}
        exchange = kwargs.get("exchange")
        exchange_name = exchange.name if isinstance(exchange, Exchange) else exchange
        if self._stored or headers.get("id") != self._task_id or exchange_name == NATIVE_DELAYED_EXCHANGE:
            return self._producer.publish(body, **kwargs)
        message = StoredMessage.capture(body, kwargs)
        rank = priority_rank(message.properties.get("priority"), self._broker_driver())
        try:
            self._store.schedule(self._task_id, self._eta, message.to_envelope(), rank=rank)
        except DelayqError:
            raise  # bad input: the error already says what to fix
        except Exception as exc:
            raise StoreUnavailableError(
                f"task {self._task_id} ({headers.get('task')}) was NOT scheduled: the delay store "
                f"could not be written ({type(exc).__name__}: {exc}); check delayq_url and retry"
            ) from exc
        self._stored = True
        return None

    def _broker_driver(self) -> str:
        """kombu's name for the broker's kind (``amqp``, ``redis``, ...), which decides what a
        priority means. Read from the producer's Connection, which does not connect to learn it."""
        return str(self._producer.connection.transport.driver_type)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


class Control(CeleryControl):  # type: ignore[misc]
    """Celery's Control whose ``revoke`` also removes tasks still waiting in the delay store.

    The broadcast still goes out as Celery sends it, for tasks already with a worker.
    """

    def revoke(self, task_id: Any, destination: Any = None, terminate: bool = False, **kwargs: Any) -> Any:
        if CelerySettings.of(self.app).enabled:  # a disabled plugin needs no store, so none is asked
            for one in [task_id] if isinstance(task_id, str) else list(task_id):
                revoke_scheduled(self.app, one)
        return super().revoke(task_id, destination=destination, terminate=terminate, **kwargs)


def use_plugin_control(app: Celery) -> None:
    """Make ``app.control`` (and so ``AsyncResult.revoke``) the plugin's :class:`Control`."""
    if isinstance(app.__dict__.get("control"), Control):
        return
    app.control_cls = f"{Control.__module__}:{Control.__qualname__}"
    app.__dict__.pop("control", None)  # a cached_property: the next access builds ours
