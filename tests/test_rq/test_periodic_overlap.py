"""Overlap policies of RQ periodic jobs (``Scheduler.schedule(..., interval=, overlap=)`` and
``Scheduler.cron(..., overlap=)``) with real ``rq worker --worker-class SlotWorker`` processes
and a real ``delayq forward --rq-redis``: three jobs every 2 s whose runs take longer than
that. By the start and end times the runs record: under ``skip`` and ``buffer_one`` no two runs
of a job overlap and the skipped periods are counted in the job's envelope; under ``allow``
they overlap (what the other two would do unchecked)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from rq import Worker

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.envelope import Envelope, slot_of
from delayq_backends.errors import ConfigError
from delayq_backends.forwarder import Forwarder
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.rq import Queue, RQTarget, Scheduler
from delayq_backends.rq.periodic import InvalidScheduleError, due_between
from delayq_backends.store import SlotRun
from tests.harness.rq import Processes, runs
from tests.helpers import max_overlap, wait_for
from tests.test_rq.conftest import SHARDS
from tests.test_rq.jobs import hold

HOLDS = {"skip": 5.0, "buffer_one": 5.0, "allow": 3.0}


def _schedule(store: DelayStore, job_id: str) -> dict[str, Any]:
    item = store.get(job_id)
    assert item is not None
    return dict(Envelope.decode(item.envelope).meta["schedule"])


def _spans(conn: redis.Redis, queue: Queue, job_id: str) -> list[tuple[float, float]]:
    return sorted((r["at"], r["ended"]) for r in runs(conn, queue.name) if r["id"] == job_id)


def test_skip_and_buffer_one_never_overlap_and_count_what_they_skip(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    for _ in range(4):
        processes.worker(queue.name, extra=("--worker-class", "delayq_backends.rq.SlotWorker"))
    # workers up first: a run waiting in the queue for a worker holds its slot too (skips counted)
    wait_for(lambda: len(Worker.all(connection=conn, queue=queue)) == 4, 60, "4 workers")
    scheduler = Scheduler(queue=queue, connection=conn, delay_store=rq_store)
    now = datetime.now(timezone.utc)
    jobs = {
        policy: scheduler.schedule(now, hold, args=[policy, seconds], interval=2, overlap=policy).id
        for policy, seconds in HOLDS.items()
    }
    processes.forwarder("--poll", "0.2")
    wait_for(
        lambda: all(len(_spans(conn, queue, jobs[p])) >= 2 for p in ("skip", "buffer_one")),
        40,
        lambda: f"two runs each: {[len(_spans(conn, queue, j)) for j in jobs.values()]}",
    )
    counted = {policy: int(_schedule(rq_store, job_id).get("skipped", 0)) for policy, job_id in jobs.items()}
    for policy, job_id in jobs.items():  # what was measured (shown with -s)
        print(f"rq {policy}: {len(_spans(conn, queue, job_id))} runs, {counted[policy]} skipped")

    spans = _spans(conn, queue, jobs["skip"])
    assert max_overlap(spans) == 1 and len(spans) >= 2, spans
    assert all(b[0] - a[0] >= 5 for a, b in zip(spans, spans[1:])), spans
    assert counted["skip"] >= len(spans) - 1 >= 1, (counted, spans)

    spans = _spans(conn, queue, jobs["buffer_one"])
    assert max_overlap(spans) == 1 and len(spans) >= 2, spans
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    assert all(gap < 1.5 for gap in gaps), gaps  # the one waiting moves right after the run ends
    assert counted["buffer_one"] >= 1, counted

    assert max_overlap(_spans(conn, queue, jobs["allow"])) >= 2
    assert counted["allow"] == 0
    for policy in ("skip", "buffer_one"):  # the slot is the job's, limit 1, named in its meta
        key = f"periodic:{jobs[policy]}"
        assert conn.hgetall(f"rq:job:{jobs[policy]}") and rq_store.slot_status(key).limit in (None, 1)


def test_the_policy_is_stored_in_the_envelope_and_the_slot_in_the_job(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore
) -> None:
    scheduler = Scheduler(queue=queue, connection=conn, delay_store=rq_store)
    job = scheduler.cron("*/5 * * * *", hold, args=["c", 0], overlap="buffer_one")
    assert _schedule(rq_store, job.id)["overlap"] == "buffer_one"
    assert job.meta["delayq_slot"] == {"key": f"periodic:{job.id}", "limit": 1}
    stored = rq_store.get(job.id)
    assert stored is not None and slot_of(Envelope.decode(stored.envelope)) is None  # asked at fire time
    plain = scheduler.schedule(datetime.now(timezone.utc), hold, args=["p", 0], interval=60)
    assert "overlap" not in _schedule(rq_store, plain.id) and "delayq_slot" not in plain.meta


def test_a_bad_policy_is_refused_naming_the_job_and_the_policies(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore
) -> None:
    scheduler = Scheduler(queue=queue, connection=conn, delay_store=rq_store)
    with pytest.raises(ConfigError, match=r"'nightly'.*'queue'.*'allow', 'skip', 'buffer_one'"):
        scheduler.cron("0 3 * * *", hold, args=["n", 0], id="nightly", overlap="queue")
    with pytest.raises(ConfigError, match="tests.test_rq.jobs.hold"):
        scheduler.schedule(datetime.now(timezone.utc), hold, interval=5, overlap="Skip")
    with pytest.raises(InvalidScheduleError, match="interval"):
        scheduler.schedule(datetime.now(timezone.utc), hold, overlap="skip")  # runs once: nothing to overlap
    assert rq_store.get("nightly") is None


def test_due_between_counts_the_periods_a_waiting_run_passed_over() -> None:
    assert due_between({"interval": 2}, 100.0, 105.5) == 2
    assert due_between({"interval": 2}, 100.0, 100.0) == 0
    hourly = {"cron_string": "0 * * * *", "cron_syntax": "cron"}
    start = datetime(2026, 1, 1, 0, 30, tzinfo=timezone.utc).timestamp()
    assert due_between(hourly, start, start + 3 * 3600) == 3


def test_delayq_list_shows_a_jobs_policy_and_skipped_periods(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, valkey_url: str, prefix: str
) -> None:
    scheduler = Scheduler(queue=queue, connection=conn, delay_store=rq_store)
    job = scheduler.cron("0 3 * * *", hold, args=["n", 0], id="nightly", overlap="skip")
    item = rq_store.get(job.id)
    assert item is not None
    envelope = Envelope.decode(item.envelope)  # as the forwarder leaves it after three skips
    counted = {**envelope.meta, "schedule": {**envelope.meta["schedule"], "skipped": 3}}
    rq_store.schedule(job.id, item.ready_ms / 1000, Envelope(envelope.target, envelope.destination, meta=counted))
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": str(SHARDS)}
    listed = CliRunner().invoke(main, ["list", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    [entry] = json.loads(listed.output)
    assert (entry["job"]["overlap"], entry["job"]["skipped"]) == ("skip", 3)
    assert "[skip: 3 skipped]" in CliRunner().invoke(main, ["list"], env=env).output


def test_the_forwarder_skips_buffers_and_counts_in_process(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore
) -> None:
    """One forwarder pass at a time (the worker's holds played by ``hold_slots``, as SlotWorker
    names them: the job id): what each policy does with a period whose previous run holds the
    slot, what it counts in the envelope and tells the metrics."""
    metrics = ForwarderMetrics()
    forwarder = Forwarder(rq_store, [RQTarget(conn)], retry_delay=0.05, metrics=metrics)

    def told(job_id: str) -> float:
        return float(metrics.periodic_skipped.labels(job_id)._value.get())

    scheduler = Scheduler(queue=queue, connection=conn, delay_store=rq_store)
    # a second ago: a ready time "now" rounds up a millisecond, past a claim made in the same one
    first = datetime.now(timezone.utc) - timedelta(seconds=1)
    skip = scheduler.schedule(first, hold, args=["s", 0], interval=2, overlap="skip")
    buffer = scheduler.schedule(first, hold, args=["b", 0], interval=2, overlap="buffer_one")
    forwarder.run_once()
    assert conn.llen(queue.key) == 2  # both free: moved
    for job in (skip, buffer):
        rq_store.hold_slots({f"periodic:{job.id}": [SlotRun(job.id, "")]}, "start", hold_ms=60_000)  # their runs start
        rq_store.reschedule(job.id, time.time() - 5)  # the next period, 5 s late
    forwarder.run_once()
    assert conn.llen(queue.key) == 2
    assert _schedule(rq_store, skip.id)["skipped"] == 1 and (told(skip.id), told(buffer.id)) == (1, 0)
    item = rq_store.get(skip.id)
    assert item is not None and item.ready_ms > time.time() * 1000  # its next period
    assert rq_store.slot_status(f"periodic:{buffer.id}").waiting == 1  # waits, first in line
    rq_store.hold_slots({f"periodic:{buffer.id}": [SlotRun(buffer.id, "")]}, "end")  # its run ends
    time.sleep(0.3)
    forwarder.run_once()
    assert conn.llen(queue.key) == 3  # moved as soon as free, and the periods it waited over counted
    assert _schedule(rq_store, buffer.id)["skipped"] == 2 and told(buffer.id) == 2
