"""Celery worker-side dedupe (``delayq_dedupe = True``): a second delivery of a started run is dropped.

Turn it on where the app is made, *before* :func:`~delayq_backends.celery.install` and before
the tasks are defined::

    app.conf.delayq_dedupe = True
    app.conf.delayq_dedupe_ttl = 86400   # seconds; the default
    install(app)

``install`` then makes :class:`DedupeTask` the app's base task class (mixed into a custom
``task_cls``). A task with its own ``base=`` needs ``DedupeTask`` in its bases; a worker
whose app has dedupe on logs an error naming the tasks that lack it.

Where: :meth:`DedupeTask.before_start`, in the pool process, just before the task body and
after the message was accepted. A ``task_prerun`` handler cannot skip a task; raising
:class:`~celery.exceptions.Ignore` from ``before_start`` can: the message is acked, no
result is stored (the first run's result stays), the state is ``IGNORED``.

A run is ``(task id, request.retries)``: ``self.retry()`` republishes the id with
``retries + 1``, a new run. Periodic entries synced into the store get one id per period
(``uuid5(entry, period)``), so each period is its own task.

Not covered: a broker re-delivery of a message that a worker started but never acked (an
``acks_late`` task whose worker died). Its ``redelivered`` flag lets it through: that is
Celery's at-least-once, and a worker crash mid-task may still run a task twice.
"""

from __future__ import annotations

import logging
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery, Task
from celery.exceptions import Ignore
from celery.signals import worker_init
from celery.utils.imports import symbol_by_name

from ..dedupe import Decision, RunGuard, Verdict
from ..errors import ConfigError, DelayqError
from .settings import CelerySettings, store_for

__all__ = ["DedupeTask", "guard_for", "should_run", "use_dedupe"]

log = logging.getLogger("delayq.celery.dedupe")

_guards: WeakKeyDictionary[Celery, RunGuard | None] = WeakKeyDictionary()


class DedupeTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """Base task class that drops a delivery whose run has started before (see the module)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        super().before_start(task_id, args, kwargs)
        if not should_run(self.app, self.request, acks_late=bool(self.acks_late)):
            raise Ignore()


def guard_for(app: Celery) -> RunGuard | None:
    """The app's :class:`RunGuard`, or None when ``delayq_dedupe`` is off.

    Raises:
        DelayqError: the store cannot be opened (not cached: the next task tries again).
    """
    if app in _guards:
        return _guards[app]
    settings = CelerySettings.of(app)
    guard = RunGuard(store_for(app, settings), ttl_ms=settings.dedupe_ttl_ms) if settings.dedupe else None
    _guards[app] = guard
    return guard


def should_run(app: Celery, request: Any, *, acks_late: bool) -> bool:
    """Whether this worker should run the delivery in ``request``; records the run's start."""
    if request.is_eager:
        return True  # apply() / task_always_eager: no broker, so no duplicate delivery
    delivery = request.delivery_info or {}
    if delivery.get("redelivered") and acks_late:
        return True  # the broker re-delivers what a worker took and never acked: Celery's call
    try:
        guard = guard_for(app)
    except DelayqError as exc:
        log.warning("dedupe: no delay store (%s): task %s runs unchecked (at-least-once)", exc, request.id)
        return True
    if guard is None:
        return True
    run = int(request.retries or 0)
    decision = guard.start(request.id, run)
    if decision.verdict is Verdict.DUPLICATE:
        _log_drop(request, run, decision)
    return decision.run


def _log_drop(request: Any, run: int, decision: Decision) -> None:
    log.warning(
        "dedupe: task %s[%s] run %d was started before (%s, record %s): duplicate delivery dropped, not run",
        request.task,
        request.id,
        run,
        decision.first,
        decision.key,
    )


def use_dedupe(app: Celery) -> None:
    """Make :class:`DedupeTask` the base of the app's tasks still to be defined, if the app's
    settings turn dedupe on (``install`` calls this)."""
    # connected either way: a worker whose app turns dedupe on only after install() says so
    worker_init.connect(_check_tasks, weak=False, dispatch_uid="delayq-dedupe-check")
    if app.conf.get("delayq_dedupe") is not True:
        return
    base = symbol_by_name(app.task_cls)
    if not issubclass(base, DedupeTask):
        app.task_cls = DedupeTask if base is Task else type(f"Dedupe{base.__name__}", (DedupeTask, base), {})
        app.__dict__.pop("Task", None)  # a cached_property: the next task is built on the new base


def _check_tasks(sender: Any = None, **_: Any) -> None:
    """At worker start: a bad dedupe setting, and the tasks that dedupe cannot cover (defined
    before ``install``), are logged as errors (Celery's signals swallow what a receiver raises)."""
    app = getattr(sender, "app", None)
    if app is None or app.conf.get("delayq_dedupe") in (None, False):
        return
    try:
        CelerySettings.of(app)
    except ConfigError as exc:
        log.error("%s: every task of this worker runs unchecked (no dedupe)", exc)
        return
    uncovered = sorted(
        name for name, task in app.tasks.items() if not name.startswith("celery.") and not isinstance(task, DedupeTask)
    )
    if uncovered:
        log.error(
            "delayq_dedupe is on but tasks %s do not derive from DedupeTask, so a duplicate delivery "
            "of them runs: set delayq_dedupe before install(app) and define tasks after it, or pass "
            "base=DedupeTask (mixed into your own base)",
            uncovered,
        )
