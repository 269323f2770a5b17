"""Celery tests without Redis: an in-process delay store attached to the app, on a fake clock.

A test asserts what a call scheduled, then runs what falls due through the real message path
(the stored bytes are decoded as a worker decodes them, and the task runs in Celery's tracer)::

    from datetime import datetime, timedelta, timezone
    from delayq_backends.celery.testing import delayed_tasks
    from delayq_backends.testing import FakeClock

    def test_charge_is_scheduled_for_nine_tomorrow():
        clock = FakeClock(datetime(2030, 1, 1, 15, tzinfo=timezone.utc))
        with delayed_tasks(app, clock=clock) as delayed:
            shop.checkout(order)                        # calls charge.apply_async(eta=09:00 tomorrow)
            [task] = delayed.scheduled("billing.charge")
            assert task.eta == datetime(2030, 1, 2, 9, tzinfo=timezone.utc)
            assert task.args == [order.id]
            assert delayed.advance(timedelta(hours=17)) == []        # 08:00: not due
            [ran] = delayed.advance(timedelta(hours=1))              # 09:00: runs once
            assert ran.state == "SUCCESS"

With pytest, ``pytest_plugins = ["delayq_backends.celery.testing"]`` in a conftest gives the
``delayq_tasks`` fixture: ``delayed = delayq_tasks(app)``, detached after the test.

The app needs no broker and no ``delayq_url``: a ``memory://`` broker will do. While attached,
``countdown=`` and ``Task.retry(countdown=…)`` count from the fake clock (the app's ``now``),
and a retry or a callback with a countdown goes back into the store, to run on a later advance.
Needs the ``testing`` extra (fakeredis with Lua).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery, states
from celery.app.trace import trace_task
from celery.backends.base import DisabledBackend
from kombu.message import Message
from kombu.serialization import prepare_accept_content

from ..envelope import Envelope
from ..targets import Delivery
from ..testing import FakeClock, TestingStore, run_due, scheduled, testing_store
from ..timeutil import from_ms
from . import install
from .amqp import AMQP
from .message import KIND, StoredMessage, parse_time
from .settings import attach_store, detach_store

__all__ = ["DelayedTasks", "RanTask", "ScheduledTask", "delayed_tasks", "delayq_tasks"]


@dataclass(frozen=True)
class ScheduledTask:
    """A task waiting in the store, as a test asserts on it.

    ``args``/``kwargs`` are decoded from JSON bodies only (None otherwise: see ``argsrepr``).
    ``eta`` is the message's own eta; ``ready`` the store's (rounded up to the millisecond).
    """

    id: str
    name: str
    args: Any
    kwargs: Any
    argsrepr: str | None
    kwargsrepr: str | None
    eta: datetime | None
    ready: datetime
    queue: str
    priority: int | None
    message: StoredMessage


@dataclass(frozen=True)
class RanTask:
    """A due task, run: its Celery state (SUCCESS, FAILURE, RETRY, REVOKED for an expired one)
    and what it returned (or the exception info of a failure)."""

    task: ScheduledTask
    state: str
    result: Any


class DelayedTasks:
    """The app's delay store in a test: what waits, and running what is due on the fake clock."""

    def __init__(self, app: Celery, store: TestingStore) -> None:
        self.app = app
        self.store = store
        self.clock: FakeClock = store.clock

    def scheduled(self, name: str | None = None) -> list[ScheduledTask]:
        """Tasks waiting, earliest first; only those named ``name`` if given."""
        tasks = [_scheduled_task(e.id, e.envelope, e.ready) for e in scheduled(self.store, target=KIND)]
        return [t for t in tasks if name is None or t.name == name]

    def run_due(self) -> list[RanTask]:
        """Run every task due at the fake clock's now, in order, in this process."""
        ran: list[RanTask] = []

        def run(delivery: Delivery) -> None:
            ran.append(self._execute(delivery))

        run_due(self.store, run)
        return ran

    def advance(self, delta: timedelta | int | float) -> list[RanTask]:
        """Move the fake clock by ``delta`` (timedelta or seconds), then :meth:`run_due`."""
        self.clock.advance(delta)
        return self.run_due()

    def _execute(self, delivery: Delivery) -> RanTask:
        """Replay the stored message as the forwarder would publish it, decode it as a worker
        does (the app's ``accept_content``, compression), and run it in Celery's tracer."""
        task = _scheduled_task(delivery.id, delivery.envelope, from_ms(delivery.ready_ms))
        publish = task.message.publish_kwargs(ready_ms=delivery.ready_ms, now=self.clock.now())
        properties = {k: v for k, v in publish.items() if k in ("correlation_id", "reply_to", "priority")}
        delivery_info = {"exchange": publish["exchange"], "routing_key": publish["routing_key"]}
        message = Message(
            body=publish["body"],
            content_type=publish["content_type"],
            content_encoding=publish["content_encoding"],
            headers=publish["headers"],
            properties=properties,
            delivery_info=delivery_info,
            accept=prepare_accept_content(self.app.conf.accept_content),
        )
        args, kwargs, embed = message.decode()
        headers = dict(message.headers)
        expires = parse_time(headers.get("expires"))
        if expires is not None and expires <= self.clock.now():  # as the worker: revoked, not run
            if not isinstance(self.app.backend, DisabledBackend):
                self.app.backend.mark_as_revoked(task.id, reason="expired")
            return RanTask(task, states.REVOKED, None)
        request = {
            **headers,
            "args": args,
            "kwargs": kwargs,
            "hostname": socket.gethostname(),
            "is_eager": False,
            "delivery_info": {**delivery_info, "priority": properties.get("priority")},
            "reply_to": properties.get("reply_to"),
            "correlation_id": properties.get("correlation_id"),
            **(embed or {}),
        }
        retval, info, _, _ = trace_task(self.app.tasks[headers["task"]], task.id, args, kwargs, request, app=self.app)
        return RanTask(task, states.SUCCESS if info is None else info.state, retval)


