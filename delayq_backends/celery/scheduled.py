"""Tasks waiting in the delay store, by id: look up, revoke, reschedule. Each is O(log N).

A Redis error here is a :class:`StoreUnavailableError` that says what was (not) done, never a
raw ``ConnectionError``: the caller of a revoke must know whether the task may still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from celery import Celery, states
from celery.app.control import Control as CeleryControl
from celery.backends.base import DisabledBackend

from ..errors import DelayqError
from ..models import CancelOutcome, RescheduleOutcome, ScheduledItem
from ..timeutil import When
from .message import parse_time
from .settings import StoreUnavailableError, attached_store, store_for

__all__ = ["RevokeReport", "StoreRevoke", "get", "reschedule", "revoke", "revoke_everywhere", "uses_store"]

log = logging.getLogger("delayq.celery")

T = TypeVar("T")


def uses_store(app: Celery) -> bool:
    """Whether tasks of ``app`` can wait in a delay store, so a revoke must look there.

    Not with ``delayq_enabled = False``, nor with ``task_always_eager`` (test suites with a
    ``memory://`` broker and no store configured): nothing is ever stored then, so a revoke
    must neither require nor touch a store. A store attached by the testing helper is used.
    """
    if attached_store(app) is not None:
        return True
    return bool(app.conf.get("delayq_enabled", True)) and not app.conf.task_always_eager


def _reaching_store(doing: str, call: Callable[[], T]) -> T:
    """``call()``, with a store that cannot be reached said in words: ``doing`` names the action."""
    try:
        return call()
    except DelayqError:
        raise  # bad input or settings: the error already says what to fix
    except Exception as exc:
        raise StoreUnavailableError(
            f"{doing} was NOT done: the delay store could not be reached ({type(exc).__name__}: {exc}); "
            "check delayq_url and retry"
        ) from exc


def revoke(app: Celery, task_id: str) -> CancelOutcome:
    """Remove a task that has not reached a worker yet, and mark it REVOKED in the result backend.

    Returns CANCELLED (truthy) if it was waiting in the store, NOT_FOUND, or IN_FLIGHT: a
    forwarder was publishing it, so a worker may still get it (the broadcast of
    ``app.control.revoke`` stops workers already running). It does not broadcast: use
    ``app.control.revoke`` (store and broadcast) unless you know the task is still waiting.

    The REVOKED state is written as Celery's worker writes it (``mark_as_revoked``), so
    ``AsyncResult.get()`` raises ``TaskRevokedError``; Celery 5.3 to 5.6.0 workers do not do it
    for a task they never received, which left such a task PENDING forever.

    Raises:
        StoreUnavailableError: the store could not be reached; nothing was removed.
    """
    outcome = _reaching_store(f"removing task {task_id} from the delay store", lambda: store_for(app).cancel(task_id))
    if outcome is CancelOutcome.CANCELLED:
        mark_revoked(app, task_id)
    return outcome


def mark_revoked(app: Celery, task_id: str) -> None:
    """Store REVOKED for ``task_id`` as a Celery worker does on a revoke, unless it has a result."""
    backend = app.backend
    if isinstance(backend, DisabledBackend):
        return
    try:
        if backend.get_state(task_id) in states.READY_STATES:
            return  # a result (or a failure stored on its behalf) is never overwritten
        backend.mark_as_revoked(task_id, reason="revoked", store_result=True)
    except Exception as exc:  # the task will not run; only its state could not be written
        log.warning("task %s was revoked, but marking it REVOKED in the result backend failed: %s", task_id, exc)


@dataclass(frozen=True)
class StoreRevoke:
    """What a revoke did in the delay store for one task id.

    ``outcome`` is None when the store could not be reached or opened (``error`` says why).
    """

    task_id: str
    outcome: CancelOutcome | None
    error: str | None = None

    @property
    def may_still_run(self) -> bool:
        return self.outcome is None or self.outcome is CancelOutcome.IN_FLIGHT

    def describe(self) -> str:
        """One line saying what happened to the task, for logs and the command line."""
        if self.outcome is CancelOutcome.CANCELLED:
            return f"{self.task_id}: removed from the delay store and marked REVOKED; it will not run"
        if self.outcome is CancelOutcome.NOT_FOUND:
            return f"{self.task_id}: not waiting in the delay store (the broadcast covers workers holding it)"
        if self.outcome is CancelOutcome.IN_FLIGHT:
            return (
                f"{self.task_id}: was being forwarded to the broker: removed from the store, and the broadcast "
                "tells running workers not to run it; a worker started after the broadcast may still run it once"
            )
        return (
            f"{self.task_id}: the revoke broadcast went out, but removing it from the delay store failed "
            f"({self.error}): if the task waits there it may still run when due; run "
            f"`celery -A <app> delayq revoke {self.task_id}` again once the store is back"
        )


@dataclass
class RevokeReport:
    """A revoke everywhere: the broadcast's reply (Celery's), its error, and the store's outcomes."""

    reply: Any = None
    broadcast_error: BaseException | None = None
    store: list[StoreRevoke] = field(default_factory=list)

    @property
    def store_failures(self) -> list[StoreRevoke]:
        return [r for r in self.store if r.outcome is None]


