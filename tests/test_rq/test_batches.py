"""Batches with real ``rq worker --worker-class delayq_backends.rq.SlotWorker`` processes and a
real ``delayq forward --rq-redis``: a batch of 30 jobs (some failing after a retry, some delayed)
completes once, after its last job, and its on_complete gets the right summary."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import signal
import time
from datetime import timedelta

import pytest
import redis
from rq import Callback, Retry
from rq.job import Job
from rq.registry import ScheduledJobRegistry as RQScheduledJobRegistry

from delayq_backends import DelayStore
from delayq_backends.errors import BatchClosedError, BatchError
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import batch_channel, batch_item_id
from delayq_backends.rq import Batch, Queue, RQTarget, Scheduler
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for
from tests.test_rq.jobs import always_fails, record, started

WORKER = ("--worker-class", "delayq_backends.rq.SlotWorker")


def test_a_batch_of_30_completes_once_with_the_right_summary(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    notices = conn.pubsub()
    notices.subscribe(batch_channel(rq_store.config.prefix, "order-30"))
    with Batch(queue, "order-30", on_complete=Callback("tests.test_rq.jobs.batch_done")) as batch:
        ok = [batch.add(record, f"ok{i}").id for i in range(18)]
        later = [batch.add(record, f"later{i}", in_=timedelta(seconds=2)).id for i in range(6)]
        # each fails, is retried once and fails again: one final failure
        failing = [batch.add(always_fails, f"bad{i}", retry=Retry(max=1)).id for i in range(6)]
    with pytest.raises(BatchClosedError):
        batch.add(record, "late")
    for _ in range(2):
        processes.worker(queue.name, extra=WORKER)
    processes.forwarder("--poll", "0.2")
    done = lambda: [r for r in runs(conn, queue.name) if r["tag"] == "done"]  # noqa: E731
    wait_for(lambda: done(), 90, lambda: f"{rq_store.batch_status('order-30')}")
    (run,) = done()
    summary = run["summary"]
    assert (summary["batch"], summary["total"], summary["succeeded"], summary["failed"]) == ("order-30", 30, 24, 6)
    assert sorted(summary["failed_ids"]) == sorted(failing)
    assert run["id"] == batch_item_id("order-30")
    subs = [r for r in runs(conn, queue.name) if r["id"] in {*ok, *later, *failing}]
    assert len(subs) == 30 + 6  # the failing jobs ran twice
    assert run["at"] >= max(r["at"] for r in subs)
    messages = []
    while (m := notices.get_message(timeout=1)) is not None:
        if m["type"] == "message":
            messages.append(json.loads(m["data"]))
    assert messages == [summary]
    wait_for(lambda: rq_store.get(batch_item_id("order-30")) is None, 10, "on_complete moved and acked")
    assert len(done()) == 1


def test_a_job_that_cannot_be_saved_is_not_counted(queue: Queue, rq_store: DelayStore) -> None:
    batch = Batch(queue, "b")
    # RQ cannot pickle the job after the count (RQ >= 2 also refuses a bad job id; RQ 1.16 does not)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        batch.add(record, lambda: None)
    status = rq_store.batch_status("b")
    assert status is not None and status.total == 0
    job = batch.add(record, "y")
    assert job.meta["delayq_batch"] == "b" and rq_store.get(job.id) is not None  # no delay: stored all the same
    with pytest.raises(BatchError, match="letters, digits"):
        Batch(queue, "a:b")


@pytest.mark.slow
def test_a_batch_of_1000_completes_once_under_work_horse_and_forwarder_kills(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    """4 ``rq worker`` processes and a forwarder while a batch of 1,000 jobs (100 failing, 300
    delayed) runs: work horses SIGKILLed mid-job (RQ fails the job in the worker and retries it),
    the forwarder SIGKILLed and restarted. on_complete runs exactly once, after every job's end,
    with the right counts."""
    rng = random.Random(11)
    kinds: dict[str, str] = {}
    with Batch(queue, "big", on_complete=Callback("tests.test_rq.jobs.batch_done")) as batch:
        for i in range(1000):
            delay = timedelta(seconds=rng.uniform(0, 8)) if i % 10 in (1, 2, 3) else None
            if i % 10 == 0:
                job = batch.add(always_fails, f"f{i}", in_=delay, retry=Retry(max=1))
            else:
                job = batch.add(started, f"s{i}", 0.1, in_=delay, retry=Retry(max=5))
            kinds[job.id] = "fails" if i % 10 == 0 else "ok"
    workers = [processes.worker(queue.name, extra=WORKER) for _ in range(4)]
    forwarder = processes.forwarder("--poll", "0.2")
    kills = {"work horse": 0, "forwarder": 0}
    killed: set[int] = set()
    deadline = time.monotonic() + 300
    while not (status := rq_store.batch_status("big")) or not status.completed:
        assert time.monotonic() < deadline, f"not completed: {status}"
        time.sleep(0.5)
        running = [
            r["pids"][0]
            for r in runs(conn, queue.name)[-8:]
            if "pids" in r and r["pids"][1] in {w.pid for w in workers} and time.time() - r["at"] < 0.05
        ]
        for pid in set(running) - killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                kills["work horse"] += 1
                killed.add(pid)
            break
        if kills["work horse"] > 2 * kills["forwarder"] + 2:
            processes.launcher.kill(forwarder)
            kills["forwarder"] += 1
            forwarder = processes.forwarder("--poll", "0.2")
    assert kills["work horse"] >= 5 and kills["forwarder"] >= 2, kills
    done = lambda: [r for r in runs(conn, queue.name) if r["tag"] == "done"]  # noqa: E731
    wait_for(lambda: len(done()) >= 1, 60, "on_complete to run")
    processes.launcher.kill(forwarder)
    processes.forwarder("--poll", "0.2")
    wait_for(lambda: rq_store.get(batch_item_id("big")) is None, 30, "on_complete moved and acked")
    (run,) = done()
    summary = run["summary"]
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (1000, 900, 100)
    assert sorted(summary["failed_ids"]) == sorted(i for i, kind in kinds.items() if kind == "fails")
    ended = [Job.fetch(i, connection=conn).ended_at for i in kinds]
    assert all(ended) and run["at"] >= max(e.timestamp() for e in ended if e is not None)
    print(f"batch of 1000 on RQ: kills {kills}, runs {sum(1 for r in runs(conn, queue.name) if r['id'] in kinds)}")


def test_on_complete_is_saved_once_as_a_scheduled_job(conn: redis.Redis, queue: Queue) -> None:
    Batch(queue, "again", on_complete=Callback("tests.test_rq.jobs.batch_done"))
    Batch(queue, "again", on_complete="tests.test_rq.jobs.other")  # opened again: the first stays
    job = Job.fetch(batch_item_id("again"), connection=conn)
    assert job.get_status() == "scheduled" and job.args == ("tests.test_rq.jobs.batch_done", "again")
    with pytest.raises(BatchError, match="module-level function"):
        Batch(queue, "lambda", on_complete=lambda summary: None)


def _whole_worker_killed(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes, beat: str | None
) -> float:
    """A worker SIGKILLed whole (its process group, and its work horse, which RQ puts in a session
    of its own) mid-job, beside
    a live worker: no hook of the dead one runs, and RQ's own cleanup would come round 10 minutes
    later. The live worker's watch sees it dead two beats later and fails the job through RQ's
    cleanup; the batch completes with it failed. Returns the seconds from the kill to on_complete."""
    env = {} if beat is None else {"DELAYQ_WORKER_BEAT": beat}
    with Batch(queue, "orphan", on_complete=Callback("tests.test_rq.jobs.batch_done")) as batch:
        stuck = batch.add(started, "stuck", 600).id
        ok = batch.add(record, "ok").id
    doomed = processes.worker(queue.name, extra=WORKER, env=env, group=True)
    processes.forwarder("--poll", "0.2")
    mine = lambda: [r for r in runs(conn, queue.name) if r["id"] == stuck]  # noqa: E731
    wait_for(lambda: bool(mine()), 30, "the job to start")
    processes.worker(queue.name, extra=WORKER, env=env)  # runs `ok`, and watches
    done = lambda: [r for r in runs(conn, queue.name) if r["tag"] == "done"]  # noqa: E731
    wait_for(lambda: any(r["id"] == ok for r in runs(conn, queue.name)), 30, "the other job to run")
    processes.launcher.kill_group(doomed)
    killed = time.time()
    with contextlib.suppress(ProcessLookupError):  # RQ's work horse runs in a session of its own
        os.kill(mine()[0]["pids"][0], signal.SIGKILL)
    waiting = rq_store.batch_status("orphan")
    assert waiting is not None and not waiting.completed  # no hook ran for the killed job
    wait_for(lambda: bool(done()), 120, lambda: f"{rq_store.batch_status('orphan')}")
    (summary,) = (r["summary"] for r in done())
    assert (summary["total"], summary["succeeded"], summary["failed"], summary["failed_ids"]) == (2, 1, 1, [stuck])
    assert Job.fetch(stuck, connection=conn).get_status() == "failed"
    return done()[0]["at"] - killed


def test_a_whole_worker_killed_mid_job_is_reported_failed_within_two_beats(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    """With a 1 s beat: reported within 2 beats + a sweep's beat + the on_complete job's trip
    (forwarder poll, a worker's dequeue); RQ's own cleanup would take 90 s + up to 10 minutes."""
    took = _whole_worker_killed(conn, queue, rq_store, processes, beat="1")
    assert took < 10, f"the batch completed {took:.1f} s after the worker's death"


@pytest.mark.slow
def test_a_whole_worker_killed_costs_a_batch_two_default_beats(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    """The figure of docs/batches.md, with RQ's and delayq's defaults (a 5 s beat): the seconds
    from the SIGKILL of a whole worker to its batch's on_complete."""
    took = _whole_worker_killed(conn, queue, rq_store, processes, beat=None)
    print(f"RQ: batch completed {took:.1f} s after a whole worker's SIGKILL (load {os.getloadavg()[0]:.2f})")
    assert took < 20


def test_a_cancelled_sub_job_is_reported_failed_and_a_key_in_use_refused(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore
) -> None:
    """Issue 30, finding 6: the adapter's cancels (its scheduled-job registry's ``remove`` and
    the Scheduler's ``cancel``) report a delayed sub-job to its batch as failed, so the batch
    completes; finding 8: its key is then refused at open."""
    with Batch(queue, "cancelled", on_complete=Callback("tests.test_rq.jobs.batch_done")) as batch:
        first = batch.add(record, "a", in_=timedelta(hours=1))
        second = batch.add(record, "b", in_=timedelta(hours=1))
    queue.scheduled_job_registry.remove(first)
    status = rq_store.batch_status("cancelled")
    assert status is not None and (status.done, status.failed, status.completed) == (1, 1, False)
    Scheduler(queue=queue, connection=conn, delay_store=rq_store).cancel(second)
    status = rq_store.batch_status("cancelled")
    assert status is not None and status.completed and sorted(status.failed_ids) == sorted([first.id, second.id])
    assert rq_store.get(batch_item_id("cancelled")) is not None  # on_complete released
    with pytest.raises(BatchClosedError, match="in use"):
        Batch(queue, "cancelled", on_complete=Callback("tests.test_rq.jobs.batch_done"))


def test_the_on_complete_job_is_listed_in_rq_dashboard_while_the_batch_is_open(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, valkey_url: str
) -> None:
    """Issue 34: ``batch-<key>`` was saved ``scheduled`` in no registry, so rq-dashboard (which
    lists a queue's jobs by registry) showed it nowhere until the batch completed. It stands in
    the Scheduled tab as a mirror entry (no RQ scheduler moves it), and leaves it when moved."""
    dashboard = pytest.importorskip("rq_dashboard.cli")
    web = pytest.importorskip("rq_dashboard.web")
    app = dashboard.make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = valkey_url
    web.setup_rq_connection(app)
    client = app.test_client()

    def scheduled_tab() -> list[str]:
        return [j["id"] for j in client.get(f"/0/data/jobs/{queue.name}/scheduled/8/asc/1.json").get_json()["jobs"]]

    with Batch(queue, "shown", on_complete=Callback("tests.test_rq.jobs.batch_done")) as batch:
        sub = batch.add(record, "a", in_=timedelta(hours=1))
    on_complete = batch_item_id("shown")
    assert sorted(scheduled_tab()) == sorted([sub.id, on_complete])
    assert client.get(f"/0/data/job/{on_complete}.json").get_json()["status"] == "scheduled"
    assert RQScheduledJobRegistry(queue=queue).get_jobs_to_schedule() == [], "no RQ scheduler moves it"
    queue.scheduled_job_registry.remove(sub)  # the sub-job cancelled: reported failed, the batch completes
    assert Forwarder(rq_store, [RQTarget(conn)], retry_delay=0.05).run_until_idle().forwarded == 1
    assert scheduled_tab() == [] and queue.job_ids == [on_complete]
