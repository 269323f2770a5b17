"""The rq target: RQ's own enqueue in one script call or transaction, the exactly-once hand-off with the store's
ack on a shared server, and what happens to jobs that cannot be moved."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from rq import Queue as RQQueue
from rq.job import Job, JobStatus
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer

from delayq_backends import Config, DelayStore, Envelope
from delayq_backends.envelope import Envelope as EnvelopeType
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from delayq_backends.rq.allowlist import ClassAllowlist
from delayq_backends.store import Lease
from delayq_backends.targets import Delivery
from tests.harness.rq import SHARDS, Processes, runs
from tests.helpers import wait_for
from tests.test_rq.jobs import AuditedJob

PAST = timedelta(seconds=-1)


def schedule_past(queue: Queue, tag: Any, **kwargs: Any) -> Job:
    return queue.enqueue_at(datetime.now(timezone.utc) + PAST, "tests.test_rq.jobs.record", tag, **kwargs)


def claim_all(rq_store: DelayStore, **kwargs: Any) -> list[Any]:
    return [c for s in range(rq_store.shards) if (c := rq_store.claim(s, **kwargs)).items]


def deliveries(claim: Any) -> list[Delivery]:
    return [Delivery(i.id, Envelope.decode(i.envelope), i.attempts, i.ready_ms) for i in claim.items]


def test_enqueue_and_ack_commit_in_one_multi_exec(queue: Queue, rq_store: DelayStore, forwarder: Forwarder) -> None:
    """A job the general path moves (a TTL: see test_move.py for the usual job's one script call)."""
    job = schedule_past(queue, "one", ttl=600)
    seen: list[str] = []
    monitor = queue.connection.monitor()
    ready = threading.Event()

    def watch() -> None:
        with monitor as m:
            ready.set()
            for command in m.listen():
                seen.append(command["command"])
                if command["command"].startswith("EXEC") and any(c.startswith("RPUSH") for c in seen):
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    assert forwarder.run_once() == 1
    thread.join(5)
    begin = max(i for i, c in enumerate(seen) if c == "MULTI")  # the transaction that pushed
    transaction = seen[begin:]
    assert any(c.startswith(f"RPUSH rq:queue:{queue.name} {job.id}") for c in transaction), transaction
    ack = "local ours, seen, m"  # ack.lua's code (scripts reach the server without their comments)
    assert any(c.startswith("EVAL") and job.id in c and ack in c for c in transaction)
    assert transaction[-1].startswith("EXEC")
    assert queue.job_ids == [job.id] and not rq_store.exists(job.id)


def test_a_crash_inside_the_transaction_publishes_nothing_and_acks_nothing(
    queue: Queue, rq_store: DelayStore, conn: redis.Redis, forwarder: Forwarder, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = schedule_past(queue, "crash", ttl=600)  # the general path: the usual job's script is atomic
    (claim,) = claim_all(rq_store, lease_ms=100)
    real_ack = Lease.ack

    def ack_then_die(self: Lease, ids: Any = None, *, pipeline: Any = None) -> int:
        real_ack(self, ids, pipeline=pipeline)
        raise KeyboardInterrupt("killed before EXEC")

    monkeypatch.setattr(Lease, "ack", ack_then_die)
    with pytest.raises(KeyboardInterrupt):
        RQTarget(conn).publish_claimed(deliveries(claim), Lease(rq_store, claim))
    assert queue.job_ids == [] and job.get_status() == JobStatus.SCHEDULED
    assert rq_store.get(job.id) is not None  # still leased: claimed again when the lease ends
    monkeypatch.undo()
    wait_for(lambda: forwarder.run_once() == 1, 5, "the lease to expire and the job to move")
    assert rq_store.exists(job.id) is False and queue.job_ids == [job.id]


def test_a_lost_lease_moves_nothing(queue: Queue, rq_store: DelayStore, conn: redis.Redis) -> None:
    """A forwarder that stalled past its lease, while another claimed the items, moves nothing."""
    job = schedule_past(queue, "stale")
    (stale,) = claim_all(rq_store, lease_ms=50)
    fresh: list[Any] = []
    wait_for(lambda: bool(fresh.extend(claim_all(rq_store)) or fresh), 5, "a second claim")
    report = RQTarget(conn).publish_claimed(deliveries(stale), Lease(rq_store, stale))
    assert report.published == [] and queue.job_ids == []
    report = RQTarget(conn).publish_claimed(deliveries(fresh[0]), Lease(rq_store, fresh[0]))
    assert report.acked == [job.id] and queue.job_ids == [job.id] and not rq_store.exists(job.id)


def test_forwarders_killed_at_random_points_enqueue_every_job_exactly_once(
    queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    ids = {schedule_past(queue, i).id for i in range(3000)}
    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + 120

    def remaining() -> int:
        return sum(s.scheduled for s in rq_store.stats())

    while (left := remaining()) and time.monotonic() < deadline:
        proc = processes.forwarder("--lease", "0.5", "--batch", "50")
        # kill it while it works: once it has acked something, at a random point soon after
        wait_for(lambda n=left, p=proc: remaining() < n or p.poll() is not None, 60, "the forwarder at work")
        time.sleep(rng.uniform(0, 0.05))  # a forwarder moves thousands of jobs a second
        proc.kill()
        proc.wait()
        kills += 1
    assert remaining() == 0, "the forwarders did not finish"
    pushed = Counter(j.decode() for j in queue.connection.lrange(queue.key, 0, -1))
    assert set(pushed) == ids and max(pushed.values()) == 1, f"duplicates after {kills} kills"
    assert kills >= 3, "too few kills to mean anything"


def test_a_store_on_another_server_is_acked_after_the_enqueue(conn: redis.Redis, valkey_url: str, prefix: str) -> None:
    other = redis.Redis.from_url(valkey_url.rsplit("/", 1)[0] + "/7")
    store = DelayStore(other, Config(prefix=prefix, shards=SHARDS))
    queue = Queue(f"{prefix}-q", connection=conn, delay_store=store)
    job = schedule_past(queue, "apart")
    assert not conn.exists(f"{prefix}:meta") and store.exists(job.id)
    forwarder = Forwarder(store, [RQTarget(conn)])
    assert forwarder.run_once() == 1
    assert queue.job_ids == [job.id] and not store.exists(job.id) and forwarder.stats.acked == 1
    # a re-delivery (a crash between enqueue and ack) finds the job queued already: skipped
    store.schedule(job.id, PAST.total_seconds() + time.time(), queue.envelope())
    assert forwarder.run_once() == 1 and queue.job_ids == [job.id]
    other.close()


def test_cancelled_or_deleted_meanwhile_are_skipped_and_acked(
    queue: Queue, rq_store: DelayStore, forwarder: Forwarder
) -> None:
    cancelled, deleted, kept = (schedule_past(queue, t) for t in ("cancelled", "deleted", "kept"))
    cancelled.cancel()
    deleted.delete()
    assert forwarder.run_once() == 3
    assert queue.job_ids == [kept.id]
    assert not any(rq_store.exists(j.id) for j in (cancelled, deleted, kept))
    assert cancelled.get_status() == JobStatus.CANCELED and not Job.exists(deleted.id, connection=queue.connection)


def test_an_unimportable_class_is_a_dead_letter_with_the_reason(
    queue: Queue, rq_store: DelayStore, forwarder: Forwarder
) -> None:
    good = schedule_past(queue, "good")
    bad = schedule_past(queue, "bad")
    rq_store.schedule(bad.id, 0, EnvelopeType("rq", queue.name, meta={"job_class": "no_such_app.jobs.MyJob"}))
    allowed = ClassAllowlist.configured(["no_such_app"], env={})
    forwarder = Forwarder(rq_store, [RQTarget(queue.connection, allow_classes=allowed)], retry_delay=0.05)
    assert forwarder.run_once() == 2
    assert queue.job_ids == [good.id]
    (dead,) = rq_store.dead_letters()
    assert dead.id == bad.id and "cannot import 'no_such_app.jobs.MyJob'" in dead.error
    assert "install the package" in dead.error


def test_an_unreadable_job_hash_is_a_dead_letter_with_the_reason(
    queue: Queue, rq_store: DelayStore, forwarder: Forwarder
) -> None:
    good = schedule_past(queue, "good")
    bad = schedule_past(queue, "bad")
    queue.connection.hset(bad.key, "ttl", "not a number")
    assert forwarder.run_once() == 2
    assert queue.job_ids == [good.id]
    (dead,) = rq_store.dead_letters()
    assert dead.id == bad.id and "cannot be moved: field 'ttl' is b'not a number'" in dead.error


def test_a_moved_job_matches_what_rqs_own_scheduler_makes(
    conn: redis.Redis, queue: Queue, forwarder: Forwarder, prefix: str
) -> None:
    """Pins what the raw move writes against RQ's own enqueue in every supported RQ version."""
    theirs_q = RQQueue(f"{prefix}-theirs", connection=conn)
    kwargs = {"ttl": 600, "result_ttl": 30, "at_front": True, "meta": {"k": 1}}
    when = datetime.now(timezone.utc) + PAST
    theirs = theirs_q.enqueue_at(when, "tests.test_rq.jobs.record", "x", **kwargs)
    ours = queue.enqueue_at(when, "tests.test_rq.jobs.record", "x", **kwargs)
    scheduler = RQScheduler([theirs_q], connection=conn)
    scheduler.acquire_locks()
    scheduler.enqueue_scheduled_jobs()
    scheduler.release_locks()
    assert forwarder.run_once() == 1
    variable = {b"created_at", b"enqueued_at", b"origin", b"description", b"last_heartbeat"}
    a, b = conn.hgetall(theirs.key), conn.hgetall(ours.key)
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k not in variable} == {k: v for k, v in b.items() if k not in variable}
    assert a[b"status"] == b"queued" and b[b"origin"] == queue.name.encode()
    assert conn.ttl(theirs.key) > 0 and abs(conn.ttl(theirs.key) - conn.ttl(ours.key)) <= 1
    assert theirs_q.job_ids == [theirs.id] and queue.job_ids == [ours.id]
    assert conn.sismember("rq:queues", queue.key)


def test_the_job_class_and_serializer_the_queue_was_given_are_used(
    conn: redis.Redis, rq_store: DelayStore, prefix: str, processes: Processes
) -> None:
    allowed = ClassAllowlist.configured(["tests.test_rq.jobs"], env={})
    forwarder = Forwarder(rq_store, [RQTarget(conn, allow_classes=allowed)], retry_delay=0.05)
    queue = Queue(
        f"{prefix}-json", connection=conn, delay_store=rq_store, job_class=AuditedJob, serializer=JSONSerializer
    )
    job = schedule_past(queue, "json")
    assert Envelope.decode(rq_store.get(job.id).envelope).meta == {  # type: ignore[union-attr]
        "queue_class": "delayq_backends.rq.queue.Queue",
        "job_class": "tests.test_rq.jobs.AuditedJob",
        "serializer": "rq.serializers.JSONSerializer",
    }
    assert forwarder.run_once() == 1 and queue.job_ids == [job.id]
    moved = AuditedJob.fetch(job.id, connection=conn, serializer=JSONSerializer)
    assert moved.args == ["json"] and moved.get_status() == JobStatus.QUEUED  # JSON keeps lists
    processes.start(
        "-m", "rq.cli", "worker", "-u", processes.url, "--burst", "-q", "--job-class", "tests.test_rq.jobs.AuditedJob",
        "--serializer", "rq.serializers.JSONSerializer", "--queue-class", "delayq_backends.rq.Queue", queue.name,
    ).wait(30)  # fmt: skip
    assert [r["tag"] for r in runs(conn, queue.name)] == ["json"]
