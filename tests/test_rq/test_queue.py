"""delayq_backends.rq.Queue: scheduled jobs wait in the delay store and run once, on time, through
real `rq worker --queue-class delayq_backends.rq.Queue` and `delayq forward --rq-redis` processes."""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta, timezone

import pytest
import redis
import rq
from rq import Retry
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from delayq_backends import ConfigError, DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue
from tests.harness.rq import Processes, runs
from tests.helpers import ms_at_or_after, wait_for


def test_schedule_job_saves_the_job_as_rq_does_and_its_id_in_the_store(queue: Queue, rq_store: DelayStore) -> None:
    when = datetime.now(timezone.utc) + timedelta(minutes=5)
    job = queue.enqueue_at(when, "tests.test_rq.jobs.record", "a", job_id="j-1", at_front=True)
    saved = Job.fetch("j-1", connection=queue.connection)
    assert saved.get_status() == JobStatus.SCHEDULED
    assert saved.args == ("a",) and saved.enqueue_at_front
    registry = ScheduledJobRegistry(queue=queue)  # RQ's own: lists the job, and its scheduler never moves it
    assert job in registry and registry.get_jobs_to_schedule(int(when.timestamp()) + 10**9) == []
    assert queue.connection.sismember("rq:queues", queue.key)
    item = rq_store.get("j-1")
    assert item is not None and item.ready_ms == ms_at_or_after(when)
    envelope = Envelope.decode(item.envelope)
    assert (envelope.target, envelope.destination, envelope.body) == ("rq", queue.name, b"")
    assert envelope.meta == {"queue_class": "delayq_backends.rq.queue.Queue"}


