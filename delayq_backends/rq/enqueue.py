"""What RQ's enqueue writes for the jobs of a move, queued on its MULTI (see :mod:`.target`):
the job hash fields ``Queue._enqueue_job`` writes, the pushes onto the queue, a deferred job's
dependency sets, a rate-limited job's registry, and the TTLs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import redis
from rq.job import JobStatus
from rq.registry import DeferredJobRegistry
from rq.utils import utcformat

from ..scripts import RqEnqueue, ScriptRunner
from ..store.lease import Lease
from .failed import MARK, failed_key
from .jobs import JobFields, MoveBatch, QueueKeys
from .registry import forget_scheduled
from .repeats import rearm

__all__ = ["EnqueueWrites"]

_DEFERRED = JobStatus.DEFERRED.value


@dataclass(frozen=True)
class _JobRef:
    """What RQ's registries take of a job: its id."""

    id: str


@dataclass
class _Pushes:
    """A batch's pushes onto one queue, sent as one RPUSH and one LPUSH.

    The list ends up as with one push per job, in order (RQ's own scheduler): RPUSH a, c equals
    RPUSH a; RPUSH c, and LPUSH b, d equals LPUSH b; LPUSH d, whatever the interleaving.
    """

    queue: str
    back: list[str] = field(default_factory=list)
    front: list[str] = field(default_factory=list)

    def add(self, job_id: str, at_front: bool) -> None:
        (self.front if at_front else self.back).append(job_id)

    def flush(self, pipe: Any) -> None:
        if self.back:
            pipe.rpush(self.queue, *self.back)
        if self.front:
            pipe.lpush(self.queue, *self.front)
        self.back, self.front = [], []


class EnqueueWrites:
    """Queues the writes that enqueue a batch's jobs on RQ's Redis (``connection``)."""

    def __init__(self, connection: redis.Redis, scripts: ScriptRunner) -> None:
        self.connection = connection
        self.scripts = scripts

    def queue(self, batch: MoveBatch, pipe: Any, shared: Lease | None) -> None:
        """Queue the enqueues (and, when shared, the ack and re-arms) on the MULTI."""
        keys = batch.keys
        pipe.sadd(keys.queue_class.redis_queues_keys, keys.queue)
        pushes = _Pushes(keys.queue)
        plain: list[tuple[str, JobFields]] = []  # their hash writes go in one script call
        for job_id, job in batch.jobs.items():
            if job.dead_letter:  # off RQ's Failed registry: RQ's requeue then finds it gone
                pipe.zrem(failed_key(keys.name), job_id)
            if job.dead_letter is not None:  # spent: a later schedule of this id moves as usual
                pipe.hdel(batch.job_keys[job_id], MARK)
            if job_id in batch.deferred:
                self._defer(pipe, keys, job_id, job)
            elif job.rate_limit_key and job.rate_limit_concurrency:
                pushes.flush(pipe)  # its promotion may push too: keep the order
                self._enqueue_rate_limited(pipe, keys, job_id, job)
            else:
                if job.status == _DEFERRED or (job.ttl is not None and job.ttl > 0):
                    self._enqueue_extra(pipe, keys, job_id, job)
                plain.append((job_id, job))
                pushes.add(job_id, job.at_front)
        self._enqueue(pipe, keys, batch.job_keys, plain)
        pushes.flush(pipe)
        forget_scheduled(pipe, keys.name, [*batch.jobs, *batch.skipped])  # the registry's mirror entries
        if shared is not None:
            moved = list(batch.jobs)
            shared.ack(batch.items(batch.skipped + moved), pipeline=pipe)
            rearm(batch, moved, pipe, shared)

    def _enqueue(
        self, pipe: Any, keys: QueueKeys, job_keys: Mapping[str, str], jobs: Sequence[tuple[str, JobFields]]
    ) -> None:
        """The job hash fields ``Queue._enqueue_job`` writes for due jobs (rq 1.16 to 3.x):
        status ``queued``, ``origin``, ``enqueued_at``, and the queue's default timeout for a job
        without one; one ``rq_enqueue`` script call for the batch rather than an HSET per job
        (see rq_enqueue.lua). The push onto the queue is the caller's (:class:`_Pushes`)."""
        if not jobs:
            return
        enqueued_at = utcformat(datetime.now(timezone.utc))
        mask = "".join("1" if job.timeout is None else "0" for _, job in jobs)
        call = RqEnqueue.call(
            [job_keys[job_id] for job_id, _ in jobs],
            status=JobStatus.QUEUED.value,
            origin=keys.name,
            enqueued_at=enqueued_at,
            timeout=str(keys.default_timeout),
            mask=mask,
        )
        self.scripts.queue(call, pipe)

    def _enqueue_extra(self, pipe: Any, keys: QueueKeys, job_id: str, job: JobFields) -> None:
        """The rest of ``Queue._enqueue_job`` for the jobs that need it: out of the deferred
        registry (a job whose dependencies held it), and the TTL on its keys."""
        if job.status == JobStatus.DEFERRED.value:
            self._deferred(keys).remove(job_id, pipeline=pipe)
        self._expire(pipe, keys, job_id, job.ttl)

    def _defer(self, pipe: Any, keys: QueueKeys, job_id: str, job: JobFields) -> None:
        """What ``Queue.setup_dependencies`` writes for a job waiting on unfinished dependencies."""
        pipe.hset(keys.job(job_id), mapping={"status": JobStatus.DEFERRED.value, "origin": keys.name})
        self._deferred(keys).add(_JobRef(job_id), pipeline=pipe)  # type: ignore[arg-type]
        for dep in job.dependency_ids:
            pipe.sadd(keys.dependents(dep), job_id)
            pipe.sadd(keys.dependencies(job_id), dep)
        self._expire(pipe, keys, job_id, job.ttl)

    def _deferred(self, keys: QueueKeys) -> DeferredJobRegistry:
        return DeferredJobRegistry(keys.name, connection=self.connection, job_class=keys.job_class)

    def _enqueue_rate_limited(self, pipe: Any, keys: QueueKeys, job_id: str, job: JobFields) -> None:
        """What rq 3's ``Queue._enqueue_rate_limited_job`` writes with a pipeline."""
        from rq.rate_limit import RateLimitRegistry  # rq 3 only, as are rate-limited jobs

        assert job.rate_limit_key and job.rate_limit_concurrency
        registry = RateLimitRegistry(job.rate_limit_key, self.connection)
        registry.register(job.rate_limit_concurrency, pipe)
        fields = {"status": JobStatus.RATE_LIMITED.value, "origin": keys.name}
        if job.timeout is None:
            fields["timeout"] = str(keys.default_timeout)
        if job.at_front:
            fields["enqueue_at_front"] = "1"
        pipe.hset(keys.job(job_id), mapping=fields)
        self._expire(pipe, keys, job_id, job.ttl)
        registry.add_to_rate_limited(job_id, pipe)
        registry.acquire_and_enqueue(job.rate_limit_concurrency, pipeline=pipe)

    @staticmethod
    def _expire(pipe: Any, keys: QueueKeys, job_id: str, ttl: int | None) -> None:
        """``Job.cleanup(ttl)`` as the enqueue calls it: a positive TTL expires the job's keys."""
        if ttl is not None and ttl > 0:
            for key in (keys.job(job_id), keys.dependents(job_id), keys.dependencies(job_id)):
                pipe.expire(key, ttl)
