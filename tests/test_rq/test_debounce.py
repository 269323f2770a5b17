"""RQ's ``enqueue_in(..., delayq_debounce=...)``: schedules of one key collapse into one run,
moved by a real forwarder into a real ``rq worker``; the jobs that will not run are deleted.
``job.meta["delayq_rate_key"]`` is stored with the job for per-key rate caps."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
from rq.exceptions import NoSuchJobError
from rq.job import Job

from delayq_backends import DelayStore, Envelope, InvalidDebounceError
from delayq_backends.envelope import rate_key_of
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for


def exists(queue: Queue, job_id: str) -> bool:
    try:
        Job.fetch(job_id, connection=queue.connection)
    except NoSuchJobError:
        return False
    return True


@pytest.mark.parametrize("mode, keep", [("debounce", "last"), ("debounce", "first"), ("throttle", "first")])
def test_1000_schedules_of_one_key_run_once_at_the_right_time_with_the_chosen_args(
    queue: Queue, rq_store: DelayStore, processes: Processes, mode: str, keep: str
) -> None:
    processes.forwarder()
    processes.worker(queue.name)
    option = {"key": "report-7", "mode": mode, "keep": keep}
    window = 4.0 if mode == "debounce" else 12.0  # a throttle fires a window after the FIRST send
    jobs, sent = [], []
    for i in range(1000):
        sent.append(time.time())
        jobs.append(queue.enqueue_in(timedelta(seconds=window), "tests.test_rq.jobs.record", i, delayq_debounce=option))
    item = rq_store.get(f"{mode}:report-7")
    assert item is not None and item.calls == 1000
    kept = 999 if keep == "last" else 0
    assert Envelope.decode(item.envelope).meta["job"] == jobs[kept].id
    # the jobs that will not run are deleted, with their registry entries
    assert [j.id for j in jobs if exists(queue, j.id)] == [jobs[kept].id]
    assert queue.scheduled_job_registry.get_job_ids() == [jobs[kept].id]
    due = (sent[-1] if mode == "debounce" else sent[0]) + window
    wait_for(lambda: len(runs(queue.connection, queue.name)) >= 1, 30, "the run")
    time.sleep(0.5)  # a second run would come at once: none does
    [run] = runs(queue.connection, queue.name)
    assert (run["id"], run["tag"]) == (jobs[kept].id, kept)
    assert due - 0.05 <= run["at"] <= due + 2.0, run["at"] - due
    assert rq_store.get(f"{mode}:report-7") is None


def test_a_schedule_after_the_fire_runs_again_and_a_retry_is_not_collapsed(queue: Queue, forwarder: Forwarder) -> None:
    first = queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.record", "a", delayq_debounce="k")
    wait_for(lambda: forwarder.run_once() and queue.job_ids == [first.id], 5, "the first run queued")
    second = queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.record", "b", delayq_debounce="k")
    wait_for(lambda: forwarder.run_once() and queue.job_ids == [first.id, second.id], 5, "the second run queued")
    # the option belongs to that enqueue only: a plain schedule afterwards is not collapsed
    plain = queue.enqueue_in(timedelta(seconds=60), "tests.test_rq.jobs.record", "c")
    assert queue.delay_store.get(plain.id) is not None


def test_bad_options_are_refused_and_nothing_is_saved(queue: Queue, rq_store: DelayStore) -> None:
    for option in ({"key": "k", "keep": "all"}, {"mode": "throttle"}, 42):
        with pytest.raises(InvalidDebounceError):
            queue.enqueue_in(timedelta(seconds=5), "tests.test_rq.jobs.record", 1, delayq_debounce=option)
    with pytest.raises(InvalidDebounceError, match="pipeline"), queue.connection.pipeline() as pipe:
        queue.enqueue_in(timedelta(seconds=5), "tests.test_rq.jobs.record", 1, delayq_debounce="k", pipeline=pipe)
    assert queue.scheduled_job_registry.get_job_ids() == [] and list(rq_store.scan()) == []


def test_rate_key_in_job_meta_is_stored_with_the_job(queue: Queue, rq_store: DelayStore) -> None:
    job = queue.enqueue_in(timedelta(seconds=60), "tests.test_rq.jobs.record", 1, meta={"delayq_rate_key": "t-1"})
    item = rq_store.get(job.id)
    assert item is not None and rate_key_of(Envelope.decode(item.envelope)) == "t-1"
    debounced = queue.enqueue_in(
        timedelta(seconds=60), "tests.test_rq.jobs.record", 2, meta={"delayq_rate_key": "t-2"}, delayq_debounce="d"
    )
    item = rq_store.get("debounce:d")
    assert item is not None and rate_key_of(Envelope.decode(item.envelope)) == "t-2"
    assert Envelope.decode(item.envelope).meta["job"] == debounced.id


def test_a_garbage_job_id_in_the_envelope_is_buried_with_the_reason(
    queue: Queue, rq_store: DelayStore, forwarder: Forwarder
) -> None:
    junk = replace(queue.envelope(), meta={**queue.envelope().meta, "job": 42})
    rq_store.schedule("debounce:junk", 1.0, junk)
    forwarder.run_once()
    [dead] = rq_store.dead_letters()
    assert dead.id == "debounce:junk" and "job id '42' is not a job id" in dead.error
