"""A worker throttles its group (issue 31): real `rq worker --worker-class
delayq_backends.rq.SlotWorker` processes and a real `delayq forward --rq-redis`; a job of a group
at limit 1 calls ``delayq_backends.rq.throttle``, with the checks of the Celery test
(tests/test_celery/test_group_throttle.py)."""

from __future__ import annotations

import redis

from delayq_backends import DelayStore
from delayq_backends.rq import Queue
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for
from tests.test_celery.test_group_throttle import API, THROTTLE_S, check_runs
from tests.test_rq.jobs import record, throttling


def test_an_rq_job_throttles_its_group_at_every_release(
    conn: redis.Redis, queue: Queue, rq_store: DelayStore, processes: Processes
) -> None:
    for _ in range(2):
        processes.worker(queue.name, extra=("--worker-class", "delayq_backends.rq.SlotWorker"))
    processes.forwarder("--poll", "0.2")
    queue.enqueue(throttling, "first", "api", THROTTLE_S, delayq_slot=API)
    wait_for(lambda: any(r["tag"] == "first" for r in runs(conn, queue.name)), 60, "the first job to run")
    queue.enqueue(record, "second", delayq_slot=API)
    queue.enqueue(throttling, "stranger", "api", THROTTLE_S, delayq_slot="other")
    queue.enqueue(record, "other", delayq_slot="other")
    wait_for(lambda: len(runs(conn, queue.name)) == 4, 60, lambda: f"runs {runs(conn, queue.name)}")
    check_runs({r["tag"]: r for r in runs(conn, queue.name)}, "at", 1)
    wait_for(lambda: rq_store.slot_status("api").running == 0, 10, "every slot given back")
