"""Tasks waiting in the delay store, by id: look up, revoke, reschedule. Each is O(log N).

A Redis error here is a :class:`StoreUnavailableError` that says what was (not) done, never a
raw ``ConnectionError``: the caller of a revoke must know whether the task may still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

from celery import Celery, states
from celery.app.control import Control as CeleryControl
from celery.backends.base import DisabledBackend

from ..errors import DelayqError
from ..models import CancelOutcome, RescheduleOutcome, ScheduledItem
from ..timeutil import When
from .message import parse_time
from .settings import StoreUnavailableError, attached_store, store_for

__all__ = [
    "ResultMark",
    "RevokeReport",
    "StoreRevoke",
    "get",
    "reschedule",
    "revoke",
    "revoke_everywhere",
    "uses_store",
]

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


def revoke(app: Celery, task_id: str, **broadcast: Any) -> CancelOutcome:
    """Revoke ``task_id`` as ``app.control.revoke`` does (the broadcast to workers first, then the
    store), and return what the store said, which ``AsyncResult.revoke()`` cannot (it returns None).

    Returns CANCELLED (truthy) if it was waiting in the store (then marked REVOKED in the result
    backend, if there is one), NOT_FOUND (never delayed, already forwarded: the broadcast reaches
    the worker holding it; always NOT_FOUND under ``task_always_eager``, where no store is
    touched), or IN_FLIGHT: a forwarder was publishing it, so a worker started after the
    broadcast may still run it once. ``broadcast`` takes ``Control.revoke``'s options
    (``terminate``, ``signal``, ``destination``).

    Raises:
        StoreUnavailableError: the broadcast went out, but the store could not be reached.
        Exception: the broadcast failed (Celery's error); the store was still looked at.
    """
    report = revoke_everywhere(app, [task_id], **broadcast)
    report.raise_errors()
    return report.store[0].outcome if report.store and report.store[0].outcome else CancelOutcome.NOT_FOUND


class ResultMark(Enum):
    """What a revoke of a task waiting in the store did to its state in the result backend."""

    MARKED = "marked REVOKED"
    NO_BACKEND = "no result backend is configured, so its state stays PENDING"
    HAS_RESULT = "its result was already stored and is kept"
    FAILED = "marking it REVOKED in the result backend failed (logged)"


def _remove_waiting(app: Celery, task_id: str) -> StoreRevoke:
    """Remove ``task_id`` from the store; mark it REVOKED as Celery's worker would
    (``mark_as_revoked``), so ``AsyncResult.get()`` raises ``TaskRevokedError``: Celery 5.3 to
    5.6.0 workers do not do it for a task they never received, which left it PENDING forever.

    Raises:
        StoreUnavailableError: the store could not be reached; nothing was removed.
    """
    outcome = _reaching_store(f"removing task {task_id} from the delay store", lambda: store_for(app).cancel(task_id))
    if outcome is not CancelOutcome.CANCELLED:
        return StoreRevoke(task_id, outcome)
    return StoreRevoke(task_id, outcome, mark=mark_revoked(app, task_id))


def mark_revoked(app: Celery, task_id: str) -> ResultMark:
    """Store REVOKED for ``task_id`` as a Celery worker does on a revoke, unless it has a result."""
    backend = app.backend
    if isinstance(backend, DisabledBackend):
        return ResultMark.NO_BACKEND
    try:
        if backend.get_state(task_id) in states.READY_STATES:
            return ResultMark.HAS_RESULT  # a result (or a failure stored on its behalf) is never overwritten
        backend.mark_as_revoked(task_id, reason="revoked", store_result=True)
    except Exception as exc:  # the task will not run; only its state could not be written
        log.warning("task %s was revoked, but marking it REVOKED in the result backend failed: %s", task_id, exc)
        return ResultMark.FAILED
    return ResultMark.MARKED


@dataclass(frozen=True)
class StoreRevoke:
    """What a revoke did in the delay store for one task id.

    ``outcome`` is None when the store could not be reached or opened (``error`` says why).
    """

    task_id: str
    outcome: CancelOutcome | None
    error: str | None = None
    #: for a task removed from the store: what became of its state in the result backend
    mark: ResultMark | None = None

    @property
    def may_still_run(self) -> bool:
        return self.outcome is None or self.outcome is CancelOutcome.IN_FLIGHT

    def describe(self) -> str:
        """One line saying what happened to the task, for logs and the command line."""
        if self.outcome is CancelOutcome.CANCELLED:
            mark = (self.mark or ResultMark.MARKED).value
            return f"{self.task_id}: removed from the delay store; it will not run; {mark}"
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

    def raise_errors(self) -> None:
        """Log the ids that may still run once; raise the broadcast's error, else the store's."""
        for one in self.store:
            if one.outcome is not None and one.may_still_run:
                log.warning("revoke %s", one.describe())
        if self.broadcast_error is not None:
            raise self.broadcast_error
        if self.store_failures:
            raise StoreUnavailableError("; ".join(r.describe() for r in self.store_failures))


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
            report.store.append(_remove_waiting(app, task_id))
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
