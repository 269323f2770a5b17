"""Record when Celery tasks start, for ``delayq spark audit``: one ``executed`` record per run.

Call :func:`record_executions` where the workers load the app (next to ``install(app)``)::

    from delayq_backends.celery.audit import record_executions
    record_executions()          # DELAYQ_AUDIT_DIR or DELAYQ_AUDIT_STREAM; nothing if neither is set
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery.signals import task_prerun

from ..audit import EXECUTED, AuditRecord, AuditSink, audit_from_env
from .message import KIND, parse_time

__all__ = ["record_executions"]


def record_executions(sink: AuditSink | None = None) -> Callable[[], None] | None:
    """Log an ``executed`` record as each task starts in this process's workers.

    Args:
        sink: where to; by default the audit log of ``DELAYQ_AUDIT_DIR``/``DELAYQ_AUDIT_STREAM``.

    Returns:
        A function that stops the recording, or None when no audit log is configured.
    """
    audit = sink if sink is not None else audit_from_env(stem="executed")
    if audit is None:
        return None

    def on_prerun(sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
        request = getattr(task, "request", None)
        if request is None or task_id is None:
            return
        eta = parse_time(request.eta)
        delivery = request.delivery_info or {}
        queue = delivery.get("routing_key") or delivery.get("exchange") or ""
        record = AuditRecord(
            EXECUTED,
            task_id,
            KIND,
            str(queue),
            None if eta is None else int(eta.timestamp() * 1000),
            time.time_ns() // 1_000_000,
            int(request.retries or 0),
            str(request.hostname or ""),
        )
        audit.record([record])

    task_prerun.connect(on_prerun, weak=False)
    return lambda: task_prerun.disconnect(on_prerun)
