"""One RQ job whose next run cannot be planned fails alone (issue 21, finding 3): the jobs claimed
with it are moved at once, and a cron string with no later match ends its schedule cleanly."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import InvalidScheduleError, Queue, RQTarget, Scheduler

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
    others = [queue.enqueue_in(timedelta(0), RECORD, "other", i) for i in range(20)]
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
    others = [queue.enqueue_in(timedelta(0), RECORD, "other", i) for i in range(20)]
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
