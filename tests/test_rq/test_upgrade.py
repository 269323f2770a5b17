"""`delayq rq-upgrade`: periodic and cron jobs stored by delayq_backends 0.1 keep running.

0.1's Scheduler kept a job's schedule only in its pickled ``job.meta``; today's forwarder never
unpickles, so without the upgrade it dead-letters them. The legacy writes below reproduce 0.1's
``Scheduler._schedule`` (commit 5c60b5b) byte for byte in what they store.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from click.testing import CliRunner
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from delayq_backends import DelayStore, Envelope
from delayq_backends.cli import main
from delayq_backends.models import FailedDelivery, ScheduledItem
from delayq_backends.rq import Queue, upgrade
from delayq_backends.rq.jobs import job_rank
from tests.harness import make_store
from tests.harness.rq import SHARDS, Processes, runs
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"
#: What 0.1's ``job_envelope(origin, queue_class=Queue, job_class=Job, scheduler=True)`` stored.
LEGACY_META = {"scheduler": True}


def legacy_schedule(
    conn: redis.Redis,
    rq_store: DelayStore,
    queue_name: str,
    ready: datetime,
    tag: str,
    schedule: dict[str, Any],
    *,
    at_front: bool = False,
    serializer: Any = None,
) -> Job:
    """0.1's ``Scheduler.schedule``/``cron``: the schedule in ``job.meta`` (pickled by default),
    the job hash saved, then its id scheduled with an envelope that says only it is a Scheduler's."""
    job = Job.create(
        RECORD, args=[tag], connection=conn, status=JobStatus.SCHEDULED, result_ttl=-1, serializer=serializer
    )
    job.origin = queue_name
    job.meta.update(schedule)
    if at_front:
        job.enqueue_at_front = True
    job.save()
    rq_store.schedule(job.id, ready, Envelope("rq", queue_name, meta=LEGACY_META), rank=job_rank(job))
    return job


def cli(rq_store: DelayStore, url: str, command: str, *args: str) -> str:
    """``delayq <command> <args>`` on the test's store; it must succeed."""
    where = ["--url", url, "--prefix", rq_store.config.prefix, "--shards", str(SHARDS)]
    result = CliRunner().invoke(main, [*command.split(), *where, *args])
    assert result.exit_code == 0, result.output
    return result.output


def schedule_in(rq_store: DelayStore, item_id: str) -> dict[str, Any] | None:
    item = rq_store.get(item_id)
    return None if item is None else Envelope.decode(item.envelope).meta.get("schedule")


def but_envelope(item: ScheduledItem | None) -> tuple[Any, ...]:
    assert item is not None
    return (item.id, item.ready_ms, item.rank, item.attempts, item.leased_until_ms)


def test_upgraded_periodic_and_cron_jobs_keep_their_place_and_keep_running(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, valkey_url: str, processes: Processes
) -> None:
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    periodic = legacy_schedule(conn, rq_store, queue.name, past, "p", {"interval": 3600, "repeat": 3})
    cron = legacy_schedule(
        conn, rq_store, queue.name, later, "c", {"cron_string": "0 3 * * *", "use_local_timezone": False}, at_front=True
    )
    retried = legacy_schedule(conn, rq_store, queue.name, past, "r", {"interval": 60})
    claim = rq_store.claim(rq_store.shard_of(retried.id), limit=100)
    rq_store.release(claim, [i.id for i in claim.items if i.id != retried.id])
    retry_at = int(later.timestamp() * 1000)
    rq_store.fail(claim, [FailedDelivery(retried.id, retry_at, "broker down")])  # attempts 1, due later
    one_off = legacy_schedule(conn, rq_store, queue.name, later, "o", {})
    ids = (periodic.id, cron.id, retried.id, one_off.id)
    before = {i: rq_store.get(i) for i in ids}
    assert rq_store.get(retried.id).attempts == 1 and rq_store.get(cron.id).rank == 1  # type: ignore[union-attr]

    output = cli(rq_store, valkey_url, "rq-upgrade", "--rq-redis", valkey_url)
    assert "upgraded 4 scheduled item(s) and 0 dead letter(s)" in output
    assert f'upgraded scheduled {periodic.id}: schedule {{"interval": 3600, "repeat": 3}}' in output
    for item_id in ids:
        assert but_envelope(rq_store.get(item_id)) == but_envelope(before[item_id])  # id, time, rank, attempts
    assert schedule_in(rq_store, periodic.id) == {"interval": 3600, "repeat": 3}
    assert schedule_in(rq_store, cron.id) == {"cron_string": "0 3 * * *", "use_local_timezone": False}
    assert schedule_in(rq_store, retried.id) == {"interval": 60}
    assert schedule_in(rq_store, one_off.id) == {}
    envelopes = {i: rq_store.get(i).envelope for i in ids}  # type: ignore[union-attr]
    again = cli(rq_store, valkey_url, "rq-upgrade")  # idempotent: nothing left to upgrade
    assert "upgraded 0 scheduled item(s) and 0 dead letter(s)" in again
    assert {i: rq_store.get(i).envelope for i in ids} == envelopes  # type: ignore[union-attr]

    processes.forwarder()
    wait_for(lambda: queue.job_ids == [periodic.id], 20, "the forwarder to move the upgraded periodic job")
    wait_for(lambda: schedule_in(rq_store, periodic.id) == {"interval": 3600, "repeat": 2}, 20, "its next run")
    rearmed = rq_store.get(periodic.id)
    assert rearmed is not None and rearmed.ready_ms >= (time.time() + 3500) * 1000
    assert not rq_store.dead_letters()
    assert periodic.get_meta(refresh=True) == {"interval": 3600, "repeat": 3}  # the job hash is left alone


