"""Waiting jobs shown in RQ's own ``rq:scheduled:<queue>`` registry, where no RQ scheduler moves them.

A job a :class:`~delayq_backends.rq.Queue` schedules waits in the delay store; the store is
sharded across all queues, so it cannot answer "what waits on queue X" cheaply. RQ's tools
(``queue.scheduled_job_registry``, rq-dashboard's Scheduled tab) read ``rq:scheduled:<queue>``
directly. So each waiting job also stands there, as a *mirror* entry whose score is its ready
time plus :data:`MIRROR_OFFSET_S` (about 3,170 years): in time order, counted and listed by
RQ's code unchanged, and never due for an RQ scheduler, which only moves scores between 0 and
now (``rq worker --with-scheduler`` running beside a forwarder moves none of them, so nothing
runs twice or early). The forwarder removes the entry in the transaction that moves the job;
``job.cancel()`` and ``job.delete()`` remove it as RQ always does.

The trade-off: RQ's plain ``ScheduledJobRegistry.get_scheduled_time`` reads the mirror's
score, a date in the 52nd century; :class:`ScheduledJobRegistry` (what
``delayq_backends.rq.Queue.scheduled_job_registry`` returns) reads the exact time from the
store. An entry with a real score (a job scheduled by a plain ``rq.Queue``) is adopted by the
forwarder: see :mod:`.adopt`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry as RQScheduledJobRegistry

__all__ = [
    "MIRROR_OFFSET_S",
    "ScheduledJobRegistry",
    "forget_scheduled",
    "mirror_score",
    "mirror_scheduled",
    "registry_key",
]

#: Added to a waiting job's ready time (epoch seconds) in ``rq:scheduled:<queue>``: far past any
#: "now" an RQ scheduler compares with, yet exact to the millisecond in a double.
MIRROR_OFFSET_S = 10**11


def registry_key(queue_name: str) -> str:
    return RQScheduledJobRegistry.key_template.format(queue_name)


def mirror_scheduled(pipe: Any, queue_name: str, times: dict[str, float], *, only_existing: bool = False) -> None:
    """Queue on ``pipe`` the mirror entries of ``times`` (job id -> ready epoch seconds).

    ``only_existing`` (ZADD XX) turns an entry into a mirror only if it is still there: an RQ
    scheduler that moved the job meanwhile is not undone.
    """
    if times:
        pipe.zadd(registry_key(queue_name), {i: mirror_score(t) for i, t in times.items()}, xx=only_existing)


def mirror_score(ready_s: float) -> float:
    """The score of a job's mirror entry for its ready time (epoch seconds)."""
    return ready_s + MIRROR_OFFSET_S


def forget_scheduled(pipe: Any, queue_name: str, ids: Iterable[str]) -> None:
    """Queue on ``pipe`` the removal of ``ids`` from ``rq:scheduled:<queue>`` (moved or run now)."""
    ids = list(ids)
    if ids:
        pipe.zrem(registry_key(queue_name), *ids)


def is_mirror(score: float) -> bool:
    return score >= MIRROR_OFFSET_S


class ScheduledJobRegistry(RQScheduledJobRegistry):
    """RQ's registry of a delayq :class:`~delayq_backends.rq.Queue`: ids, count and order from the
    mirror entries, each job's exact time from the delay store.

    ``schedule`` and ``remove`` keep the store in step, so code that schedules or unschedules
    through the registry behaves as with RQ.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As RQ's: ``(name, connection=…)`` or ``(queue=…)``; a plain ``rq.Queue`` or a name
        gets a :class:`~delayq_backends.rq.Queue` of the same name, for its delay store."""
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        from .queue import Queue  # the queue module imports this one

        queue = kwargs.get("queue")
        self.delayq_queue: Queue = (
            queue
            if isinstance(queue, Queue)
            else Queue(self.name, connection=self.connection, job_class=self.job_class, serializer=self.serializer)
        )

    def get_scheduled_time(self, job_or_id: Job | str) -> datetime:
        """When the job is due (aware, UTC), to the millisecond.

        Raises:
            NoSuchJobError: it is not waiting, neither in the store nor with a real score here.
        """
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        item = self.delayq_queue.delay_store.get(job_id)
        if item is not None:
            return datetime.fromtimestamp(item.ready_ms / 1000, tz=timezone.utc)
        score = self.connection.zscore(self.key, job_id)
        if score is None or is_mirror(score):
            raise NoSuchJobError(f"Job {job_id} not found in {self.key}")
        return datetime.fromtimestamp(score, tz=timezone.utc)

    def get_expiration_time(self, job: Job) -> datetime:
        """The entry's time as RQ's registry keeps it: whole seconds (the mirror's offset taken off)."""
        score = self.connection.zscore(self.key, job.id)
        if score is not None and is_mirror(score):
            score = int(score - MIRROR_OFFSET_S)
        return datetime.fromtimestamp(score, timezone.utc)  # type: ignore[arg-type]

    def schedule(self, job: Job, scheduled_datetime: datetime, pipeline: Any | None = None) -> Any:
        """Put ``job`` (already saved) in the store at ``scheduled_datetime`` (naive: local time, as RQ).

        Unlike RQ's, this marks the job ``scheduled``: the forwarder moves only jobs still
        scheduled, which is what keeps a cancelled or already moved job from running twice.
        """
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        job.set_status(JobStatus.SCHEDULED, pipeline=pipe)
        self.delayq_queue.schedule_id(job, scheduled_datetime, pipe)
        if pipeline is None:
            pipe.execute()

    def remove(self, job: Job | str, pipeline: Any | None = None, delete_job: bool = False) -> Any:
        """Unschedule ``job`` here and in the store (and delete it with ``delete_job``)."""
        job_id = job.id if isinstance(job, Job) else job
        self.delayq_queue.delay_store.cancel(job_id)
        return super().remove(job, pipeline=pipeline, delete_job=delete_job)
