"""What keeps the RQ paths fast (issue 14): a batch move costs a fixed number of commands
whatever its size (its reads and writes are one script call each), one bad job hash does not
stop the batch it is in, and ``enqueue_at`` sends nothing to RQ's scheduled registry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
import redis.connection
import rq
from rq import Queue as RQQueue
from rq.job import Job

from delayq_backends import Config, DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from delayq_backends.rq.queue import job_writes
from delayq_backends.rq.registry import is_mirror
from delayq_backends.store import Lease
from tests.test_rq.test_target import claim_all, deliveries, schedule_past


def _commands(packed: Any) -> int:
    """How many commands a packed RESP buffer (as redis-py sends it) holds."""
    chunks = [packed] if isinstance(packed, (bytes, str)) else packed
    data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
    count = pos = 0
    while pos < len(data):
        assert data[pos : pos + 1] == b"*", data[pos : pos + 20]
        end = data.index(b"\r\n", pos)
        args, pos = int(data[pos + 1 : end]), end + 2
        for _ in range(args):
            end = data.index(b"\r\n", pos)
            pos = end + 2 + int(data[pos + 1 : end]) + 2
        count += 1
    return count


@contextmanager
def counting_commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts every command this process sends (one entry per send) while the block runs."""
    sent: list[int] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(_commands(command))
        original(self, command, check_health)  # type: ignore[no-untyped-call]

    with monkeypatch.context() as m:
        m.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
        yield sent


