"""RQ's history hook with real processes: jobs carrying ``meta["delayq_periodic"]`` (as an RQ
periodic entry's runs do), scheduled through delayq's ``Queue``, forwarded by ``delayq forward``
and run by ``rq worker --worker-class delayq_backends.rq.history.PeriodicWorker``: each run's
start and end are recorded in its entry's history (a success, a retry then a final failure)."""

from __future__ import annotations

from datetime import timedelta

import redis
from rq import Retry

from delayq_backends import DelayStore
from delayq_backends.periodic.history import RUN_HEADER, RunMark, read_history
from delayq_backends.rq import Queue
from tests.harness.rq import Processes
from tests.helpers import wait_for
from tests.test_rq.jobs import always_fails, record

WORKER = ("--worker-class", "delayq_backends.rq.history.PeriodicWorker")


def test_a_periodic_runs_start_and_end_are_recorded(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    due = rq_store.clock()
    ok = queue.enqueue_in(
        timedelta(milliseconds=200), record, "ok", meta={RUN_HEADER: RunMark("nightly", due).header()}
    )
    bad_mark = RunMark("flaky", due, "manual").header()
    bad = queue.enqueue_in(
        timedelta(milliseconds=200), always_fails, "bad", retry=Retry(max=1), meta={RUN_HEADER: bad_mark}
    )
    plain = queue.enqueue_in(timedelta(milliseconds=200), record, "plain")
    processes.worker(queue.name, extra=WORKER)
    processes.forwarder("--poll", "0.2")
    found = {}

    def ended() -> bool:
        found.update(nightly=read_history(rq_store, "nightly"), flaky=read_history(rq_store, "flaky"))
        return bool(found["nightly"].runs and found["nightly"].runs[0].outcome) and bool(
            found["flaky"].runs and found["flaky"].runs[0].outcome == "failure"
        )

    wait_for(ended, 30, lambda: f"both runs ended: {found}")
    [run] = found["nightly"].runs
    assert (run.run_id, run.due_ms, run.outcome, run.kind) == (ok.id, due, "success", "scheduled")
    assert run.started_ms is not None and run.finished_ms is not None and run.started_ms <= run.finished_ms
    assert found["nightly"].last_success_ms == run.finished_ms
    [failed] = found["flaky"].runs
    assert (failed.run_id, failed.kind, found["flaky"].last_success_ms) == (bad.id, "manual", None)
    assert plain.id not in {r.run_id for h in found.values() for r in h.runs}
