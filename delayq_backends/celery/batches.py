"""Celery's side of batches (:mod:`delayq_backends.batches`).

    from delayq_backends.celery import Batch

    with Batch(app, "order-42", on_complete=summarize.s()) as batch:
        for line in lines:
            batch.add(process.s(line))                # due now
        batch.add(remind.s(42), countdown=3600)       # or later
    # closed: summarize(summary) runs once every sub-job has finished

Each sub-job carries the header ``delayq_batch`` (the batch key) and goes through the delay store,
eta or not, counted into the batch before it is stored. ``on_complete`` is a signature: its
message is built here (Celery's own sender, captured) with the summary as its first argument, a
mark that the completing script replaces with the summary's JSON, so the worker that completes a
batch needs no app code. The summary is a dict: ``batch``, ``total``, ``succeeded``, ``failed``,
``failed_ids`` (the first 1,000). It needs the JSON serializer without compression (the default);
an immutable signature (``.si()``) gets no summary.

``install(app)`` connects the worker's reports: ``task_postrun`` with state ``SUCCESS`` (succeeded)
or ``FAILURE`` (failed; a ``RETRY`` is not final, an ``IGNORED`` duplicate is not the run), and
``task_revoked`` (failed).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.canvas import Signature
from celery.signals import task_postrun, task_revoked

from ..batches import OpenBatch, report_end
from ..envelope import Envelope
from ..errors import BatchClosedError, ConfigError
from ..keys import batch_item_id
from ..store import BATCH_TTL_MS, MAX_FAILED_IDS, DelayStore
from ..store.batches import check_batch_key
from .message import StoredMessage
from .settings import CelerySettings, store_for

__all__ = ["BATCH_HEADER", "Batch", "capturing", "use_batches"]

log = logging.getLogger("delayq.celery.batches")

#: The header naming a task's batch.
BATCH_HEADER = "delayq_batch"

#: The task id whose message the sender captures instead of publishing (see :func:`capturing`).
_capture: ContextVar[_Captured | None] = ContextVar("delayq_capture", default=None)


class _Captured:
    """The message of one task id, as the sender would have published it."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.envelope: Envelope | None = None

    def producer(self, producer: Any) -> _CapturingProducer:
        """``producer``, except that the publish of this task id is kept here."""
        return _CapturingProducer(producer, self)


