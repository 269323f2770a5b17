"""Dead-lettered RQ jobs in RQ's FailedJobRegistry (delayq_backends.rq.failed): listed where RQ
users look (rq-dashboard's Failed tab, `rq info`), with the reason as their failure, and
requeued from either side exactly once: `rq requeue` enqueues the job now, `delayq dlq requeue`
schedules it again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import SimpleWorker
from rq.exceptions import InvalidJobOperation
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

from delayq_backends import DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget, Scheduler
from delayq_backends.rq.allowlist import ClassAllowlist, _import
from delayq_backends.rq.failed import MARK
from delayq_backends.rq.registry import registry_key
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"
#: a job class module the first forwarder may import but cannot find; the second one can
MODULE = "delayq_first_contact_jobs"


@pytest.fixture(autouse=True)
def class_not_imported_yet() -> Iterator[None]:
    """Each test starts with the job class's module unknown to this process (tests import it
    from their own tmp_path) and forgets it afterwards."""
    _import.cache_clear()
    yield
    sys.modules.pop(MODULE, None)
    _import.cache_clear()


def past() -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=1)


def unimportable(queue: Queue, store: DelayStore, tag: str) -> Job:
    """A due job whose envelope names a job class this forwarder cannot import: dead-lettered."""
    job = queue.enqueue_at(past(), RECORD, tag)
    store.schedule(job.id, 0, Envelope("rq", queue.name, meta={"job_class": f"{MODULE}.Job"}))
    return job


def failed(queue: Queue) -> FailedJobRegistry:
    return FailedJobRegistry(queue.name, connection=queue.connection)


def dashboard_view(url: str, queue_name: str, job_id: str) -> dict[str, Any]:
    """The job as rq-dashboard shows it, after checking its Failed tab lists it (and only it)."""
    dashboard = pytest.importorskip("rq_dashboard.cli")
    web = pytest.importorskip("rq_dashboard.web")
    app = dashboard.make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = url
    web.setup_rq_connection(app)
    client = app.test_client()
    listed = client.get(f"/0/data/jobs/{queue_name}/failed/8/asc/1.json").get_json()["jobs"]
    assert [j["id"] for j in listed] == [job_id]
    return dict(client.get(f"/0/data/job/{job_id}.json").get_json())


def write_the_class(where: Path) -> None:
    (where / f"{MODULE}.py").write_text("from rq.job import Job as RQJob\n\n\nclass Job(RQJob):\n    pass\n")


def fix_the_class(processes: Processes, where: Path) -> None:
    """The fix the dead letter names: the package that defines the class, where the forwarder runs."""
    write_the_class(where)
    processes.env["PYTHONPATH"] = str(where)


def run_cli(processes: Processes, *args: str) -> str:
    done = subprocess.run([sys.executable, *args], env=processes.env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_a_dead_lettered_job_is_failed_in_rq_and_rq_requeue_runs_it_once(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, processes: Processes, valkey_url: str, tmp_path: Path
) -> None:
    job = unimportable(queue, rq_store, "dead")
    assert queue.scheduled_job_registry.get_job_ids() == [job.id]
    forwarder = processes.forwarder("--rq-allow-class", MODULE)
    wait_for(lambda: failed(queue).get_job_ids() == [job.id], 20, "the job in RQ's FailedJobRegistry")

    job = Job.fetch(job.id, connection=conn)
    assert job.get_status() == JobStatus.FAILED
    reason = job.latest_result().exc_string  # what rq-dashboard shows as its exc_info
    assert f"cannot import '{MODULE}.Job'" in reason and "rq requeue --queue" in reason
    assert f"delayq dlq requeue {job.id}" in reason
    assert queue.scheduled_job_registry.get_job_ids() == [] and conn.zcard(registry_key(queue.name)) == 0
    assert [d.id for d in rq_store.dead_letters()] == [job.id]  # the store's dead letter stays
    info = run_cli(processes, "-m", "rq.cli", "info", "-u", valkey_url, "--raw", "--only-queues", queue.name)
    assert "1 failed" in info
    if hasattr(FailedJobRegistry, "get_job_count"):  # rq-dashboard 0.9 needs RQ 2 or later
        shown = dashboard_view(valkey_url, queue.name, job.id)
        assert shown["status"] == "failed" and f"cannot import '{MODULE}.Job'" in shown["exc_info"]

    # RQ's requeue: enqueued now, run once; the store's dead letter is spent
    run_cli(processes, "-m", "rq.cli", "requeue", "-u", valkey_url, "--queue", queue.name, job.id)
    assert queue.job_ids == [job.id] and failed(queue).get_job_ids() == []
    processes.worker(queue.name, burst=True).wait(60)
    assert [r["id"] for r in runs(conn, queue.name)] == [job.id]
    processes.launcher.stop(forwarder)
    fix_the_class(processes, tmp_path)
    processes.forwarder("--rq-allow-class", MODULE)
    run_cli(processes, "-m", "delayq_backends.cli", "dlq", "requeue", "--url", valkey_url, job.id)
    wait_for(lambda: rq_store.get(job.id) is None, 20, "the forwarder to take the requeued dead letter")
    assert queue.job_ids == [] and rq_store.dead_letters() == [] and failed(queue).get_job_ids() == []
    assert [r["id"] for r in runs(conn, queue.name)] == [job.id], "run twice"


def test_delayq_dlq_requeue_moves_the_failed_job_and_rq_requeue_then_finds_nothing(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, processes: Processes, valkey_url: str, tmp_path: Path
) -> None:
    job = unimportable(queue, rq_store, "fixed")
    first = processes.forwarder("--rq-allow-class", MODULE)
    wait_for(lambda: failed(queue).get_job_ids() == [job.id], 20, "the job in RQ's FailedJobRegistry")
    processes.launcher.stop(first)

    fix_the_class(processes, tmp_path)
    processes.forwarder("--rq-allow-class", MODULE)
    run_cli(processes, "-m", "delayq_backends.cli", "dlq", "requeue", "--url", valkey_url, job.id)
    wait_for(lambda: queue.job_ids == [job.id], 20, "the forwarder to move the requeued job")
    assert failed(queue).get_job_ids() == [] and conn.hget(job.key, MARK) is None
    assert conn.hget(job.key, "status") == b"queued"
    with pytest.raises(InvalidJobOperation):
        failed(queue).requeue(job.id)
    processes.worker(queue.name, burst=True).wait(60)
    assert [r["id"] for r in runs(conn, queue.name)] == [job.id]
    assert rq_store.dead_letters() == []


def test_only_jobs_still_waiting_are_failed_and_a_periodic_one_resumes_its_schedule(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A dead letter whose job RQ already holds (moved, ack lost) is not marked failed; a
    Scheduler job waiting with its last run's status is; `delayq dlq requeue` re-arms it."""
    monkeypatch.delenv("DELAYQ_RQ_ALLOW_CLASS", raising=False)
    held = unimportable(queue, rq_store, "held")
    conn.hset(held.key, "status", "queued")
    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store)
    periodic = scheduler.schedule(past().replace(tzinfo=None), RECORD, args=["p"], interval=3600)
    conn.hset(periodic.key, "status", "finished")  # its last run's
    envelope = Envelope.decode(rq_store.get(periodic.id).envelope)  # type: ignore[union-attr]
    rq_store.schedule(periodic.id, 0, Envelope("rq", queue.name, meta={**envelope.meta, "job_class": f"{MODULE}.Job"}))
    target = RQTarget(conn, allow_classes=ClassAllowlist.configured([MODULE]))
    assert Forwarder(rq_store, [target], retry_delay=0.05).run_once() == 2
    assert {d.id for d in rq_store.dead_letters()} == {held.id, periodic.id}
    assert failed(queue).get_job_ids() == [periodic.id]
    assert conn.hget(held.key, "status") == b"queued" and conn.hget(held.key, MARK) is None

    write_the_class(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rq_store.requeue_dead([periodic.id], when=past())  # "now" rounds up: a claim in the same ms would wait
    assert Forwarder(rq_store, [target], retry_delay=0.05).run_once() == 1
    assert queue.job_ids == [periodic.id] and failed(queue).get_job_ids() == []
    rearmed = rq_store.get(periodic.id)
    assert rearmed is not None and rearmed.ready_ms > (datetime.now(timezone.utc).timestamp() + 3000) * 1000


def test_a_scheduler_job_requeued_by_rq_is_not_moved_again_by_delayq_dlq_requeue(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Scheduler job moves whatever its status (its last run's), so the outdated mark alone
    keeps `delayq dlq requeue` from enqueueing it a second time after `rq requeue`."""
    monkeypatch.delenv("DELAYQ_RQ_ALLOW_CLASS", raising=False)
    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store)
    job = scheduler.enqueue_at(past().replace(tzinfo=None), RECORD, "once")
    envelope = Envelope.decode(rq_store.get(job.id).envelope)  # type: ignore[union-attr]
    rq_store.schedule(job.id, 0, Envelope("rq", queue.name, meta={**envelope.meta, "job_class": f"{MODULE}.Job"}))
    target = RQTarget(conn, allow_classes=ClassAllowlist.configured([MODULE]))
    assert Forwarder(rq_store, [target], retry_delay=0.05).run_once() == 1
    failed(queue).requeue(job.id)
    assert queue.job_ids == [job.id]

    write_the_class(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rq_store.requeue_dead([job.id], when=past())
    assert Forwarder(rq_store, [target], retry_delay=0.05).run_once() == 1
    assert queue.job_ids == [job.id], "enqueued twice"
    assert rq_store.get(job.id) is None and rq_store.dead_letters() == []


@pytest.mark.parametrize("ran", [True, False], ids=["run-by-a-worker", "still-queued"])
def test_delayq_dlq_requeue_after_rq_requeue_skips_the_job_even_where_its_dead_letter_cause_remains(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, monkeypatch: pytest.MonkeyPatch, ran: bool
) -> None:
    """`rq requeue` spent the dead letter: a later `delayq dlq requeue` of it is skipped and acked
    (docs/rq.md), though this forwarder still cannot import the job class that killed it, instead
    of being dead-lettered again (and the job listed as failed once more)."""
    monkeypatch.delenv("DELAYQ_RQ_ALLOW_CLASS", raising=False)
    job = unimportable(queue, rq_store, "dead")
    target = RQTarget(conn, allow_classes=ClassAllowlist.configured([MODULE]))
    assert Forwarder(rq_store, [target], retry_delay=0.05).run_once() == 1
    assert failed(queue).get_job_ids() == [job.id]
    failed(queue).requeue(job.id)
    if ran:
        SimpleWorker([queue], connection=conn).work(burst=True)
        assert [r["id"] for r in runs(conn, queue.name)] == [job.id]
    rq_store.requeue_dead([job.id], when=past())
    Forwarder(rq_store, [target], retry_delay=0.05).run_until_idle()
    assert rq_store.get(job.id) is None and rq_store.dead_letters() == [], "skipped and acked, not dead again"
    assert failed(queue).get_job_ids() == []
    assert Job.fetch(job.id, connection=conn).get_status() == (JobStatus.FINISHED if ran else JobStatus.QUEUED)
    assert queue.job_ids == ([] if ran else [job.id]), "not enqueued a second time"
