"""Concurrency slots with real `rq worker --worker-class delayq_backends.rq.SlotWorker` processes
(4 of them) and a real `delayq forward --rq-redis`: the jobs of a key with limit 2 never run
more than 2 at once, by the intervals the jobs record themselves, and every job runs once."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import redis

from delayq_backends import DelayStore
from delayq_backends.envelope import Envelope, Slot, slot_of
from delayq_backends.rq import Queue, Scheduler
from tests.harness.rq import Processes, runs
from tests.helpers import max_overlap, wait_for
from tests.test_rq.jobs import hold, started

SECONDS = 0.5


def test_a_key_with_limit_2_never_runs_more_than_2_and_every_job_runs(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    slot = {"key": "customer-42", "limit": 2}
    limited = [queue.enqueue(hold, f"k{i}", SECONDS, delayq_slot=slot).id for i in range(6)]  # no delay
    limited += [
        queue.enqueue_in(timedelta(milliseconds=200), hold, f"d{i}", SECONDS, delayq_slot=slot).id for i in range(2)
    ]
    others = [queue.enqueue(hold, f"o{i}", SECONDS, delayq_slot="other").id for i in range(2)]
    for _ in range(4):
        processes.worker(queue.name, extra=("--worker-class", "delayq_backends.rq.SlotWorker"))
    processes.forwarder("--poll", "0.2")
    done = lambda: {r["id"] for r in runs(conn, queue.name)}  # noqa: E731
    wait_for(lambda: done() >= set(limited + others), 120, lambda: f"{len(done())} jobs done")
    records = runs(conn, queue.name)
    assert sorted(r["id"] for r in records) == sorted(limited + others), "a job ran twice"
    spans = {r["id"]: (r["at"], r["ended"]) for r in records}
    assert max_overlap([spans[i] for i in limited]) == 2  # 4 workers, 2 at once: the limit
    wait_for(lambda: rq_store.slot_status("customer-42").running == 0, 10, "every slot given back")


def test_the_slot_is_stored_with_the_job_by_queue_and_scheduler(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, prefix: str
) -> None:
    """``delayq_slot=`` lands in the job's meta (the worker reads it there, a retry keeps it) and
    in the stored envelope (the forwarder reads it there), with the job's rank."""
    scheduler = Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store)
    jobs = [
        queue.enqueue(hold, "now", 0, delayq_slot="k"),
        queue.enqueue_in(timedelta(seconds=60), hold, "in", 0, delayq_slot={"key": "k", "limit": 3}, at_front=True),
        scheduler.enqueue_in(timedelta(seconds=60), hold, "scheduler", 0, delayq_slot={"key": "k", "limit": 2}),
    ]
    expected = [(Slot("k"), 0), (Slot("k", 3), 1), (Slot("k", 2), 0)]
    for job, slot in zip(jobs, expected):
        stored = rq_store.get(job.id)
        assert stored is not None and slot_of(Envelope.decode(stored.envelope)) == slot
        assert job.meta["delayq_slot"] == {"key": slot[0].key, "limit": slot[0].limit}
    assert queue.enqueue(hold, "plain", 0).get_status() == "queued"  # no slot: RQ's own enqueue


def test_a_killed_worker_gives_its_slot_back_when_its_hold_lapses(
    conn: redis.Redis, queue: Queue, processes: Processes
) -> None:
    """Limit 1: while a long job runs, the next waits; SIGKILL its worker (and work horse) and the
    next starts once the dead worker's hold lapses (DELAYQ_SLOT_HOLD=2 s), not before the kill."""
    processes.env["DELAYQ_SLOT_HOLD"] = "2"
    slot = {"key": "k", "limit": 1}
    queue.enqueue(started, "long", 60, delayq_slot=slot)
    for _ in range(2):
        processes.worker(queue.name, extra=("--worker-class", "delayq_backends.rq.SlotWorker"))
    processes.forwarder("--poll", "0.2")
    starts = lambda: {r["tag"]: r for r in runs(conn, queue.name)}  # noqa: E731
    wait_for(lambda: "long" in starts(), 60, "the long job to start")
    # the next two come once "long" runs: which of a line's items goes first when a new forwarder
    # meets them all due at once is not what this test is about (docs/groups.md, shortfalls)
    for tag in ("a", "b"):
        queue.enqueue_in(timedelta(milliseconds=300), started, tag, 0.1, delayq_slot=slot)
    time.sleep(1.5)  # hold-free waiting would let "a" start now: it must not while "long" runs
    assert "a" not in starts() and "b" not in starts()
    killed = time.time()
    for pid in starts()["long"]["pids"]:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: {"a", "b"} <= starts().keys(), 30, lambda: f"runs {sorted(starts())}")
    delay = starts()["a"]["at"] - killed
    assert 0 < delay < 2 + 2, f"the slot came back {delay:.1f} s after the kill (hold 2 s, + rechecks)"