def _move_all(conn: redis.Redis, rq_store: DelayStore, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(commands, round trips) of moving every claimed job, one claim per shard, claims excluded."""
    claims = claim_all(rq_store, limit=1000)
    target = RQTarget(conn)
    with counting_commands(monkeypatch) as sent:
        for claim in claims:
            report = target.publish_claimed(deliveries(claim), Lease(rq_store, claim))
            assert sorted(report.acked) == sorted(i.id for i in claim.items)
    return sum(sent), len(sent)


def test_a_batch_move_costs_the_same_commands_for_10_jobs_or_200(
    conn: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads and writes per job were an HMGET and an HSET each, packed and parsed one by one;
    now one script call reads the batch's fields and one writes them."""
    store = DelayStore(conn, Config(prefix=f"{prefix}-one", shards=1))  # one claim, one batch
    queue = Queue(f"{prefix}-one", connection=conn, delay_store=store)
    first = [schedule_past(queue, "warm-up").id]
    _move_all(conn, store, monkeypatch)  # loads the scripts into the server's cache
    small = [schedule_past(queue, i).id for i in range(10)]
    few = _move_all(conn, store, monkeypatch)
    many = [schedule_past(queue, i).id for i in range(200)]
    more = _move_all(conn, store, monkeypatch)
    assert sorted(queue.job_ids) == sorted(first + small + many)
    assert more == few, f"10 jobs: {few} (commands, round trips); 200 jobs: {more}"


def test_a_job_key_of_another_type_is_a_dead_letter_and_the_rest_of_its_batch_moves(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, forwarder: Forwarder
) -> None:
    jobs = [schedule_past(queue, i) for i in range(5)]
    bad = jobs[2]
    conn.delete(bad.key)
    conn.rpush(bad.key, "not a hash")  # written by another tool
    assert forwarder.run_once() == 5
    assert sorted(queue.job_ids) == sorted(j.id for j in jobs if j is not bad)
    (dead,) = rq_store.dead_letters()
    assert dead.id == bad.id and "holds a list, not a hash" in dead.error


def test_jobs_with_and_without_a_timeout_moved_together_keep_theirs_or_get_the_default(
    conn: redis.Redis, queue: Queue, forwarder: Forwarder
) -> None:
    own = schedule_past(queue, "own", job_timeout=42)
    default = schedule_past(queue, "default")
    conn.hdel(default.key, "timeout")  # as a job saved without one (RQ 1.16 leaves it out)
    assert forwarder.run_once() == 2
    assert conn.hget(own.key, "timeout") == b"42"
    assert conn.hget(default.key, "timeout") == str(RQQueue.DEFAULT_TIMEOUT).encode()
    assert {conn.hget(j.key, "status") for j in (own, default)} == {b"queued"}


#: RQ's version as a tuple of ints, for what older RQ lines do differently.
RQ_VERSION = tuple(int(p) for p in rq.__version__.split(".")[:2])


class MirroringQueue(Queue):
    """Records what reaches the registry hook."""

    mirrored: list[tuple[str, datetime]] = []

    def registry_write(self, pipeline: Any, job: Job, datetime: datetime) -> None:
        self.mirrored.append((job.id, datetime))


def test_enqueue_at_sends_nothing_to_rqs_scheduled_registry_and_calls_the_hook_once(
    conn: redis.Redis, rq_store: DelayStore, prefix: str
) -> None:
    """RQ's schedule_job wrote a ZADD to rq:scheduled:<queue> that the next command removed:
    two of the transaction's commands for nothing."""
    queue = MirroringQueue(f"{prefix}-mirror", connection=conn, delay_store=rq_store)
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    job = queue.create_job("tests.test_rq.jobs.record", args=("x",))
    with conn.pipeline() as pipe:
        queue.schedule_job(job, when, pipeline=pipe)
        registry = f"rq:scheduled:{queue.name}"
        touched = [args for args, _ in pipe.command_stack if registry in map(str, args)]
        if RQ_VERSION >= (3,):
            assert touched == []
        else:  # RQ 1.16's and 2.x's registry.schedule ignore the pipeline: their ZADD went out at once
            assert touched == [("ZREM", registry, job.id)]
        pipe.execute()
    assert MirroringQueue.mirrored == [(job.id, when)]
    # RQ 1.16 sets the status in enqueue_at, not in schedule_job
    assert conn.hget(job.key, "status") == (b"scheduled" if RQ_VERSION >= (2,) else b"queued")
    assert rq_store.exists(job.id)
    assert conn.zcard(f"rq:scheduled:{queue.name}") == 0


def test_a_unique_job_leaves_only_its_mirror_entry_in_rqs_scheduled_registry(
    queue: Queue, rq_store: DelayStore
) -> None:
    """rq 3's unique=True writes the registry in its own script, not through the pipeline: its
    real-time entry is removed, and only the mirror entry (which RQ's scheduler never moves) stays."""
    if "unique" not in RQQueue.schedule_job.__code__.co_varnames:
        pytest.skip("this RQ has no unique=True")
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    job = queue.enqueue_at(when, "tests.test_rq.jobs.record", "u", job_id=f"{queue.name}-u", unique=True)
    entries = queue.connection.zrange(f"rq:scheduled:{queue.name}", 0, -1, withscores=True)
    assert rq_store.exists(job.id) and [m for m, _ in entries] == [job.id.encode()]
    assert all(is_mirror(score) for _, score in entries)


def test_enqueue_at_is_one_command_in_one_round_trip(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job hash, its queue in rq:queues, its mirror entry and the store's item were a MULTI/EXEC
    of seven commands, packed and parsed one by one: now one script call writes them all."""
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    queue.enqueue_at(when, "tests.test_rq.jobs.record", "warm-up")  # reads the store's meta, loads the script
    with counting_commands(monkeypatch) as sent:
        job = queue.enqueue_at(when, "tests.test_rq.jobs.record", "one")
    assert sent == [1], f"commands per round trip: {sent}"
    assert conn.sismember("rq:queues", queue.key)
    assert is_mirror(conn.zscore(f"rq:scheduled:{queue.name}", job.id) or 0)
    assert rq_store.get(job.id) is not None
    saved = Job.fetch(job.id, connection=conn)
    assert saved.get_status() == "scheduled" and saved.args == ("one",) and saved.origin == queue.name


def test_enqueue_at_after_a_script_flush_writes_all_of_it(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue
) -> None:
    """A server that lost its script cache (a restart, a failover) refuses the call before any
    write; the job is then scheduled whole, never its hash without its store item."""
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    queue.enqueue_at(when, "tests.test_rq.jobs.record", "warm-up")
    conn.script_flush()
    job = queue.enqueue_at(when, "tests.test_rq.jobs.record", "after")
    assert rq_store.get(job.id) is not None and conn.hget(job.key, "status") == b"scheduled"


def test_a_job_key_of_another_type_fails_the_enqueue_before_the_store_item(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue
) -> None:
    """The script writes RQ's keys first: a job key another tool made a list fails the call
    with no store item pointing at it."""
    job_id = f"{queue.name}-taken"
    conn.rpush(f"rq:job:{job_id}", "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.enqueue_at(datetime.now(timezone.utc) + timedelta(hours=1), "tests.test_rq.jobs.record", job_id=job_id)
    assert not rq_store.exists(job_id)


def test_writes_the_script_does_not_know_go_in_a_transaction_as_rq_queued_them(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job with a TTL also queues EXPIREs: not one script call's writes, so they commit in
    the transaction they were queued on, with the store's item."""
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    queue.enqueue_at(when, "tests.test_rq.jobs.record", "warm-up")
    with counting_commands(monkeypatch) as sent:
        job = queue.enqueue_at(when, "tests.test_rq.jobs.record", "ttl", ttl=600)
    assert len(sent) == 1 and sent[0] > 1, sent
    assert 0 < conn.ttl(job.key) <= 600 and rq_store.get(job.id) is not None
    assert is_mirror(conn.zscore(f"rq:scheduled:{queue.name}", job.id) or 0)


def test_job_writes_reads_only_the_commands_it_knows(queue: Queue) -> None:
    job = queue.create_job("tests.test_rq.jobs.record", args=("x",))
    registry = f"rq:scheduled:{queue.name}"
    usual = [
        (("SADD", "rq:queues", queue.key), {}),
        (("HSET", job.key, "status", "scheduled"), {}),
        (("HSET", job.key, "data", b"d", "status", "scheduled"), {}),
    ]
    ready = datetime.fromtimestamp(5, timezone.utc)
    writes = job_writes(usual, queue, job, ready)
    assert writes is not None and writes.fields == ("status", "scheduled", "data", b"d", "status", "scheduled")
    assert (writes.queue_key, writes.job_key, writes.registry_key, writes.mirror_score) == (
        queue.key,
        job.key,
        registry,
        1e11 + 5,
    )
    expire = (("EXPIRE", job.key, 600), {})
    other_job = (("HSET", "rq:job:other", "status", "scheduled"), {})
    registry_zadd = (("ZADD", registry, 5, job.id), {})  # RQ's own entry: the mirror is the script's
    for extra in (expire, other_job, registry_zadd):
        assert job_writes([*usual, extra], queue, job, ready) is None
    for command in ("SADD", "HSET"):  # each write the script makes must be there
        assert job_writes([c for c in usual if c[0][0] != command], queue, job, ready) is None
