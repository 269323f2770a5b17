"""Celery's side of periodic entries' history (:mod:`delayq_backends.periodic.history`).

Each run of a periodic entry carries the header ``delayq_periodic`` (its entry and period).
``install(app)`` connects the worker's reports of such runs: ``task_prerun`` (started),
``task_postrun`` with state ``SUCCESS``/``FAILURE``/``RETRY`` (finished: success, failure, retry;
an ``IGNORED`` duplicate is not the run) and ``task_revoked`` (finished: revoked). A report that
cannot be written (the store away) is logged and the task runs on: history never gates a run.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import task_postrun, task_prerun, task_revoked

from ..periodic.history import RUN_HEADER, RunMark, record_finished, record_started, reported
from .settings import store_for

__all__ = ["use_history"]

log = logging.getLogger("delayq.celery.history")

#: Celery's task states that end a run, as history's outcomes.
_OUTCOMES = {"SUCCESS": "success", "FAILURE": "failure", "RETRY": "retry"}


def use_history(app: Any) -> None:
    """Connect the worker's history reports (``install`` calls this); they act only on the runs
    of periodic entries."""
    task_prerun.connect(_started, weak=False, dispatch_uid="delayq-history-start")
    task_postrun.connect(_ended, weak=False, dispatch_uid="delayq-history-end")
    task_revoked.connect(_revoked, weak=False, dispatch_uid="delayq-history-revoked")


def _mark(request: Any) -> RunMark | None:
    return RunMark.parse(getattr(request, RUN_HEADER, None))


def _started(sender: Any = None, task: Any = None, task_id: str | None = None, **_: Any) -> None:
    mark = None if task is None else _mark(task.request)
    if mark is not None and task_id:
        with reported(f"start of run {task_id} of {mark.name!r}"):
            record_started(store_for(task.app), mark, task_id)


def _ended(
    sender: Any = None, task: Any = None, task_id: str | None = None, state: str | None = None, **_: Any
) -> None:
    mark = None if task is None else _mark(task.request)
    outcome = _OUTCOMES.get(state or "")
    if mark is not None and task_id and outcome is not None:
        with reported(f"end of run {task_id} of {mark.name!r}"):
            record_finished(store_for(task.app), mark, task_id, outcome)


def _revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    mark = _mark(request)
    task_id = getattr(request, "id", None)
    if mark is not None and sender is not None and task_id:
        with reported(f"revoke of run {task_id} of {mark.name!r}"):
            record_finished(store_for(sender.app), mark, str(task_id), "revoked")
