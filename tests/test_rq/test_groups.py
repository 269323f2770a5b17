"""Groups with real ``rq worker --worker-class delayq_backends.rq.SlotWorker`` processes and a
real ``delayq forward --rq-redis``: ``delayq_group=`` on ``Queue.enqueue``/``enqueue_in``/
``enqueue_at`` and on rq-scheduler's ``enqueue_at``/``enqueue_in`` stores the job with its groups
(in its envelope and its meta), the job arrives at its worker with them, and the worker holds
each of them while it runs (one token for all); a bad option saves nothing."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.envelope import Envelope, Group, groups_of
from delayq_backends.errors import InvalidGroupError
from delayq_backends.rq import Queue, Scheduler
from delayq_backends.rq.jobs import slot_token_key
from delayq_backends.rq.slots import Slots
from delayq_backends.store import slot_member
from tests.harness.rq import Processes, runs
from tests.helpers import group_running, hold_in_groups, wait_for
from tests.test_rq.jobs import hold, record, throttles

WORKER = ("--worker-class", "delayq_backends.rq.SlotWorker")


def stored_groups(store: DelayStore, job_id: str) -> tuple[Group, ...]:
    item = store.get(job_id)
    assert item is not None, f"job {job_id} is not in the store"
    return groups_of(Envelope.decode(item.envelope))


def test_grouped_jobs_are_stored_with_their_groups_and_their_workers_get_them(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes, prefix: str
) -> None:
    scheduler = Scheduler(f"{prefix}-s", queue=queue, connection=conn, delay_store=rq_store)
    soon = timedelta(milliseconds=300)
    listed = ["tenant-7", Group("api", weight=3, cost=5)]
    jobs = {
        "now": queue.enqueue(record, "now", delayq_group="tenant-7"),  # no delay: through the store all the same
        "in": queue.enqueue_in(soon, record, "in", delayq_group={"key": "t-7", "limit": 2, "rate": "10/s"}),
        "at": queue.enqueue_at(datetime.now(timezone.utc) + soon, record, "at", delayq_group=listed),
        "scheduler": scheduler.enqueue_in(soon, record, "scheduler", delayq_group={"key": "t-7", "limit": 2}),
    }
    expected = {
        "now": [{"key": "tenant-7"}],
        "in": [{"key": "t-7", "limit": 2, "rate": "10/s"}],
        "at": [{"key": "tenant-7"}, {"key": "api", "weight": 3.0, "cost": 5}],
        "scheduler": [{"key": "t-7", "limit": 2}],
    }
    for tag, job in jobs.items():
        assert stored_groups(rq_store, job.id) == tuple(Group.parse(g) for g in expected[tag])
        assert job.meta["delayq_group"] == expected[tag]
    assert queue.enqueue(record, "plain").get_status() == "queued"  # no group: RQ's own enqueue
    assert queue.enqueue(record, "empty", delayq_group=[]).get_status() == "queued"  # an empty list is none
    processes.worker(queue.name, extra=WORKER)
    processes.forwarder("--poll", "0.2")
    ran = lambda: {r["tag"]: r for r in runs(conn, queue.name)}  # noqa: E731
    wait_for(lambda: ran().keys() >= {*jobs, "plain", "empty"}, 60, lambda: f"ran {sorted(ran())}")
    assert {tag: ran()[tag].get("group") for tag in jobs} == expected
    assert "group" not in ran()["plain"]
    # the worker reports each end just after the job's own record: every hold is given back
    wait_for(
        lambda: group_running(rq_store, "tenant-7") == 0 and group_running(rq_store, "t-7") == 0,
        10,
        lambda: f"running: tenant-7 {group_running(rq_store, 'tenant-7')}, t-7 {group_running(rq_store, 't-7')}",
        interval=0.05,
    )


def test_a_worker_holds_each_group_with_the_one_token_and_gives_all_back(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    """Slots taken in two groups for one job, as a forwarder releases it, with the token where
    its worker reads it: the worker's start holds both, its end gives both back (without it they
    would stay taken for the minute of the start window)."""
    tag = uuid.uuid4().hex[:8]
    keys = [f"g1-{tag}", f"g2-{tag}"]
    job = queue.enqueue_in(timedelta(seconds=2), hold, "held", 1.0, delayq_group=keys)
    token = uuid.uuid4().hex
    hold_in_groups(rq_store, keys, slot_member(job.id, None), token)
    conn.set(slot_token_key(job.key), token, ex=600)
    assert [group_running(rq_store, k) for k in keys] == [1, 1]
    processes.worker(queue.name, extra=WORKER)
    processes.forwarder("--poll", "0.2")
    wait_for(lambda: any(r["id"] == job.id for r in runs(conn, queue.name)), 60, "the job to run")
    wait_for(lambda: [group_running(rq_store, k) for k in keys] == [0, 0], 10, "every group's slot given back")


def _job_keys(conn: redis.Redis) -> int:
    return sum(1 for _ in conn.scan_iter("rq:job:*", count=1000))


@pytest.mark.parametrize(
    ("group", "says"),
    [
        ({"key": "t", "limit": 0}, "limit"),
        ({"key": "t", "weight": "heavy"}, "weight"),
        (["a", "b", "c", "d"], "at most 3"),
        ({"key": "t", "limti": 2}, "unknown field.*limti"),
    ],
)
def test_a_bad_group_saves_nothing_and_says_why(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, prefix: str, group: Any, says: str
) -> None:
    scheduler = Scheduler(f"{prefix}-s", queue=queue, connection=conn, delay_store=rq_store)
    later = timedelta(hours=1)
    before = _job_keys(conn)
    calls = [
        lambda: queue.enqueue(record, "x", delayq_group=group),
        lambda: queue.enqueue_in(later, record, "x", delayq_group=group),
        lambda: queue.enqueue_at(datetime.now(timezone.utc) + later, record, "x", delayq_group=group),
        lambda: scheduler.enqueue_in(later, record, "x", delayq_group=group),
    ]
    for call in calls:
        with pytest.raises(InvalidGroupError, match=says):
            call()
    assert _job_keys(conn) == before
    assert sum(s.scheduled for s in rq_store.stats()) == 0 and queue.count == 0


def test_group_goes_with_slot_rate_key_and_debounce(queue: Queue, rq_store: DelayStore) -> None:
    """The job's slot and rate key are groups too (aliases): they count towards the 3 and name a
    key once; a debounced job keeps its groups."""
    later = timedelta(hours=1)
    meta = {"delayq_rate_key": "r"}
    both = queue.enqueue_in(
        later,
        record,
        "x",
        delayq_group={"key": "t-7", "rate": "5/s"},
        delayq_slot={"key": "t-7", "limit": 2},
        meta=meta,
    )
    assert stored_groups(rq_store, both.id) == (Group("t-7", 2, "5/s"), Group("r"))
    assert Slots._groups_of(both) == (Group("t-7", 2, "5/s"),)  # what the worker holds: not the rate key
    with pytest.raises(InvalidGroupError, match="at most 3 groups"):
        queue.enqueue_in(later, record, "x", delayq_group=["a", "b", "c"], meta=meta)
    queue.enqueue_in(timedelta(seconds=30), record, "d", delayq_group=["t-7", "doc"], delayq_debounce="doc-1")
    assert stored_groups(rq_store, "debounce:doc-1") == (Group("t-7"), Group("doc"))


def test_a_job_throttles_any_of_its_groups(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    """``delayq_backends.rq.throttle`` from inside a job of two groups throttles the one it names
    (proven by the job's token), not the other."""
    tag = uuid.uuid4().hex[:8]
    keys = [f"g1-{tag}", f"g2-{tag}"]
    job = queue.enqueue_in(timedelta(seconds=2), throttles, "t", keys[1], 60, delayq_group=keys)
    token = uuid.uuid4().hex
    hold_in_groups(rq_store, keys, slot_member(job.id, None), token)
    conn.set(slot_token_key(job.key), token, ex=600)
    processes.worker(queue.name, extra=WORKER)
    processes.forwarder("--poll", "0.2")
    wait_for(lambda: any(r["id"] == job.id for r in runs(conn, queue.name)), 60, "the job to run")
    group_running(rq_store, keys[1])  # a take reads the report
    assert rq_store.group_policy(keys[1]).throttled_until is not None
    assert rq_store.group_policy(keys[0]).throttled_until is None
