"""One RQ job whose next run cannot be planned fails alone (issue 21, finding 3): the jobs claimed
with it are moved at once, and a cron string with no later match ends its schedule cleanly."""

from __future__ import annotations

from datetime import datetime

import pytest
import redis

from delayq_backends import Config, DelayStore
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import InvalidScheduleError, Queue, RQTarget, Scheduler
from tests.helpers import PAST, wait_for

RECORD = "tests.test_rq.jobs.record"


def test_a_cron_job_past_its_last_year_is_moved_with_its_batch_and_its_schedule_ends(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's "0 9 * * 1-5 2026" after the last weekday of its year, made due now: its last
    weekday is in the past (2025's here), so the forwarder finds no later match. It raised
    AttributeError in the plan and failed the whole batch (every job retried, then dead-lettered)."""
    last_weekday_2025 = datetime(2025, 12, 31, 8).timestamp()  # a Wednesday, host-local as rq-scheduler reads
    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store, clock=lambda: last_weekday_2025)
    cron = scheduler.cron("0 9 * * 1-5 2025", RECORD, args=["cron"])
    others = [queue.enqueue_at(PAST, RECORD, "other", i) for i in range(20)]
    forwarder = Forwarder(rq_store, [RQTarget(conn)], retry_delay=0.05)

    assert forwarder.run_once() == 21
    assert conn.llen(f"rq:queue:{queue.name}") == 21, "every job of the batch is in its queue"
    assert forwarder.stats.retried == forwarder.stats.dead == 0 and rq_store.dead_letters() == []
    assert rq_store.get(cron.id) is None, "no next run: the schedule ended"
    assert all(rq_store.get(j.id) is None for j in others)
    assert "no later match" in caplog.text and "AttributeError" not in caplog.text


def test_a_job_whose_schedule_raises_fails_alone_with_the_reason(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue
) -> None:
    """A schedule the planner cannot read (an interval that is no number, written by another tool)
    raised out of the target: the 20 jobs claimed with it were retried, then dead-lettered."""
    scheduler = Scheduler(queue.name, connection=conn, delay_store=rq_store)
    bad = scheduler.schedule(datetime(2020, 1, 1), RECORD, args=["bad"], interval=60)
    item = rq_store.get(bad.id)
    assert item is not None
    envelope = Envelope.decode(item.envelope)
    meta = {**envelope.meta, "schedule": {"interval": "soon"}}
    rq_store.schedule(bad.id, 0, Envelope(envelope.target, envelope.destination, meta=meta))
    others = [queue.enqueue_at(PAST, RECORD, "other", i) for i in range(20)]
    forwarder = Forwarder(rq_store, [RQTarget(conn)], retry_delay=0.05)

    forwarder.run_once()
    assert conn.llen(f"rq:queue:{queue.name}") == 20 and all(rq_store.get(j.id) is None for j in others)
    (dead,) = rq_store.dead_letters()
    assert dead.id == bad.id and "could not convert string to float: 'soon'" in dead.error


def test_cron_with_no_run_ahead_is_refused_naming_the_string(scheduler: Scheduler) -> None:
    """Issue 22: it raised AttributeError."""
    with pytest.raises(InvalidScheduleError, match=r"'0 0 \* \* \* 2025' never matches again"):
        scheduler.cron("0 0 * * * 2025", RECORD)


@pytest.fixture
def scheduler(conn: redis.Redis, rq_store: DelayStore, prefix: str) -> Scheduler:
    return Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store)


def test_a_password_changed_under_the_rq_target_pauses_it_and_burns_no_attempt(
    valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RQ's Redis with an ACL user whose password changes while jobs fall due: they wait in the
    store with no attempt counted and move once the password is right again."""
    with EmbeddedServer() as server:
        admin = redis.Redis(port=server.port)
        admin.acl_setuser("rq", enabled=True, passwords=["+right"], keys=["*"], channels=["*"], commands=["+@all"])
        rq_conn = redis.Redis(port=server.port, username="rq", password="right")
        store = DelayStore(redis.Redis.from_url(valkey_url), Config(prefix=prefix, shards=2))
        queue = Queue(f"{prefix}-q", connection=rq_conn, delay_store=store)
        jobs = [queue.enqueue_at(PAST, RECORD, "late", i) for i in range(10)]
        forwarder = Forwarder(store, [RQTarget(rq_conn)], max_outage_backoff=0.5)

        admin.acl_setuser("rq", enabled=True, reset_passwords=True, passwords=["+changed"])
        admin.client_kill_filter(user="rq")
        assert forwarder.run_once() == 10
        assert forwarder.stats.deferred == 10 and forwarder.stats.retried == forwarder.stats.dead == 0
        assert [store.get(j.id).attempts for j in jobs] == [0] * 10  # type: ignore[union-attr]
        assert caplog.text.count("paused by a configuration error") == 1

        admin.acl_setuser("rq", enabled=True, reset_passwords=True, passwords=["+right"])
        wait_for(lambda: forwarder.run_once() >= 0 and admin.llen(f"rq:queue:{queue.name}") == 10, 15, "the jobs")
        assert store.dead_letters() == [] and "works again" in caplog.text
