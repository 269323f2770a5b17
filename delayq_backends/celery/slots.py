"""Celery's side of concurrency slots (:mod:`delayq_backends.slots`).

A task sent with the header ``delayq_slot`` (a key, or ``{"key": ..., "limit": N}``)::

    task.apply_async(args, headers={"delayq_slot": {"key": "customer-42", "limit": 2}})

goes through the delay store even with no eta, and forwarders release it only while fewer than
the key's limit of its tasks run. ``install(app)`` connects the worker's side: ``task_prerun``
holds the slot (in the pool process, where a heartbeat thread keeps it while the task runs),
``task_postrun`` gives it back (success, failure, a retry: the retry takes a slot of its own when
released), and ``task_revoked`` gives back the slot of a task revoked or expired before or while
it ran. A slot's member is the task id and its ``retries``, as the forwarder names it; the
forwarder's token for the slot comes in the header ``delayq_slot_token`` (a report without it
does not count). A hold lasts ``delayq_slot_hold`` seconds (60) after the start or the last
heartbeat: what a worker killed mid-task costs.

A task's groups (header ``delayq_group``, see :mod:`~delayq_backends.celery.amqp`) are held the
same way, each by its key (one report per group): a slot is a group. A rate key (header
``delayq_rate_key``) is a group too, but one that paces starts, not running tasks, so the worker
reports nothing for it.

A periodic entry with an overlap policy (``options={"delayq_overlap": "skip"}``, see
:mod:`delayq_backends.overlap_policy`) gets the header on each run's message: the forwarder takes
the entry's slot for the run's task id (its ``retries`` 0), the name the worker holds it by, so
the two agree though the run's task id is not the entry's item id.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery, current_task
from celery.signals import task_postrun, task_prerun, task_revoked

from ..envelope import Group, Slot
from ..errors import DelayqError, InvalidGroupPolicyError
from ..slots import SlotGuard, held_groups
from ..store import SlotRun, slot_member
from ..targets import SLOT_TOKEN
from .settings import CelerySettings, store_for

__all__ = ["GROUP_HEADER", "SLOT_HEADER", "groups_of_request", "slot_of_request", "throttle", "use_slots"]

log = logging.getLogger("delayq.celery.slots")

#: The header naming a task's concurrency slot.
SLOT_HEADER = "delayq_slot"
#: The header naming a task's groups (:func:`~delayq_backends.envelope.parse_groups`), stored by
#: the sender as a list of dicts.
GROUP_HEADER = "delayq_group"

_guards: WeakKeyDictionary[Celery, SlotGuard] = WeakKeyDictionary()


def use_slots(app: Celery) -> None:
    """Connect the worker's slot hooks (``install`` calls this); they act only on tasks that
    carry the header."""
    task_prerun.connect(_started, weak=False, dispatch_uid="delayq-slot-start")
    task_postrun.connect(_ended, weak=False, dispatch_uid="delayq-slot-end")
    task_revoked.connect(_revoked, weak=False, dispatch_uid="delayq-slot-revoked")


def slot_of_request(request: Any) -> tuple[Slot, SlotRun] | None:
    """The slot of the task in ``request`` (a task's request, or the context a revoke signal
    carries) and its run (member and token); None without one (or with a header that is none:
    logged)."""
    value = getattr(request, SLOT_HEADER, None)
    if value is None:
        return None
    try:
        slot = Slot.parse(value)
    except DelayqError as exc:
        log.warning("task %s: %s", getattr(request, "id", None), exc)
        return None
    return slot, _run_of(request)


def _run_of(request: Any) -> SlotRun:
    """The task's member in its groups' sets (its id and ``retries``, as the forwarder names it)
    and the token the forwarder took its slots with ("" when none came)."""
    member = slot_member(str(request.id), int(getattr(request, "retries", 0) or 0))
    token = getattr(request, SLOT_TOKEN, None)
    return SlotRun(member, token if isinstance(token, str) else "")


def groups_of_request(request: Any) -> tuple[tuple[Group, ...], SlotRun] | None:
    """The groups of the task in ``request`` that hold slots while it runs (its ``delayq_group``
    header, then its slot: :func:`~delayq_backends.slots.held_groups`) and its run; None without any."""
    slotted = slot_of_request(request)
    where = f"task {getattr(request, 'id', None)}: header {GROUP_HEADER}"
    groups = held_groups(getattr(request, GROUP_HEADER, None), None if slotted is None else slotted[0], where)
    return (groups, _run_of(request)) if groups else None


def throttle(group: str, retry_after: float = 30) -> None:
    """From inside a task of ``group``: stop the group releasing for ``retry_after`` seconds (at
    most an hour) at every forwarder, say when an upstream API answers "429, retry after 30 s".
    Tasks already released run; the waiting ones are not counted as attempts (what to do with
    the current task is yours: return, or ``self.retry(countdown=retry_after)``).

    The report carries proof of this task's slot token, so a worker throttles only a group whose
    task it runs; it takes effect at the next release of the group by any forwarder.

    Raises:
        InvalidGroupPolicyError: called outside a task, from a task not of ``group`` (or one
            released without a token), or with ``retry_after`` out of range; nothing was reported.
    """
    task = current_task if current_task else None  # a proxy: falsy outside a task
    found = None if task is None else groups_of_request(task.request)
    if task is None or found is None or group not in {g.key for g in found[0]} or not found[1].token:
        where = "outside a task" if task is None else f"in task {task.request.id}"
        raise InvalidGroupPolicyError(
            f"throttle({group!r}) {where}: a worker throttles only the group of the task it runs, from inside "
            "that task (released with the group's slot token by a forwarder of this release)"
        )
    _guard(task.app).throttle(group, found[1], retry_after)


def _guard(app: Celery) -> SlotGuard:
    guard = _guards.get(app)
    if guard is None or guard.pid != os.getpid():  # a forked pool process makes its own
        settings = CelerySettings.of(app)
        guard = _guards[app] = SlotGuard(store_for(app, settings), hold_ms=settings.slot_hold_ms)
    return guard


def _hold(task: Any, request: Any, mode: str) -> None:
    found = groups_of_request(request)
    if found is None or task is None:
        return
    (groups, run), app = found, task.app
    try:
        guard = _guard(app)
    except DelayqError as exc:
        keys = [g.key for g in groups]
        log.warning("groups %r of task %s: no delay store (%s); their holds lapse by themselves", keys, run.member, exc)
        return
    (guard.start if mode == "start" else guard.end)([g.key for g in groups], run)


def _started(sender: Any = None, task: Any = None, **_: Any) -> None:
    if task is not None:
        _hold(task, task.request, "start")


def _ended(sender: Any = None, task: Any = None, **_: Any) -> None:
    if task is not None:
        _hold(task, task.request, "end")


def _revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    _hold(sender, request, "end")