class _CapturingProducer:
    """Stands in for the kombu producer while Celery builds an on_complete message: its publish
    is kept, anything else (a ``task-sent`` event) goes to the real producer."""

    def __init__(self, producer: Any, captured: _Captured) -> None:
        self._producer = producer
        self._captured = captured

    def publish(self, body: Any, **kwargs: Any) -> Any:
        captured = self._captured
        if captured.envelope is None and (kwargs.get("headers") or {}).get("id") == captured.task_id:
            captured.envelope = StoredMessage.capture(body, kwargs).to_envelope()
            return None
        return self._producer.publish(body, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def capturing(task_id: str | None) -> _Captured | None:
    """The capture under way for ``task_id`` (the AMQP sender asks), else None."""
    captured = _capture.get()
    return captured if captured is not None and captured.task_id == task_id else None


@contextmanager
def _captured(task_id: str) -> Iterator[_Captured]:
    captured = _Captured(task_id)
    token = _capture.set(captured)
    try:
        yield captured
    finally:
        _capture.reset(token)


def on_complete_envelope(key: str, signature: Signature) -> tuple[Envelope, str]:
    """The message of ``signature`` for batch ``key``'s completion, and the mark standing for
    the summary in it ("" for an immutable signature).

    Raises:
        ConfigError: the message is not JSON without compression (the mark cannot be replaced).
    """
    immutable = bool(signature.immutable)
    mark = "" if immutable else f"dqbatch{uuid.uuid4().hex}"
    call = signature if immutable else signature.clone(args=(mark,))
    with _captured(batch_item_id(key)) as captured:
        call.apply_async(task_id=batch_item_id(key))
    if captured.envelope is None:
        raise ConfigError(f"batch {key!r}: the on_complete message of {signature!r} was not built; pass a signature")
    if mark and f'"{mark}"'.encode() not in captured.envelope.body:
        raise ConfigError(
            f"batch {key!r}: on_complete {signature.task!r} is not sent as JSON without compression, so the "
            "summary cannot be put in: send it with serializer='json' and no compression, or pass an immutable "
            "signature (.si()) that takes no summary"
        )
    return captured.envelope, mark


@dataclass
class _EagerBatch:
    """A batch under ``task_always_eager`` (a test suite): each sub-job runs in ``add``, as
    Celery runs any task then, and ``close`` calls on_complete with the summary at once. No
    store: an eager app sends nothing through it."""

    key: str
    on_complete: Signature | None
    total: int = 0
    failed_ids: list[str] = field(default_factory=list)
    closed: bool = False

    def ended(self, result: Any) -> None:
        self.total += 1
        if result.failed():
            self.failed_ids.append(str(result.id))

    def close(self) -> bool:
        if self.closed:
            return False
        self.closed = True
        failed = len(self.failed_ids)
        summary = {
            "batch": self.key, "total": self.total, "succeeded": self.total - failed, "failed": failed,
            "failed_ids": self.failed_ids[:MAX_FAILED_IDS],
        }  # fmt: skip
        if self.on_complete is not None:
            call = self.on_complete if self.on_complete.immutable else self.on_complete.clone(args=(summary,))
            call.apply_async(task_id=batch_item_id(self.key))
        return True


class Batch(OpenBatch):
    """A batch of tasks of ``app``, and ``on_complete`` once every one has finished.

    Under ``task_always_eager`` (a test suite) it runs eagerly: each sub-job runs in ``add`` and
    ``on_complete`` runs at ``close``, with the same summary, and the store is not used.

    Args:
        app: the Celery app (``install(app)`` done: its sender stores the sub-jobs).
        key: the batch's key (an order id, a request id): printable text.
        on_complete: a signature called with the summary dict as its first argument; None: only
            the notice on ``<prefix>:batch:<key>``.
        ttl: how long the batch stays readable once completed.

    Raises:
        BatchError: a bad key, or garbage in its keys. ConfigError: see :func:`on_complete_envelope`.
    """

    def __init__(
        self, app: Celery, key: str, *, on_complete: Signature | None = None, ttl: timedelta = timedelta(days=7)
    ) -> None:
        if getattr(app.amqp, "delayq_settings", None) is None or not CelerySettings.of(app).enabled:
            raise ConfigError(
                f"batch {key!r}: the app's sends do not go through the delay store, so sub-jobs would not be "
                "counted; call delayq_backends.celery.install(app) and leave delayq_enabled on"
            )
        self.app, self.key = app, check_batch_key(key)
        self._eager = _EagerBatch(key, on_complete) if app.conf.task_always_eager else None
        if self._eager is not None:
            return
        self.store: DelayStore = store_for(app)
        envelope, mark = (None, "") if on_complete is None else on_complete_envelope(key, on_complete)
        ttl_ms = int(ttl.total_seconds() * 1000) if ttl else BATCH_TTL_MS
        self.store.open_batch(key, on_complete=envelope, mark=mark, ttl_ms=ttl_ms)

    def add(self, signature: Signature, **options: Any) -> Any:
        """Send ``signature`` as a sub-job (``apply_async`` options: ``countdown``, ``eta``, ...);
        its AsyncResult.

        Raises:
            BatchClosedError: the batch is closed; the task was NOT sent.
        """
        headers = {**(signature.options.get("headers") or {}), **(options.pop("headers", None) or {})}
        if self._eager is not None and self._eager.closed:
            raise BatchClosedError(f"batch {self.key!r} is closed: the task was NOT sent; open a new batch")
        result = signature.apply_async(headers={**headers, BATCH_HEADER: self.key}, **options)
        if self._eager is not None:
            self._eager.ended(result)
        return result

    def close(self) -> bool:
        """No more sub-jobs; whether that completed the batch (eagerly: at once)."""
        return self._eager.close() if self._eager is not None else super().close()


def use_batches(app: Celery) -> None:
    """Connect the worker's batch reports (``install`` calls this); they act only on tasks that
    carry the header."""
    task_postrun.connect(_ended, weak=False, dispatch_uid="delayq-batch-end")
    task_revoked.connect(_revoked, weak=False, dispatch_uid="delayq-batch-revoked")


def _report(task: Any, request: Any, ok: bool) -> None:
    key = getattr(request, BATCH_HEADER, None)
    if key is None or task is None:
        return
    try:
        store = store_for(task.app)
    except Exception as exc:  # a worker hook: log, never raise
        log.warning("batch %r: no delay store (%s); the end of %s was not recorded", key, exc, request.id)
        return
    report_end(store, str(key), str(request.id), ok)


def _ended(sender: Any = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    if task is not None and state in ("SUCCESS", "FAILURE"):
        _report(task, task.request, state == "SUCCESS")


def _revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    _report(sender, request, False)
