"""The usual due job's move (issue 23): one ``rq_move`` script call per batch, with the store's
ack on its own server, writing exactly what the general path (the WATCHed transaction) writes,
and handing every job it cannot take to that path in order."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FinishedJobRegistry

from delayq_backends import Config, DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from delayq_backends.store import Lease
from tests.harness.rq import Processes, runs
from tests.test_rq.test_speed import counting_commands
from tests.test_rq.test_target import claim_all, deliveries

RECORD = "tests.test_rq.jobs.record"
#: job hash fields that differ between two moves of the same job (times, names)
VARIABLE = {b"created_at", b"enqueued_at", b"origin", b"description", b"last_heartbeat"}


class GeneralPath(RQTarget):
    """The target as before the script: every job through the WATCHed transaction."""

    def _move_usual(self, batch: Any, lease: Any, report: Any) -> Any:
        return batch


def one_shard_queue(conn: redis.Redis, name: str) -> Queue:
    """A queue whose store has one shard, so a run claims its jobs as one batch, in time order."""
    return Queue(name, connection=conn, delay_store=DelayStore(conn, Config(prefix=name, shards=1)))


def schedule(queue: Queue, tags: list[str], **per_tag: dict[str, Any]) -> dict[str, Job]:
    """``tags`` due 10 s ago, 1 ms apart in order (the claim's order), with ``per_tag`` options."""
    start = datetime.now(timezone.utc) - timedelta(seconds=10)
    return {
        tag: queue.enqueue_at(start + timedelta(milliseconds=i), RECORD, tag, **per_tag.get(tag, {}))
        for i, tag in enumerate(tags)
    }


def warmed_up(target: RQTarget, queue: Queue) -> RQTarget:
    """``target`` after it moved one job of ``queue``: its scripts are loaded, the queue empty."""
    schedule(queue, ["warm-up"])
    (claim,) = claim_all(queue.delay_store)
    target.publish_claimed(deliveries(claim), Lease(queue.delay_store, claim))
    queue.delay_store.ack(claim)
    queue.empty()
    return target


def test_a_batch_of_usual_jobs_moves_and_acks_in_one_command(
    conn: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = one_shard_queue(conn, f"{prefix}-one")
    target = warmed_up(RQTarget(conn), queue)
    jobs = schedule(queue, [str(i) for i in range(50)])
    (claim,) = claim_all(queue.delay_store)
    with counting_commands(monkeypatch) as sent:
        report = target.publish_claimed(deliveries(claim), Lease(queue.delay_store, claim))
    assert sent == [1], "the move and the ack are one script call"
    assert sorted(report.acked) == sorted(report.published) == sorted(j.id for j in jobs.values())
    assert queue.job_ids == [j.id for j in jobs.values()]
    assert queue.delay_store.stats()[0].scheduled == 0 and conn.zcard(queue.scheduled_job_registry.key) == 0


def test_results_match_the_general_path_and_a_real_worker_runs_them(
    conn: redis.Redis, prefix: str, processes: Processes
) -> None:
    """Status, job hash, queue order (at_front and not), registries: the same either way."""
    tags = ["plain", "front", "timeout", "cancelled", "deleted", "plain2", "front2", "meta"]
    options: dict[str, dict[str, Any]] = {
        "front": {"at_front": True}, "front2": {"at_front": True}, "timeout": {"job_timeout": 42},
        "meta": {"result_ttl": 300, "meta": {"k": 1}, "description": "d"},
    }  # fmt: skip
    queues = {}
    for path, target in (("script", RQTarget), ("general", GeneralPath)):
        queue = one_shard_queue(conn, f"{prefix}-{path}")
        waiting = queue.enqueue(RECORD, "waiting")  # the front jobs go before it, the others after
        jobs = schedule(queue, tags, **options)
        jobs["cancelled"].cancel()
        jobs["deleted"].delete()
        assert Forwarder(queue.delay_store, [target(conn)]).run_once() == len(tags)
        queues[path] = (queue, {**jobs, "waiting": waiting})

    def tag_order(path: str) -> list[str]:
        queue, jobs = queues[path]
        by_id = {j.id: tag for tag, j in jobs.items()}
        return [by_id[i] for i in queue.job_ids]

    assert tag_order("script") == tag_order("general") == ["front2", "front", "waiting", "plain", "timeout",
                                                           "plain2", "meta"]  # fmt: skip
    for tag in tags:
        (ours, our_jobs), (theirs, their_jobs) = queues["script"], queues["general"]
        a, b = conn.hgetall(our_jobs[tag].key), conn.hgetall(their_jobs[tag].key)
        assert {k: v for k, v in a.items() if k not in VARIABLE} == {k: v for k, v in b.items() if k not in VARIABLE}
        if a:
            assert (a[b"origin"], b[b"origin"]) == (ours.name.encode(), theirs.name.encode())
    for queue, jobs in queues.values():
        assert queue.delay_store.stats()[0].scheduled == 0 and queue.delay_store.stats()[0].leased == 0
        assert conn.zcard(queue.scheduled_job_registry.key) == 0 and conn.sismember("rq:queues", queue.key)
        assert CanceledJobRegistry(queue.name, connection=conn).get_job_ids() == [jobs["cancelled"].id]
        assert not conn.exists(jobs["deleted"].key)
    order = tag_order("script")
    processes.worker(*(q.name for q, _ in queues.values()), burst=True).wait(60)
    for queue, jobs in queues.values():
        ran = [r["tag"] for r in runs(conn, queue.name)]
        assert ran == order, f"{queue.name} ran {ran}"
        finished = FinishedJobRegistry(queue.name, connection=conn)
        assert sorted(finished.get_job_ids()) == sorted(jobs[t].id for t in ran)
        assert all(Job.fetch(jobs[t].id, connection=conn).get_status() == JobStatus.FINISHED for t in ran)


def test_bad_jobs_in_a_batch_are_settled_with_a_reason_and_the_rest_moves_in_order(
    conn: redis.Redis, prefix: str, processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    """A deleted hash and a status that is not UTF-8 are skipped (acked, logged), a job whose
    origin field is not UTF-8 moves (the move writes its queue's name, as RQ's enqueue does),
    a key of another type is a dead letter naming its type; the good jobs keep their order
    across the script's part of the batch and the general path's."""
    queue = one_shard_queue(conn, f"{prefix}-bad")
    tags = ["deleted", "garbled", "good1", "origin", "wrongtype", "good2"]
    jobs = schedule(queue, tags)
    jobs["deleted"].delete()
    conn.hset(jobs["garbled"].key, "status", b"\xff\xfe")
    conn.hset(jobs["origin"].key, "origin", b"\xff\xfe")
    conn.delete(jobs["wrongtype"].key)
    conn.rpush(jobs["wrongtype"].key, "not a hash")  # written by another tool
    store = queue.delay_store
    with caplog.at_level(logging.INFO, logger="delayq.rq"):
        assert Forwarder(store, [RQTarget(conn)], retry_delay=0.05).run_once() == len(tags)
    assert queue.job_ids == [jobs[t].id for t in ("good1", "origin", "good2")]
    (dead,) = store.dead_letters()
    assert dead.id == jobs["wrongtype"].id and "holds a list, not a hash" in dead.error
    assert f"job {jobs['deleted'].id} was deleted while scheduled: skipped" in caplog.text
    assert f"job {jobs['garbled'].id} is \ufffd\ufffd, no longer scheduled: skipped" in caplog.text
    assert store.stats()[0].scheduled == 0 and conn.hget(jobs["garbled"].key, "status") == b"\xff\xfe"
    processes.worker(queue.name, burst=True).wait(60)
    assert [r["tag"] for r in runs(conn, queue.name)] == ["good1", "origin", "good2"]


def test_a_store_on_another_server_gets_the_script_without_the_ack(
    conn: redis.Redis, valkey_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's Redis apart from the store: the script moves (no lease to check there), the
    forwarder acks after it."""
    other = redis.Redis.from_url(valkey_url.rsplit("/", 1)[0] + "/7")
    store = DelayStore(other, Config(prefix=prefix, shards=1))
    queue = Queue(f"{prefix}-apart", connection=conn, delay_store=store)
    target = warmed_up(RQTarget(conn), queue)
    jobs = schedule(queue, ["a", "b", "c"], b={"at_front": True})
    (claim,) = claim_all(store)
    with counting_commands(monkeypatch) as sent:
        report = target.publish_claimed(deliveries(claim), Lease(store, claim))
    assert sent == [1] and report.acked == [] and len(report.published) == 3
    assert queue.job_ids == [jobs[t].id for t in ("b", "a", "c")]
    assert store.stats()[0].leased == 3  # the forwarder's ack is still to come
    other.close()
