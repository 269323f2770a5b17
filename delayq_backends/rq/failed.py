"""Dead-lettered RQ jobs shown where RQ users look: RQ's ``FailedJobRegistry``.

When the forwarder dead-letters an RQ job's store item (its class is not allowed, its hash is
broken, it failed every attempt), the store keeps the dead letter (``delayq dlq``) and the job
is left as a worker's failure leaves one: status ``failed``, the reason as its ``exc_info`` and
latest Result, an entry in ``rq:failed:<queue>``, none in the Scheduled registry. rq-dashboard's
Failed tab, ``rq info`` and ``queue.failed_job_registry`` list it, and either side requeues it,
once:

- RQ's ``FailedJobRegistry.requeue`` (``rq requeue``, rq-dashboard's Requeue) enqueues the job
  on its queue now. The store's dead letter is spent: a ``delayq dlq requeue`` of it after that
  moves nothing (a periodic Scheduler job runs that once and is not re-armed).
- ``delayq dlq requeue`` schedules the item again; the forwarder moves the job off
  ``rq:failed:<queue>`` onto its queue (re-arming a periodic job), so RQ's requeue of it then
  finds nothing to requeue.

Which came first is told by the job hash's :data:`MARK` (the ``ended_at`` written with the
failure): RQ's requeue resets ``ended_at``, so a mark that differs from it is outdated. Nothing
is deserialized here: the reason is text the forwarder wrote, and every write is one script.
"""

from __future__ import annotations

import zlib
from base64 import b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from rq.defaults import DEFAULT_FAILURE_TTL
from rq.registry import FailedJobRegistry
from rq.results import Result
from rq.utils import utcformat

from ..scripts import RqFail, RqFailed, ScriptRunner
from .registry import registry_key

__all__ = ["MARK", "DeadJob", "failed_key", "record_failed"]

#: Job hash field: the ``ended_at`` the forwarder wrote when it failed the job (see the module doc).
MARK = "delayq_dead_letter"


@dataclass(frozen=True)
class DeadJob:
    """An RQ job whose store item was just dead-lettered."""

    item_id: str
    job_id: str
    error: str
    #: scheduled by :class:`~delayq_backends.rq.Scheduler` (it may wait with its last run's status)
    scheduler: bool


def failed_key(queue_name: str) -> str:
    """RQ's ``rq:failed:<queue>``."""
    return str(FailedJobRegistry.key_template.format(queue_name))


def exc_info(job: DeadJob, queue_name: str) -> str:
    """The reason as RQ users read a failure's traceback: what happened and both ways back."""
    return (
        f"Not run: `delayq forward` dead-lettered it: {job.error}\n"
        f"Requeue it once fixed: `rq requeue --queue {queue_name} {job.job_id}` enqueues it now; "
        f"`delayq dlq requeue {job.item_id}` schedules it again (and keeps a periodic job's schedule)."
    )


def record_failed(
    scripts: ScriptRunner, queue_name: str, job_key: Callable[[str], str], jobs: Sequence[DeadJob]
) -> int:
    """Fail ``jobs`` (all of queue ``queue_name``) in RQ's FailedJobRegistry; returns how many
    were changed (a job gone, cancelled, or already in RQ's hands is left alone)."""
    now = datetime.now(timezone.utc)
    failed = []
    for job in jobs:
        text = exc_info(job, queue_name).encode()
        failed.append(
            RqFailed(
                job_id=job.job_id,
                job_key=job_key(job.job_id),
                results_key=Result.get_key(job.job_id),  # type: ignore[no-untyped-call]
                scheduler=job.scheduler,
                exc_info=zlib.compress(text),
                exc_string=b64encode(zlib.compress(text)).decode(),
            )
        )
    call = RqFail.call(
        failed_key(queue_name), registry_key(queue_name), failed,
        now=now.timestamp(), ended_at=utcformat(now), ttl=DEFAULT_FAILURE_TTL,
    )  # fmt: skip
    return scripts.run(call)
