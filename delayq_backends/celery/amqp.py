"""Interception of Celery's delayed publishes, after routing.

Celery's task sender (``AMQP.send_task_message``) resolves the queue, exchange, routing key,
delivery mode and serializer, fires ``before_task_publish``, then calls
``producer.publish(body, **kwargs)``. We wrap that sender: when a message's ``eta`` lies more
than ``delayq_min_delay`` ahead, Celery's own sender runs against a producer proxy that stores
the message in the delay store instead of publishing it. Everything Celery decided is kept,
and any other publish (a task-sent event, a task without eta) goes through untouched. This
catches ``apply_async(eta=/countdown=)``, ``send_task``, ``Task.retry(countdown=)``, canvas
primitives and beat alike, because all of them end in this sender.

Two headers of the caller's (``apply_async(..., headers={...})``) change what is stored:
``delayq_debounce`` (a key, or ``{"key", "mode", "keep"}``: see :class:`~delayq_backends.collapse.Collapse`)
collapses the sends of one key into one run, whatever their eta; ``delayq_rate_key`` names
who the task is for, so forwarders with a per-key rate cap for its queue pace that key alone;
``delayq_slot`` (a key, or ``{"key", "limit"}``) gives it a concurrency slot: it goes through the
store even with no eta, and is released only while fewer than the key's limit of its tasks run
(:mod:`~delayq_backends.celery.slots`). ``delayq_group`` (a key, ``{"key", "limit", "rate",
"weight", "cost"}``, or a list of up to 3: see :class:`~delayq_backends.envelope.Group`) names its
groups, of which the slot and rate key are aliases: it goes through the store too, and is released
only when each group admits it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import cached_property
from typing import Any

from celery import Celery
from celery.app.amqp import AMQP as CeleryAMQP
from celery.app.control import Control as CeleryControl
from kombu.entity import Exchange

from ..collapse import Collapse
from ..envelope import Group, Slot, parse_groups, with_slot
from ..errors import BatchError, DelayqError, InvalidDebounceError
from ..store import DelayStore
from ..store.batches import check_batch_key
from .batches import BATCH_HEADER, capturing
from .message import StoredMessage, parse_time, priority_rank
from .scheduled import revoke_everywhere
from .settings import CelerySettings, DuplicateTaskIdError, StoreUnavailableError, store_for
from .slots import GROUP_HEADER, SLOT_HEADER

__all__ = ["AMQP", "DEBOUNCE_HEADER", "RATE_KEY_HEADER", "Control", "StoreUnavailableError", "use_plugin_control"]

log = logging.getLogger("delayq.celery")

#: Celery >= 5.5 routes countdowns on quorum queues through RabbitMQ's own delayed delivery
#: (``celery_delayed_27`` topic exchange): those never wait in a worker, so we leave them be.
NATIVE_DELAYED_EXCHANGE = "celery_delayed_27"
#: The header that debounces or throttles a send by key (``apply_async(countdown=30, headers={...})``).
DEBOUNCE_HEADER = "delayq_debounce"
#: The header naming the task's rate key (a tenant) for per-key rate caps at forwarding.
RATE_KEY_HEADER = "delayq_rate_key"


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
            if not settings.enabled:
                return send(producer, name, message, **kwargs)
            # the caller's own headers reach message.headers only inside Celery's sender
            headers = {**message.headers, **(kwargs.get("headers") or {})}
            eta = parse_time(headers.get("eta"))
            collapse = _collapse_of(headers, eta)
            slot = None if headers.get(SLOT_HEADER) is None else settings.slot(headers[SLOT_HEADER])
            groups = _groups_of(headers, kwargs)
            batch = _batch_of(headers, collapse)
            captured = capturing(headers.get("id"))
            if captured is not None:  # a batch's on_complete, built and kept for its completion
                return send(captured.producer(producer), name, message, **kwargs)
            # a collapse always has an eta (_collapse_of refuses one without) and is always stored;
            # so is a slotted or grouped task, which waits in the store for its groups, and a
            # batch's sub-job, counted into its batch before it is stored
            # the clock Celery counted the eta from (the testing helper's fake one under delayed_tasks):
            # ``delayq_min_delay`` is about the countdown asked for, and the store is not opened to send at once
            now = self.app.now()
            if (
                slot is None
                and groups is None
                and batch is None
                and (eta is None or (collapse is None and (eta - now).total_seconds() <= settings.min_delay))
            ):
                return send(producer, name, message, **kwargs)
            store = store_for(self.app, settings)
            task_id, when = headers["id"], eta or now
            storing = _StoringProducer(
                producer, store, task_id, when, settings.duplicate_id, collapse, slot, groups, batch
            )
            return send(storing, name, message, **kwargs)

        return send_task_message


def _collapse_of(headers: Mapping[str, Any], eta: datetime | None) -> Collapse | None:
    """The send's debounce/throttle, from its ``delayq_debounce`` header; None without one.

    Raises:
        InvalidDebounceError: the header is malformed, or the send has no eta (the window).
    """
    value = headers.get(DEBOUNCE_HEADER)
    if value is None:
        return None
    collapse = Collapse.parse(value, f"header {DEBOUNCE_HEADER}")
    if eta is None:
        raise InvalidDebounceError(
            f"task {headers.get('id')} ({headers.get('task')}) was NOT sent: header {DEBOUNCE_HEADER} needs "
            "countdown= or eta= (the window: a debounce runs that long after the last send, a throttle after "
            "the first)"
        )
    return collapse


def _groups_of(headers: Mapping[str, Any], kwargs: dict[str, Any]) -> tuple[Group, ...] | None:
    """The send's groups, from its ``delayq_group`` header; None without one. The header the
    task's worker reads becomes their stored form (a list of dicts), whatever the caller passed
    (a key, a dict, :class:`Group` objects kombu cannot serialize).

    Raises:
        InvalidGroupError: the header is no group or list of groups; the task was not sent.
    """
    value = headers.get(GROUP_HEADER)
    if value is None:
        return None
    try:
        groups = parse_groups(value)
    except DelayqError as exc:
        raise type(exc)(
            f"task {headers.get('id')} ({headers.get('task')}) was NOT sent: header {GROUP_HEADER}: {exc}"
        ) from exc
    kwargs["headers"] = {**(kwargs.get("headers") or {}), GROUP_HEADER: [g.to_meta() for g in groups]}
    return groups or None


def _batch_of(headers: Mapping[str, Any], collapse: Collapse | None) -> str | None:
    """The send's batch key, from its ``delayq_batch`` header; None without one.

    Raises:
        BatchError: not a key, or a debounced send (one run of many sends is no sub-job).
    """
    value = headers.get(BATCH_HEADER)
    if value is None:
        return None
    if collapse is not None:
        raise BatchError(
            f"task {headers.get('id')} was NOT sent: header {BATCH_HEADER} cannot go with {DEBOUNCE_HEADER} "
            "(a collapsed run is no one sub-job); drop one of them"
        )
    return check_batch_key(value)


class _StoringProducer:
    """Stands in for the kombu producer while Celery sends one delayed task.

    Only the publish of that task (matched by its id) is stored; anything else Celery publishes
    with the producer, such as the ``task-sent`` event, goes to the real producer.
    """

    def __init__(
        self,
        producer: Any,
        store: DelayStore,
        task_id: str,
        eta: datetime,
        duplicate_id: str,
        collapse: Collapse | None = None,
        slot: Slot | None = None,
        groups: tuple[Group, ...] | None = None,
        batch: str | None = None,
    ) -> None:
        self._producer = producer
        self._store = store
        self._task_id = task_id
        self._eta = eta
        self._duplicate_id = duplicate_id
        self._collapse = collapse
        self._stored = False
        self._slot = slot
        self._groups = groups
        self._batch = batch

    def publish(self, body: Any, **kwargs: Any) -> Any:
        headers = kwargs.get("headers") or {}
        exchange = kwargs.get("exchange")
        exchange_name = exchange.name if isinstance(exchange, Exchange) else exchange
        if self._stored or headers.get("id") != self._task_id or exchange_name == NATIVE_DELAYED_EXCHANGE:
            return self._producer.publish(body, **kwargs)
        message = StoredMessage.capture(body, kwargs)
        rank = priority_rank(message.properties.get("priority"), self._broker_driver())
        mode = "replace" if self._duplicate_id == "replace" else "keep"
        envelope, rate_key = message.to_envelope(), headers.get(RATE_KEY_HEADER)
        if self._slot is not None:
            envelope = with_slot(envelope, self._slot, rank)
        try:
            if self._collapse is not None:
                self._collapse.apply(self._store, self._eta, envelope, rank=rank, rate_key=rate_key, group=self._groups)
                self._stored = True
                return None
            done = self._store.schedule(
                self._task_id, self._eta, envelope, mode=mode, rank=rank, rate_key=rate_key, group=self._groups,
                batch=self._batch,
            )  # fmt: skip
        except DelayqError:
            raise  # bad input: the error already says what to fix
        except Exception as exc:
            raise StoreUnavailableError(
                f"task {self._task_id} ({headers.get('task')}) was NOT scheduled: the delay store "
                f"could not be written ({type(exc).__name__}: {exc}); check delayq_url and retry"
            ) from exc
        if done == "kept" and self._duplicate_id == "error":
            raise DuplicateTaskIdError(
                f"task {self._task_id} ({headers.get('task')}) was NOT scheduled: a task with this id already "
                "waits in the delay store and delayq_duplicate_id='error'; send with another task_id, revoke "
                "the waiting one first, or set delayq_duplicate_id to 'replace' or 'keep'"
            )
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

    The broadcast goes out first, as Celery sends it, whatever the store's state: a task already
    with a worker (``terminate=True`` included) is reached even when the store is down.
    """

    def revoke(self, task_id: Any, destination: Any = None, terminate: bool = False, **kwargs: Any) -> Any:
        """Broadcast, then remove from the store; returns the broadcast's reply, as Celery does.

        Raises:
            StoreUnavailableError: the broadcast went out but the store could not be reached;
                the message says the stored task may still run and how to finish the revoke.
        """
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        report = revoke_everywhere(self.app, ids, destination=destination, terminate=terminate, **kwargs)
        report.raise_errors()
        return report.reply


def use_plugin_control(app: Celery) -> None:
    """Make ``app.control`` (and so ``AsyncResult.revoke``) the plugin's :class:`Control`."""
    if isinstance(app.__dict__.get("control"), Control):
        return
    app.control_cls = f"{Control.__module__}:{Control.__qualname__}"
    app.__dict__.pop("control", None)  # a cached_property: the next access builds ours