def test_without_the_upgrade_a_dead_letter_names_it_and_after_it_the_job_runs(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, valkey_url: str, processes: Processes
) -> None:
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    job = legacy_schedule(conn, rq_store, queue.name, past, "legacy", {"interval": 3600, "repeat": 2})
    processes.forwarder()
    wait_for(lambda: bool(rq_store.dead_letters()), 20, "the legacy job to be dead-lettered")
    (dead,) = rq_store.dead_letters()
    assert "never unpickles" in dead.error
    assert "`delayq rq-upgrade " in dead.error and f"`delayq dlq requeue {job.id}`" in dead.error
    assert queue.job_ids == []

    output = cli(rq_store, valkey_url, "rq-upgrade", "--rq-redis", valkey_url)
    assert f'upgraded dead letter {job.id}: schedule {{"interval": 3600, "repeat": 2}}' in output
    assert f"delayq dlq requeue {job.id}" in output
    assert "upgraded 0 scheduled item(s) and 0 dead letter(s)" in cli(rq_store, valkey_url, "rq-upgrade")
    cli(rq_store, valkey_url, "dlq requeue", job.id)

    wait_for(lambda: queue.job_ids == [job.id], 20, "the requeued job to be moved")
    wait_for(lambda: schedule_in(rq_store, job.id) == {"interval": 3600, "repeat": 1}, 20, "its next run")
    processes.worker(queue.name, burst=True).wait(60)
    assert [r["tag"] for r in runs(conn, queue.name)] == ["legacy"]
    assert not rq_store.dead_letters()


def test_upgrade_reads_meta_with_the_serializer_and_reports_what_it_cannot_read(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue
) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    as_json = legacy_schedule(conn, rq_store, queue.name, later, "j", {"interval": 5}, serializer=JSONSerializer)
    garbled = legacy_schedule(conn, rq_store, queue.name, later, "g", {"interval": 5})
    conn.hset(garbled.key, "meta", b"\x80not a pickle")
    gone = legacy_schedule(conn, rq_store, queue.name, later, "x", {"interval": 5})
    gone.delete()

    report = upgrade(conn, rq_store, serializer=JSONSerializer, dry_run=True)
    assert report.upgraded == {as_json.id: {"interval": 5}} and report.gone == [gone.id]
    assert [i for i, _ in report.failed] == [garbled.id] and "cannot read its job.meta" in report.failed[0][1]
    assert schedule_in(rq_store, as_json.id) is None  # a dry run writes nothing

    report = upgrade(conn, rq_store, serializer=JSONSerializer)
    assert schedule_in(rq_store, as_json.id) == {"interval": 5}
    assert schedule_in(rq_store, garbled.id) is None and rq_store.exists(gone.id)  # left as they were


def test_replace_envelope_is_a_compare_and_set_that_keeps_the_rest(server_url: str, prefix: str) -> None:
    """On each server kind (a cluster too): only an item still holding ``old`` changes, a leased
    one keeps its lease (its ack still deletes it), and a dead letter can be changed too."""
    store = make_store(server_url, prefix, shards=SHARDS)
    try:
        store.schedule("a", 3600, Envelope("rq", "q", meta=LEGACY_META))
        old = store.get("a").envelope  # type: ignore[union-attr]
        assert not store.replace_envelope("a", b"something else", Envelope("rq", "q"))
        assert store.get("a").envelope == old  # type: ignore[union-attr]
        assert store.replace_envelope("a", old, Envelope("rq", "q2"))
        assert Envelope.decode(store.get("a").envelope).destination == "q2"  # type: ignore[union-attr]
        assert not store.replace_envelope("missing", old, Envelope("rq", "q"))
        assert not store.exists("missing")

        store.schedule("b", 0, old)
        claim = store.claim(store.shard_of("b"))
        leased = store.get("b")
        assert store.replace_envelope("b", old, Envelope("rq", "q2"))
        assert but_envelope(store.get("b")) == but_envelope(leased) and leased.leased_until_ms  # type: ignore[union-attr]
        assert store.ack(claim) == 1 and not store.exists("b")

        store.schedule("c", 0, old)
        claim = store.claim(store.shard_of("c"))
        store.fail(claim, [FailedDelivery("c", None, "legacy")])
        assert store.replace_envelope("c", old, Envelope("rq", "q3"), dead=True)
        (dead,) = store.dead_letters()
        assert Envelope.decode(dead.envelope or b"").destination == "q3" and dead.error == "legacy"
    finally:
        store.client.close()
