"""A forwarder stalled past its lease (SIGSTOP) and resumed publishes nothing twice.

Real `delayq forward` processes. Forwarder A claims a batch and is held before it publishes:
its list target's server is SIGSTOPped, so A's back-pressure probe of the list (LLEN, made
before every publish with ``--max-queue-depth``) hangs. Then A itself is SIGSTOPped, the
target resumed, and forwarder B takes the batch over once A's lease runs out and delivers it.
When A is resumed, its probe answers and it would publish: it must find that its items were
taken over and publish none of them.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import redis

from delayq_backends.embedded import EmbeddedServer
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, Proc, make_store
from tests.helpers import wait_for

ITEMS = 20


def forwarder(procs: Launcher, url: str, prefix: str, list_url: str, log: Path) -> Proc:
    args = ["forward", "--url", url, "--prefix", prefix]
    args += ["--shards", "1", "--lease", "2", "--poll", "0.1", "--list-redis", list_url]
    args += ["--max-queue-depth", "out=1000000", "--log-level", "warning"]
    return procs.delayq(*args, log=log)


def test_a_forwarder_stopped_past_its_lease_publishes_nothing_twice(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    store = make_store(valkey_url, prefix, shards=1, lease_seconds=2)
    with EmbeddedServer() as target:
        out = redis.Redis.from_url(target.url)
        assert target.process is not None
        a_log = tmp_path / "a.log"
        a = forwarder(procs, valkey_url, prefix, target.url, a_log)
        wait_for(lambda: store.client.pubsub_numsub(store.wake_channel)[0][1] >= 1, 20, "forwarder A started")
        os.kill(target.process.pid, signal.SIGSTOP)  # A will hang in its probe, before publishing
        try:
            ids = [f"job-{n}" for n in range(ITEMS)]
            envelopes = [RedisListTarget.envelope("out", json.dumps({"id": i}).encode()) for i in ids]
            store.schedule_many([(i, 0, e) for i, e in zip(ids, envelopes)])
            leased = store.keys(0).leased
            wait_for(lambda: store.client.hlen(leased) == ITEMS, 10, "A claimed the batch")
            os.kill(a.pid, signal.SIGSTOP)
        finally:
            os.kill(target.process.pid, signal.SIGCONT)
        b = forwarder(procs, valkey_url, prefix, target.url, tmp_path / "b.log")
        wait_for(lambda: out.llen("out") >= ITEMS, 20, "B delivered the batch after A's lease ran out")
        wait_for(lambda: sum(s.scheduled for s in store.stats()) == 0, 10, "B acked the batch")
        os.kill(a.pid, signal.SIGCONT)
        wait_for(
            lambda: "taken over" in a_log.read_text() or out.llen("out") > ITEMS,
            15,
            lambda: f"A resumed and handled its stale batch (A's log: {a_log.read_text()[-500:]!r})",
        )
        delivered = [json.loads(b)["id"] for b in out.lrange("out", 0, -1)]
        assert sorted(delivered) == sorted(ids), f"{len(delivered) - ITEMS} duplicates from the resumed forwarder"
        assert a.poll() is None and b.poll() is None, "a forwarder died"
        assert store.dead_letters() == []
        out.close()
