"""Tasks waiting in the delay store, by id: look up, revoke, reschedule. Each is O(log N)."""

from __future__ import annotations

from typing import Optional

from celery import Celery

from ..models import CancelOutcome, RescheduleOutcome, ScheduledItem
from ..timeutil import When
from .settings import store_for

__all__ = ["get", "reschedule", "revoke"]


def revoke(app: Celery, task_id: str) -> CancelOutcome:
    """Remove a task that has not reached a worker yet; truthy if it was waiting in the store
    (IN_FLIGHT, falsy: a forwarder was publishing it, so the worker may still get it).

    ``app.control.revoke(task_id)`` and ``AsyncResult(task_id).revoke()`` call this too when the
    plugin is installed, then broadcast as Celery does for tasks already with a worker.
    """
    return store_for(app).cancel(task_id)


def reschedule(app: Celery, task_id: str, eta: When) -> RescheduleOutcome:
    """Move a waiting task to ``eta`` (aware datetime, timedelta from now, or epoch seconds).

    Falsy if the task is not waiting in the store (never scheduled, already forwarded, or
    revoked), or IN_FLIGHT: being forwarded now, left as it is. The message's ``eta`` header
    follows when it is forwarded, so the worker runs it at the new time, earlier or later.
    """
    return store_for(app).reschedule(task_id, eta)


def get(app: Celery, task_id: str) -> Optional[ScheduledItem]:
    """The waiting task ``task_id`` (ready time, attempts, raw envelope), or None."""
    return store_for(app).get(task_id)
