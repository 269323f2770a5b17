"""RQ worker-side dedupe with real `rq worker` processes: a job id pushed twice runs once with
:class:`~delayq_backends.rq.DedupeWorker` (twice with RQ's own worker), and a retry still runs."""

from __future__ import annotations

import pytest
import redis
from rq import Retry

from delayq_backends.rq import Queue
from tests.harness.rq import Processes, runs
from tests.test_rq.jobs import always_fails, record

WORKERS = {
    "dedupe": "delayq_backends.rq.DedupeWorker",
    "dedupe-simple": "delayq_backends.rq.DedupeSimpleWorker",
    "rq": "rq.Worker",
}


def burst(processes: Processes, queue: Queue, worker_class: str) -> str:
    """Run one burst worker over ``queue`` until it is empty; its log (failing if it failed)."""
    proc = processes.worker(queue.name, burst=True, extra=("--worker-class", worker_class))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    processes.launcher.procs.remove(proc)
    return err.decode(errors="replace")


@pytest.mark.parametrize("worker", list(WORKERS))
def test_a_job_delivered_twice_runs_once(conn: redis.Redis, queue: Queue, processes: Processes, worker: str) -> None:
    job = queue.enqueue(record, "twice")
    conn.rpush(queue.key, job.id)  # the second push a forwarder crash between publish and ack leaves
    log = burst(processes, queue, WORKERS[worker])
    ran = [r for r in runs(conn, queue.name) if r["id"] == job.id]
    if worker == "rq":
        assert len(ran) == 2, "RQ's own worker runs both deliveries: the test could not fail"
        return
    assert len(ran) == 1
    assert f"job {job.id} run 0 was started before" in log
    job.refresh()
    assert job.get_status() == "finished" and job.return_value() == "twicex1"  # the first run's result stays
    assert conn.llen(queue.key) == 0
    intermediate = getattr(queue, "intermediate_queue_key", None)
    assert not intermediate or conn.llen(intermediate) == 0, "the dropped id stays in RQ's intermediate queue"


def test_a_retry_still_runs(conn: redis.Redis, queue: Queue, processes: Processes) -> None:
    job = queue.enqueue(always_fails, "retry", retry=Retry(max=2))
    burst(processes, queue, WORKERS["dedupe"])
    assert [r["tag"] for r in runs(conn, queue.name) if r["id"] == job.id] == ["retry"] * 3


def test_a_bad_ttl_stops_the_worker_at_start(queue: Queue, processes: Processes) -> None:
    processes.env["DELAYQ_DEDUPE_TTL"] = "forever"
    proc = processes.worker(queue.name, burst=True, extra=("--worker-class", WORKERS["dedupe"]))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "DELAYQ_DEDUPE_TTL='forever'" in err.decode(errors="replace")


def test_a_store_out_of_reach_runs_the_job(conn: redis.Redis, queue: Queue, processes: Processes) -> None:
    """At-least-once: a worker that cannot record the start runs the job anyway, and says so."""
    processes.env["DELAYQ_URL"] = "redis://127.0.0.1:1/0"  # nothing listens there
    job = Queue(queue.name, connection=conn).enqueue(record, "unchecked")  # a plain rq Queue
    log = burst(processes, queue, WORKERS["dedupe"])
    assert [r["id"] for r in runs(conn, queue.name)] == [job.id]
    assert "runs unchecked (at-least-once)" in log
