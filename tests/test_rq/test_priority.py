"""RQ's ``at_front`` under a backlog: such jobs get a higher store rank, so a forwarder moves
them before the jobs that queue behind them (the store side is tests/test_priority.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import redis
from rq.job import Job

from delayq_backends import DelayStore
from delayq_backends.rq import Queue, Scheduler
from delayq_backends.rq.jobs import AT_FRONT_RANK
from tests.harness.rq import Processes
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"


def test_at_front_jobs_get_a_rank(queue: Queue, rq_store: DelayStore, conn: redis.Redis) -> None:
    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    back = queue.enqueue_at(later, RECORD, "back")
    front = queue.enqueue_at(later, RECORD, "front", at_front=True)
    via_scheduler = scheduler.enqueue_at(later.replace(tzinfo=None), RECORD, "s", at_front=True)
    assert [rq_store.rank(job.id) for job in (back, front, via_scheduler)] == [0, AT_FRONT_RANK, AT_FRONT_RANK]


def test_forwarder_process_moves_at_front_jobs_first(
    queue: Queue, rq_store: DelayStore, conn: redis.Redis, processes: Processes
) -> None:
    """300 due jobs and 20 at_front ones, a real `delayq forward --rq-redis` with batch 10: every
    at_front job is enqueued before every other job of its shard, and all are enqueued."""
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    back = [queue.enqueue_at(later, RECORD, "back").id for _ in range(300)]
    front = [queue.enqueue_at(later, RECORD, "front", at_front=True).id for _ in range(20)]
    past = datetime.now(timezone.utc) - timedelta(seconds=10)
    for n, job_id in enumerate(back + front):
        assert rq_store.reschedule(job_id, past + timedelta(milliseconds=n))
    processes.forwarder("--batch", "10")
    wait_for(lambda: queue.count >= 320, 60, lambda: f"320 queued jobs, got {queue.count}")
    assert sorted(queue.job_ids[:20]) == sorted(front)  # at the front of the queue, as RQ puts them
    enqueued = {j.id: j.enqueued_at for j in Job.fetch_many(back + front, connection=conn) if j is not None}
    assert len(enqueued) == 320
    compared = 0
    for shard in range(4):  # 20 random ids may leave a shard with no at_front job
        fronts = [enqueued[j] for j in front if rq_store.shard_of(j) == shard]
        backs = [enqueued[j] for j in back if rq_store.shard_of(j) == shard]
        if fronts and backs:
            assert max(fronts) <= min(backs)
            compared += 1
    assert compared >= 2