def revoke_everywhere(app: Celery, task_ids: Iterable[str], **broadcast: Any) -> RevokeReport:
    """Broadcast the revoke first, whatever the store's state, then remove the tasks from the store.

    The broadcast goes first so that ``terminate=True`` reaches a running task even when the store
    is down. A store that cannot be reached is reported per id (never raised), so every id gets
    its try. ``broadcast`` holds ``Control.revoke``'s options (``terminate``, ``signal``, ...).
    """
    ids = list(task_ids)
    report = RevokeReport()
    try:
        report.reply = CeleryControl.revoke(app.control, ids if len(ids) != 1 else ids[0], **broadcast)
    except Exception as exc:  # still take them out of the store; the caller re-raises
        report.broadcast_error = exc
    if not uses_store(app):
        return report
    for task_id in ids:
        try:
            report.store.append(StoreRevoke(task_id, revoke(app, task_id)))
        except DelayqError as exc:  # unreachable, or a store that cannot be opened: said per id
            report.store.append(StoreRevoke(task_id, None, str(exc.__cause__ or exc)))
    return report


def reschedule(
    app: Celery,
    task_id: str,
    eta: When | str | None = None,
    *,
    countdown: float | None = None,
) -> RescheduleOutcome:
    """Move a waiting task to ``eta`` or ``countdown`` seconds from now, as ``apply_async`` takes them.

    ``eta`` is a datetime (a naive one is read as UTC, as Celery's worker reads it), ISO text,
    a timedelta from now, or epoch seconds. Falsy if the task is not waiting in the store (never
    scheduled, already forwarded, or revoked), or IN_FLIGHT: being forwarded now, left as it is.
    The message's ``eta`` header follows when it is forwarded, so the worker runs it at the new
    time, earlier or later.

    Raises:
        StoreUnavailableError: the store could not be reached; the task was not moved.
    """
    if (eta is None) == (countdown is None):
        raise ValueError("reschedule needs eta= or countdown= (one of them)")
    when: When = timedelta(seconds=countdown) if countdown is not None else _when(eta)
    return _reaching_store(f"rescheduling task {task_id}", lambda: store_for(app).reschedule(task_id, when))


def _when(eta: Any) -> When:
    if isinstance(eta, (str, datetime)):
        aware = parse_time(eta)
        if aware is not None:
            return aware
    when: When = eta
    return when


def get(app: Celery, task_id: str) -> ScheduledItem | None:
    """The waiting task ``task_id`` (ready time, attempts, raw envelope), or None.

    :func:`delayq_backends.celery.periodic.task_view` shows its name, arguments, queue and priority.

    Raises:
        StoreUnavailableError: the store could not be reached.
    """
    return _reaching_store(f"reading task {task_id}", lambda: store_for(app).get(task_id))
