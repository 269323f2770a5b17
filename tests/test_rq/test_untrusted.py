"""The forwarder's trust boundary: a job hash or an envelope is data anyone who can write to
RQ's Redis or the store can plant. Moving a job deserializes nothing (no pickle, no Job.fetch),
and an envelope can make the forwarder import only the queue/job classes it was allowed."""

from __future__ import annotations

import io
import os
import pickle
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue as RQQueue
from rq.job import Job, JobStatus
from rq.scheduler import RQScheduler

from delayq_backends import DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget, Scheduler
from delayq_backends.rq.allowlist import ClassAllowlist
from tests.harness.rq import Processes
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"


class Planted:
    """Unpickling this creates ``path``: the proof that someone unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> Any:
        return (io.open, (self.path, "w"))


def planted(path: Path) -> bytes:
    return pickle.dumps({"interval": 1, "evil": Planted(path)})


def test_a_pickle_planted_in_a_job_hash_never_runs_in_the_forwarder(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, prefix: str, processes: Processes, tmp_path: Path
) -> None:
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    in_meta = queue.enqueue_at(past, RECORD, "meta", meta={"k": 1})
    conn.hset(in_meta.key, "meta", planted(tmp_path / "meta"))
    in_data = queue.enqueue_at(past, RECORD, "data")
    conn.hset(in_data.key, "data", zlib.compress(planted(tmp_path / "data")))
    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store)
    periodic = scheduler.schedule(past.replace(tzinfo=None), RECORD, args=["periodic"], interval=3600, repeat=2)
    conn.hset(periodic.key, "meta", planted(tmp_path / "periodic"))
    # a clean twin of a job moved by RQ's own scheduler, to compare the hashes with
    kwargs: dict[str, Any] = {"ttl": 600, "result_ttl": 30, "at_front": True, "meta": {"k": 1}}
    theirs_q = RQQueue(f"{prefix}-theirs", connection=conn)
    theirs = theirs_q.enqueue_at(past, RECORD, "x", **kwargs)
    ours = queue.enqueue_at(past, RECORD, "x", **kwargs)
    rq_scheduler = RQScheduler([theirs_q], connection=conn)
    rq_scheduler.acquire_locks()
    rq_scheduler.enqueue_scheduled_jobs()
    rq_scheduler.release_locks()

    processes.forwarder()
    moved = {in_meta.id, in_data.id, periodic.id, ours.id}
    wait_for(lambda: set(queue.job_ids) == moved, 20, "the forwarder to move every job")
    assert not any((tmp_path / name).exists() for name in ("meta", "data", "periodic")), "unpickled in the forwarder"
    assert queue.job_ids[0] == ours.id  # at_front respected
    for job in (in_meta, in_data, periodic):
        assert conn.hget(job.key, "status") == b"queued"
    assert conn.hget(in_meta.key, "meta") == planted(tmp_path / "meta")  # left as it was, byte for byte
    # the periodic job's next run is armed from its envelope, repeat counted down there
    rearmed = rq_store.get(periodic.id)
    assert rearmed is not None
    assert Envelope.decode(rearmed.envelope).meta["schedule"] == {"interval": 3600, "repeat": 1}

    # the moved hash is what RQ's own scheduler writes, for every field RQ reads
    variable = {b"created_at", b"enqueued_at", b"origin", b"description", b"last_heartbeat"}
    a, b = conn.hgetall(theirs.key), conn.hgetall(ours.key)
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k not in variable} == {k: v for k, v in b.items() if k not in variable}
    assert b[b"origin"] == queue.name.encode() and b[b"enqueued_at"].endswith(b"Z")
    # the job's ttl counts from its move, as RQ's: ours moved later (the forwarder's start), never sooner
    assert conn.ttl(theirs.key) - 1 <= conn.ttl(ours.key) <= 600
    processes.stop_all()

    # an RQ worker does unpickle job data: that is the worker's own trust boundary, not the forwarder's
    processes.worker(queue.name, burst=True).wait(30)
    assert (tmp_path / "data").exists()
    assert Job.fetch(in_data.id, connection=conn).get_status() == JobStatus.FAILED


PLANTED_PATHS = ["os.system", "builtins.eval", "tests.test_rq.planted_import.Job", "rq.cli.__main__.x"]


@pytest.mark.parametrize("key", ["job_class", "queue_class"])
@pytest.mark.parametrize("path", PLANTED_PATHS)
def test_a_class_path_off_the_allowlist_waits_is_named_once_and_is_never_imported(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, key: str, path: str,
) -> None:  # fmt: skip
    """Not dead-lettered: the usual cause is the user's own subclass and a forwarder started
    without --rq-allow-class, so its jobs wait in the store, named in one warning."""
    marker = tmp_path / "imported"
    monkeypatch.setenv("DELAYQ_TEST_IMPORT_MARKER", str(marker))
    monkeypatch.delenv("DELAYQ_RQ_ALLOW_CLASS", raising=False)
    good = queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, "good")
    bad = queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, "bad")
    rq_store.schedule(bad.id, 0, Envelope("rq", queue.name, meta={key: path}))
    # the target's clock at the epoch (ms): its "look again" times are due at once
    forwarder = Forwarder(rq_store, [RQTarget(conn, clock=lambda: 0)], retry_delay=0.05)
    with caplog.at_level("WARNING", logger="delayq.rq"):
        assert forwarder.run_once() == 2
        assert forwarder.run_once() == 1  # looked at again: still waits, no second warning
    assert queue.job_ids == [good.id] and rq_store.dead_letters() == []
    assert rq_store.get(bad.id) is not None and conn.hget(bad.key, "status") == b"scheduled"
    (warning,) = [r.getMessage() for r in caplog.records if "allowlist" in r.getMessage()]
    assert "RQ jobs wait" in warning and f"{key} {path!r} is not on this forwarder's allowlist" in warning
    assert "--rq-allow-class" in warning and "DELAYQ_RQ_ALLOW_CLASS" in warning
    assert not marker.exists()


def test_an_allowed_path_that_is_not_a_queue_or_job_class_is_refused(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue
) -> None:
    job = queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, "x")
    rq_store.schedule(job.id, 0, Envelope("rq", queue.name, meta={"job_class": "rq.utils.import_attribute"}))
    assert Forwarder(rq_store, [RQTarget(conn)]).run_once() == 1
    (dead,) = rq_store.dead_letters()
    assert "is not a subclass of rq.job.Job" in dead.error and queue.job_ids == []


def test_allowlist_prefixes_match_whole_components() -> None:
    allow = ClassAllowlist.configured(["myapp.jobs"], env={"DELAYQ_RQ_ALLOW_CLASS": "other, third.mod"})
    assert allow.prefixes == ("rq", "delayq_backends", "myapp.jobs", "other", "third.mod")
    for ok in ("rq.job.Job", "rq.Queue", "delayq_backends.rq.Queue", "myapp.jobs.MyJob", "myapp.jobs.a.B",
               "other.X", "third.mod.Y"):  # fmt: skip
        assert allow.allows(ok), ok
    for refused in ("rqevil.Job", "myapp.jobsx.Evil", "myapp.Job", "os.system", "builtins.eval", "third.modx.Y",
                    "rq.cli.__main__.main", "rq..job", "delayq_backends_evil.X", ""):  # fmt: skip
        assert not allow.allows(refused), refused


def test_the_forwarder_takes_rq_allow_class(
    conn: redis.Redis, rq_store: DelayStore, prefix: str, processes: Processes
) -> None:
    from tests.test_rq.jobs import AuditedJob

    queue = Queue(f"{prefix}-custom", connection=conn, delay_store=rq_store, job_class=AuditedJob)
    job = queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, "custom")
    processes.forwarder("--rq-allow-class", "tests.test_rq.jobs")
    wait_for(lambda: queue.job_ids == [job.id], 20, "the custom job class to be allowed")
    assert not rq_store.dead_letters()
    assert "DELAYQ_RQ_ALLOW_CLASS" not in os.environ


def test_scheduler_jobs_stored_by_an_older_delayq_still_move(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, tmp_path: Path
) -> None:
    """Envelopes written before the schedule moved into them say only ``{"scheduler": true}``:
    a job without meta moves once; one with JSON meta keeps repeating; one whose meta is a
    pickle is not unpickled but dead-lettered, naming `delayq rq-upgrade`."""
    from rq.serializers import JSONSerializer

    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store)
    past = datetime(2020, 1, 1)
    once = scheduler.enqueue_at(past, RECORD, "once")
    json_job = Job.create(RECORD, args=["json"], connection=conn, serializer=JSONSerializer, status=JobStatus.SCHEDULED)
    json_job.origin = queue.name
    json_job.meta.update({"interval": 3600, "repeat": 3})
    json_job.save()
    pickled = scheduler.schedule(past, RECORD, args=["pickled"], interval=3600)
    conn.hset(pickled.key, "meta", planted(tmp_path / "legacy"))
    old = Envelope("rq", queue.name, meta={"scheduler": True})  # what today's stores hold
    for job in (once, json_job, pickled):
        rq_store.schedule(job.id, 0, old)
    assert Forwarder(rq_store, [RQTarget(conn)]).run_once() == 3
    assert set(queue.job_ids) == {once.id, json_job.id}
    assert not rq_store.exists(once.id)
    rearmed = rq_store.get(json_job.id)
    assert rearmed is not None and Envelope.decode(rearmed.envelope).meta["schedule"] == {"interval": 3600, "repeat": 2}
    (dead,) = rq_store.dead_letters()
    assert dead.id == pickled.id and "never unpickles" in dead.error and "delayq rq-upgrade" in dead.error
    assert not (tmp_path / "legacy").exists()


def test_a_users_own_queue_subclass_waits_named_in_one_warning_until_allowed(
    conn: redis.Redis, rq_store: DelayStore, prefix: str, processes: Processes, tmp_path: Path
) -> None:
    """First contact: `MyQueue(delayq_backends.rq.Queue)` in the user's package, a forwarder
    started without --rq-allow-class. Its jobs are not dead-lettered: they wait, one warning
    names the flag, and they move once the forwarder runs with it. They are looked at again
    every --rq-class-retry (default 30 s; 0.5 s here), still with that one warning."""
    from tests.test_rq.jobs import MyQueue

    queue = MyQueue(f"{prefix}-mine", connection=conn, delay_store=rq_store)
    jobs = [queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, i) for i in range(3)]
    log = tmp_path / "forward.log"
    env = {**processes.env, "DELAYQ_RQ_ALLOW_CLASS": "", "DELAYQ_RQ_CLASS_RETRY": "0.5"}
    first = processes.launcher.delayq(
        "forward", "--url", processes.url, "--rq-redis", processes.url, "--log-level", "warning", env=env, log=log
    )
    wait_for(lambda: "RQ jobs wait" in log.read_text(), 20, "the forwarder's warning")

    def looked_at_until() -> int | None:  # a deferred item is held until its next look
        item = rq_store.get(jobs[0].id)
        assert item is not None, "the job left the store"
        return item.leased_until_ms

    warned_for = looked_at_until()
    wait_for(lambda: looked_at_until() != warned_for, 20, "the forwarder to look at the jobs again")
    processes.launcher.stop(first)
    assert log.read_text().count("RQ jobs wait") == 1
    assert "--rq-allow-class tests.test_rq.jobs" in log.read_text()
    assert rq_store.dead_letters() == [] and queue.job_ids == []
    assert all(rq_store.get(j.id) is not None for j in jobs)

    processes.forwarder("--rq-allow-class", "tests.test_rq.jobs")
    wait_for(lambda: sorted(queue.job_ids) == sorted(j.id for j in jobs), 60, "the jobs to move once allowed")
    assert rq_store.dead_letters() == []
