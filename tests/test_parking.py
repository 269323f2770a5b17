"""Issue 30, finding 6: items no forwarder can release yet cost everyone. 100,000 planted items of
a newer envelope format were deferred every 5 s for ever, and the other items' lateness p99 went
from 11 ms to 2.5 s. Now they are parked out of the due index: real ``delayq forward``
processes, 100,000 such items (and RQ items beside a forwarder without the rq target), a stream
of good items. The lateness itself is measured by ``bench/parking.py``; this asserts the
structure that makes it: the parked items are not in the due index, a claim reads none of them
(each was claimed exactly once), and they come back for a forwarder that can deliver them.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import redis
from rq import Queue as RQQueue

from bench.lib.items import NEWER_FORMAT, plant_newer
from delayq_backends import DelayStore
from delayq_backends.keys import PARKED_MS
from delayq_backends.rq import Queue
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, Proc, make_store
from tests.helpers import wait_for

SHARDS = 4
#: the finding's count; DELAYQ_PARKING_ITEMS sets fewer for a quick run
PLANTED = int(os.environ.get("DELAYQ_PARKING_ITEMS", "100000"))
RQ_JOBS = 5


def forward(procs: Launcher, store: DelayStore, log: Path, *extra: str) -> Proc:
    url, prefix = store.config.url, store.config.prefix
    args = ["forward", "--url", url, "--prefix", prefix, "--shards", str(SHARDS), "--poll", "0.2", *extra]
    return procs.delayq(*args, "--log-level", "info", log=log)


def parked(store: DelayStore) -> int:
    return sum(s.parked for s in store.stats())


def why(store: DelayStore, item_id: str) -> str | None:
    item = store.get(item_id)
    assert item is not None, item_id
    return item.parked


def summary(log: Path) -> tuple[int, int]:
    """(newer format, no target) claims in a stopped forwarder's last summary line."""
    found = re.findall(r"newer envelope format (\d+), no target (\d+)", log.read_text(errors="replace"))
    assert found, log.read_text(errors="replace")[-2000:]
    return int(found[-1][0]), int(found[-1][1])


def test_unreleasable_items_are_parked_out_of_the_due_index_and_come_back_for_a_forwarder_that_can(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    plant_newer(store, "newer", PLANTED, store.server_time_ms() - 1000)
    rq_client = redis.Redis.from_url(valkey_url)
    queue = Queue(f"{prefix}-parking", connection=rq_client, delay_store=store)
    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    jobs = [queue.enqueue_at(soon, "builtins.len", "abc").id for _ in range(RQ_JOBS)]
    log = tmp_path / "list-only.log"
    list_only = forward(procs, store, log)  # the list target only: no rq target, format 99 unread
    wait_for(
        lambda: parked(store) == PLANTED + RQ_JOBS, 240, lambda: f"{parked(store)} parked\n{procs.tail()}", interval=0.2
    )
    # out of the due index: every one sits at PARKED_MS, which no claim reaches
    at_parked = sum(client.zcount(store.keys(s).due, PARKED_MS, PARKED_MS) for s in range(SHARDS))
    assert at_parked == PLANTED + RQ_JOBS
    assert {why(store, j) for j in jobs} == {"target:rq"} and why(store, "newer-00000000") == f"format:{NEWER_FORMAT}"
    # a stream of good items flows past them, and no claim reads a parked one again
    out = f"{prefix}:out"
    now = store.server_time_ms() / 1000
    good = {f"good{n}" for n in range(200)}
    store.schedule_many((i, now + int(i[4:]) / 100, RedisListTarget.envelope(out, i.encode())) for i in good)
    wait_for(lambda: client.llen(out) == len(good), 60, lambda: f"{client.llen(out)} good delivered\n{procs.tail()}")
    assert all(not store.claim(s, limit=10_000).items for s in range(SHARDS)), "nothing a claim can read"
    assert procs.stop(list_only) == 0, procs.tail()
    assert summary(log) == (PLANTED, RQ_JOBS), "each unreleasable item claimed exactly once"
    assert {b.decode() for b in client.lrange(out, 0, -1)} == good and store.dead_letters() == []
    # a forwarder with the rq target releases the RQ items at its look (their time brought
    # forward, as if PARK_FOR_MS had passed); the format-99 items stay parked for a newer release
    for job in jobs:
        client.zadd(store.keys(store.shard_of(job)).parked, {job: 0}, xx=True)
    with_rq = forward(procs, store, tmp_path / "with-rq.log", "--rq-redis", valkey_url)
    rq_queue = RQQueue(f"{prefix}-parking", connection=rq_client)
    wait_for(lambda: rq_queue.count == RQ_JOBS, 60, lambda: f"{rq_queue.count} RQ jobs enqueued\n{procs.tail()}")
    assert sorted(rq_queue.job_ids) == sorted(jobs)
    assert parked(store) == PLANTED and store.dead_letters() == []
    assert procs.stop(with_rq) == 0, procs.tail()
    rq_queue.delete(delete_jobs=True)
    rq_client.close()