@pytest.mark.alone  # lateness bounds: a busy core makes jobs late
def test_500_jobs_run_once_not_before_their_time_with_their_args_and_results(
    queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    rng = random.Random(4)
    due: dict[str, float] = {}
    start = time.time()
    for i in range(500):
        delay = 2 + 6 * rng.random()
        if i % 2:
            job = queue.enqueue_in(timedelta(seconds=delay), "tests.test_rq.jobs.record", i, times=i % 7)
        else:
            at = datetime.fromtimestamp(start + delay, tz=timezone.utc)
            job = queue.enqueue_at(at, "tests.test_rq.jobs.record", i, times=i % 7)
        item = rq_store.get(job.id)
        assert item is not None
        due[job.id] = item.ready_ms / 1000
    processes.forwarder()
    processes.forwarder()
    processes.worker(queue.name)
    wait_for(lambda: queue.connection.llen(f"{queue.name}:runs") >= 500, 60, "500 runs")
    seen = runs(queue.connection, queue.name)
    assert len(seen) == 500 and len({r["id"] for r in seen}) == 500  # each exactly once
    late = []  # forwarding lateness: enqueued_at (set by the forwarder) - scheduled time
    for run in seen:
        job = Job.fetch(run["id"], connection=queue.connection)
        assert run["at"] >= due[run["id"]], f"job {run['id']} started {due[run['id']] - run['at']:.3f} s early"
        assert job.enqueued_at is not None
        late.append(job.enqueued_at.timestamp() - due[job.id])
        assert job.args == (run["tag"],) and job.kwargs == {"times": run["tag"] % 7}
        wait_for(lambda j=job: j.get_status() == JobStatus.FINISHED, 10, f"job {job.id} finished")
        assert job.return_value() == f"{run['tag']}x{run['tag'] % 7}"
    assert rq_store.stats()[0].scheduled == 0 and sum(s.scheduled for s in rq_store.stats()) == 0
    late.sort()
    assert late[0] >= 0, f"a job was queued {-late[0]:.3f} s early"
    assert late[len(late) // 2] < 0.2, f"median forwarding lateness {late[len(late) // 2]:.3f} s"


def test_at_front_jobs_go_to_the_head_of_the_queue(queue: Queue, forwarder: Forwarder) -> None:
    waiting = queue.enqueue("tests.test_rq.jobs.record", "waiting")
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    back = queue.enqueue_at(past, "tests.test_rq.jobs.record", "back")
    front = queue.enqueue_at(past, "tests.test_rq.jobs.record", "front", at_front=True)
    assert forwarder.run_once() == 2
    assert queue.job_ids == [front.id, waiting.id, back.id]
    for job in (front, back):
        job.refresh()
        assert job.get_status() == JobStatus.QUEUED and job.origin == queue.name
        assert job.enqueued_at is not None and job.timeout == queue._default_timeout


def test_depends_on_is_not_checked_when_due_as_with_rqs_own_scheduler(queue: Queue, forwarder: Forwarder) -> None:
    """RQ's built-in scheduler moves a due job whatever its dependencies (rq#1404); so do we.
    The Scheduler, like rq-scheduler, defers it instead (see test_scheduler)."""
    parent = queue.enqueue("tests.test_rq.jobs.record", "parent")
    child = queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.record", "child", depends_on=parent)
    wait_for(lambda: forwarder.run_once() == 1, 5, "the child forwarded")
    assert child.get_status() == JobStatus.QUEUED and queue.job_ids == [parent.id, child.id]


def test_retry_with_intervals_goes_through_the_delay_store(
    queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    job = queue.enqueue("tests.test_rq.jobs.always_fails", "r", retry=Retry(max=3, interval=[1, 2]))
    processes.forwarder()
    processes.worker(queue.name)
    wait_for(lambda: len(runs(queue.connection, queue.name)) == 1, 20, "the first run")
    wait_for(lambda: rq_store.exists(job.id), 5, "the first retry scheduled in the delay store")
    wait_for(
        lambda: job.get_status() == JobStatus.FAILED and len(runs(queue.connection, queue.name)) == 4, 30, "3 retries"
    )
    at = [r["at"] for r in runs(queue.connection, queue.name)]
    gaps = [b - a for a, b in zip(at, at[1:])]
    # RQ applies a list of intervals from its end as retries run out: 1, 1, 2 for max=3, [1, 2]
    for gap, interval in zip(gaps, [1, 1, 2]):
        assert interval <= gap < interval + 1.0, f"retry gaps {gaps}, RQ's intervals [1, 1, 2]"
    assert queue.connection.zcard(ScheduledJobRegistry(queue=queue).key) == 0
    assert rq_store.get(job.id) is None


def test_cancelled_and_deleted_jobs_never_run(queue: Queue, rq_store: DelayStore, processes: Processes) -> None:
    soon = timedelta(milliseconds=300)
    cancelled = queue.enqueue_in(soon, "tests.test_rq.jobs.record", "cancelled")
    deleted = queue.enqueue_in(soon, "tests.test_rq.jobs.record", "deleted")
    queue.enqueue_in(soon * 3, "tests.test_rq.jobs.record", "control")
    cancelled.cancel()
    deleted.delete()
    processes.forwarder()
    processes.worker(queue.name)
    wait_for(lambda: len(runs(queue.connection, queue.name)) == 1, 20, "the control job ran")
    assert [r["tag"] for r in runs(queue.connection, queue.name)] == ["control"]
    assert not rq_store.exists(cancelled.id) and not rq_store.exists(deleted.id)  # skipped and acked
    assert cancelled.get_status() == JobStatus.CANCELED and not Job.exists(deleted.id, connection=queue.connection)


def test_worker_queue_class_reads_the_store_settings_from_the_environment(
    conn: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rq worker --queue-class` builds queues itself: DELAYQ_PREFIX/DELAYQ_SHARDS reach them."""
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)
    monkeypatch.setenv("DELAYQ_SHARDS", "4")
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    q = Queue(f"{prefix}-env", connection=conn)
    assert q.delay_store.config.prefix == prefix and q.delay_store.shards == 4
    assert q.delay_store.client is conn  # by default the queue's own Redis
    assert Queue(f"{prefix}-env2", connection=conn).delay_store is q.delay_store  # cached
    monkeypatch.setenv("DELAYQ_SHARDS", "many")
    with pytest.raises(ConfigError, match="DELAYQ_SHARDS='many'"):
        Queue(f"{prefix}-env3", connection=conn).enqueue_in(timedelta(1), "tests.test_rq.jobs.record", 1)


@pytest.mark.skipif(not hasattr(rq, "Repeat"), reason="Repeat is new in RQ 2.x")
def test_repeat_with_an_interval_goes_through_the_delay_store(
    queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    job = queue.enqueue("tests.test_rq.jobs.record", "again", repeat=rq.Repeat(times=2, interval=1))
    processes.forwarder()
    processes.worker(queue.name)
    wait_for(lambda: len(runs(queue.connection, queue.name)) == 1, 20, "the first run")
    wait_for(lambda: rq_store.exists(job.id), 5, "the repeat scheduled in the delay store")
    wait_for(lambda: len(runs(queue.connection, queue.name)) == 3, 20, "two repeats")
    at = [r["at"] for r in runs(queue.connection, queue.name)]
    assert all(0.9 <= b - a < 2 for a, b in zip(at, at[1:])), f"runs at {at}"
    assert queue.connection.zcard(ScheduledJobRegistry(queue=queue).key) == 0


@pytest.mark.skipif(not hasattr(rq, "RateLimit"), reason="rate limits are new in RQ 3")
def test_rate_limited_jobs_move_as_rqs_own_scheduler_moves_them(queue: Queue, forwarder: Forwarder) -> None:
    limit = rq.RateLimit(f"{queue.name}-limit", 1)
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    first = queue.enqueue_at(past, "tests.test_rq.jobs.record", 1, rate_limit=limit)
    second = queue.enqueue_at(past + timedelta(milliseconds=1), "tests.test_rq.jobs.record", 2, rate_limit=limit)
    assert forwarder.run_once() == 2
    (moved,) = queue.job_ids  # one slot: the other waits for it (shards are visited in any order)
    statuses = {job.id: job.get_status() for job in (first, second)}
    assert statuses.pop(moved) == JobStatus.QUEUED and list(statuses.values()) == [JobStatus.RATE_LIMITED]


def test_rq_enqueue_schedule_in_on_the_command_line_goes_to_the_store(
    queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    args = ["-m", "rq.cli", "enqueue", "-u", processes.url, "--queue-class", "delayq_backends.rq.Queue",
            "-q", queue.name, "--job-id", "cli-1", "--schedule-in", "1h", "tests.test_rq.jobs.record", "x"]  # fmt: skip
    processes.start(*args).wait(30)
    item = rq_store.get("cli-1")
    assert item is not None and abs(item.ready_ms / 1000 - (time.time() + 3600)) < 30
    assert Job.fetch("cli-1", connection=queue.connection).get_status() == JobStatus.SCHEDULED
    assert ScheduledJobRegistry(queue=queue).get_job_ids() == ["cli-1"]  # listed, as a mirror entry
    assert queue.scheduled_job_registry.get_scheduled_time("cli-1").timestamp() * 1000 == item.ready_ms
