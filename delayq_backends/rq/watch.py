"""Dead RQ workers noticed within two beats, not at RQ's next maintenance.

A whole worker killed (the worker and its work horse, ``kill -9`` of its process group, a lost
machine) runs no hook: its job stays ``started`` in the queue's StartedJobRegistry until RQ's
abandoned-job cleanup, which runs in a live worker's maintenance (at its start and every 10
minutes) and only once the dead worker's entry has expired (the job's timeout, at most the
monitoring interval, plus 60 s): 838 s measured with RQ's defaults. A batch waited that long for
the job's end.

:class:`WorkerWatch` (mixed into the slot, dedupe and batch-reporting workers) runs a thread in the
worker process that, every ``DELAYQ_WORKER_BEAT`` seconds (5 by default):

- **beats**: writes ``delayq_beat`` ("<epoch ms> <beat ms>") into the worker's own hash
  ``rq:worker:<name>``, beside RQ's ``last_heartbeat`` (which a forking worker writes every 30 s
  while busy, and a ``SimpleWorker`` not at all mid-job);
- **sweeps**: for each job in its queues' StartedJobRegistry, reads the job's ``worker_name`` and
  that worker's hash: the worker is dead when its hash is gone (RQ's own TTL lapsed) or its last
  ``delayq_beat`` is older than two of its beats. Its jobs are then handled by RQ's own cleanup
  (``StartedJobRegistry.cleanup``, under the queue's maintenance lock as RQ takes it, the dead
  entries' scores set to 0 so that nothing else is swept): retried when retries are left, else
  failed, failure callbacks and (RQ >= 2) exception handlers called, dependents enqueued. A sub-job
  of a batch failed so is reported failed to its batch here (its retry reports its own end).

A worker not running this watch (RQ's own class) is seen dead once its hash expires (90 s after
its last heartbeat while busy); its jobs are swept then. A live worker stalled past two beats (a
frozen machine, SIGSTOP) is taken for dead: its job runs again elsewhere or fails, as after RQ's
own timeout, only sooner; ``DELAYQ_WORKER_BEAT`` sets the trade.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from redis.exceptions import RedisError
from rq import Queue as RQQueue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry

from .queue import env_int

__all__ = ["BEAT_FIELD", "WORKER_BEAT_ENV", "WorkerWatch", "dead_members"]

log = logging.getLogger("delayq.rq.watch")

WORKER_BEAT_ENV = "DELAYQ_WORKER_BEAT"
#: The field of ``rq:worker:<name>`` the watch beats: "<epoch ms> <beat ms>".
BEAT_FIELD = "delayq_beat"
#: Beats a worker may miss before it is dead.
MISSED_BEATS = 2


def _beat_seconds() -> int:
    return env_int(
        WORKER_BEAT_ENV, "5", "seconds between a worker's beats (a dead worker is seen after two)", low=1, high=300
    )


def _dead(hash_fields: list[bytes | None], exists: bool, now_ms: int) -> bool:
    """Whether a worker is dead by its hash: gone, or its last beat older than two of its beats."""
    if not exists:
        return True
    (beat,) = hash_fields
    if beat is None:  # a worker without the watch: alive while RQ keeps its hash
        return False
    try:
        at_ms, every_ms = (int(part) for part in beat.split())
    except ValueError:
        return False  # not ours to judge
    return now_ms - at_ms > MISSED_BEATS * every_ms


def dead_members(client: redis.Redis, registry_key: str, worker_prefix: str, now_ms: int, alive: str) -> list[bytes]:
    """The members of a StartedJobRegistry (``<job id>`` on RQ 1.x, ``<job id>:<execution id>``
    on RQ >= 2) whose job's worker is dead; ``alive``, the asking worker's name, is never dead."""
    members: list[bytes] = list(client.zrange(registry_key, 0, -1))  # type: ignore[arg-type]
    if not members:
        return []
    with client.pipeline(transaction=False) as pipe:
        for member in members:
            pipe.hget(Job.key_for(member.split(b":", 1)[0].decode()), "worker_name")
        names = pipe.execute()
    workers = sorted({name.decode() for name in names if name and name.decode() != alive})
    with client.pipeline(transaction=False) as pipe:
        for name in workers:
            pipe.exists(worker_prefix + name)
            pipe.hmget(worker_prefix + name, [BEAT_FIELD])
        replies = pipe.execute()
    dead = {name for i, name in enumerate(workers) if _dead(replies[2 * i + 1], bool(replies[2 * i]), now_ms)}
    return [member for member, name in zip(members, names) if name and name.decode() in dead]


class WorkerWatch:
    """The beat and the sweep of dead workers' jobs (see the module), mixed into a worker class
    before RQ's; the class says what a job the sweep failed means (:meth:`_failed_by_sweep`)."""

    connection: Any
    name: str
    queues: list[Any]
    redis_worker_namespace_prefix: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._beat_s = _beat_seconds()  # a bad setting stops the worker at start
        self._watch_stop = threading.Event()
        super().__init__(*args, **kwargs)

    def work(self, *args: Any, **kwargs: Any) -> Any:
        # its own connection pool: the work horse forks from the main thread while this one may
        # hold a connection of the worker's pool
        client = redis.Redis(connection_pool=redis.ConnectionPool(**self.connection.connection_pool.connection_kwargs))
        thread = threading.Thread(target=self._watch, args=(client,), name="delayq-worker-watch", daemon=True)
        thread.start()
        try:
            return super().work(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._watch_stop.set()
            thread.join(timeout=5)
            client.close()

    def register_birth(self, *args: Any, **kwargs: Any) -> None:
        super().register_birth(*args, **kwargs)  # type: ignore[misc]
        # the first beat at once: a worker killed before its first beat of the thread must not
        # read as one without the watch (alive until RQ's own TTL, 90 s while busy)
        self._beat(self.connection)

    def _watch(self, client: redis.Redis) -> None:
        while not self._watch_stop.wait(self._beat_s):
            try:
                self._beat(client)
                for queue in self.queues:
                    self._sweep(client, queue)
            except (RedisError, OSError) as exc:
                log.warning("worker %s: beat or sweep of dead workers failed (%s); trying again", self.name, exc)
            except Exception:  # a thread of the worker: it must go on beating whatever one sweep met
                log.exception("worker %s: the sweep of dead workers failed; trying again", self.name)

    def _beat(self, client: redis.Redis) -> None:
        key = self.redis_worker_namespace_prefix + self.name
        if client.exists(key):  # never remake a hash RQ let expire or deleted: it would live for ever
            client.hset(key, BEAT_FIELD, f"{int(time.time() * 1000)} {self._beat_s * 1000}")

    def _sweep(self, client: redis.Redis, queue: Any) -> None:
        """Hand the jobs of ``queue`` whose worker died to RQ's abandoned-job cleanup now."""
        registry = StartedJobRegistry(
            queue.name, connection=client, job_class=queue.job_class, serializer=queue.serializer
        )
        now_ms = int(time.time() * 1000)
        dead = dead_members(client, registry.key, self.redis_worker_namespace_prefix, now_ms, self.name)
        if not dead:
            return
        lock = RQQueue(queue.name, connection=client)
        if not lock.acquire_maintenance_lock():  # RQ's maintenance is cleaning it: the next beat looks again
            return
        try:
            client.zadd(registry.key, {member: 0 for member in dead}, xx=True)
            registry.cleanup(0)
        finally:
            lock.release_maintenance_lock()  # type: ignore[no-untyped-call]
        for member in dead:
            job_id = member.split(b":", 1)[0].decode()
            try:
                job = queue.job_class.fetch(job_id, connection=client, serializer=queue.serializer)
            except NoSuchJobError:
                continue
            status = job.get_status(refresh=False)
            log.warning(
                "job %s: its worker %s died; RQ's abandoned-job cleanup made it %s", job_id, job.worker_name, status
            )
            if status == JobStatus.FAILED:
                self._failed_by_sweep(job)

    def _failed_by_sweep(self, job: Job) -> None:
        """``job``, whose worker died, was failed by the sweep (no retries left)."""
        raise NotImplementedError