def _scheduled_task(item_id: str, envelope: Envelope, ready: datetime) -> ScheduledTask:
    message = StoredMessage.from_envelope(envelope)
    view = message.view()
    return ScheduledTask(
        id=item_id,
        name=view.task,
        args=view.args,
        kwargs=view.kwargs,
        argsrepr=view.argsrepr,
        kwargsrepr=view.kwargsrepr,
        eta=message.eta,
        ready=ready,
        queue=view.queue,
        priority=view.priority,
        message=message,
    )


@contextmanager
def delayed_tasks(
    app: Celery, *, clock: FakeClock | None = None, store: TestingStore | None = None
) -> Iterator[DelayedTasks]:
    """Attach an in-process store (on ``clock``, a fresh :class:`FakeClock` by default) to ``app``
    for the block; installs the plugin if needed. The app's own settings come back after."""
    if not isinstance(app.amqp, AMQP):
        install(app)
    store = store if store is not None else testing_store(clock=clock if clock is not None else FakeClock())
    attach_store(app, store)
    app.now = lambda: store.clock.now().astimezone(app.timezone)  # countdowns count from the fake clock
    try:
        yield DelayedTasks(app, store)
    finally:
        app.__dict__.pop("now", None)
        detach_store(app)


try:
    import pytest
except ImportError:  # pragma: no cover - the context manager works without pytest
    pass
else:

    @pytest.fixture
    def delayq_tasks() -> Iterator[Callable[..., DelayedTasks]]:
        """``delayq_tasks(app, clock=None)``: :func:`delayed_tasks` for the rest of the test."""
        exits: list[Any] = []

        def attach(app: Celery, **options: Any) -> DelayedTasks:
            manager = delayed_tasks(app, **options)
            exits.append(manager)
            return manager.__enter__()

        yield attach
        for manager in reversed(exits):
            manager.__exit__(None, None, None)
