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
score, a date in the 52nd century; :class:`~delayq_backends.rq.ScheduledJobRegistry` (what
``delayq_backends.rq.Queue.scheduled_job_registry`` returns) reads the exact time from the
store. An entry with a real score (a job scheduled by a plain ``rq.Queue``) is adopted by the
forwarder: see :mod:`.adopt`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rq.registry import ScheduledJobRegistry as RQScheduledJobRegistry

__all__ = [
    "MIRROR_OFFSET_S",
    "forget_scheduled",
    "is_mirror",
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
