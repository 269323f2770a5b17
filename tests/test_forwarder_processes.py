"""Real `delayq forward` processes: many side by side, killed with SIGKILL, stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.connection import connect
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, make_store
from tests.harness.fleet import Forwarders
from tests.helpers import wait_for


def schedule_spread(store: DelayStore, key: str, n: int, start_s: float, spread_s: float) -> list[str]:
    now = store.server_time_ms()
    ids = [f"job-{i}" for i in range(n)]
    store.schedule_many(
        (
            i,
            (now + int((start_s + spread_s * k / n) * 1000)) / 1000,
            RedisListTarget.envelope(key, json.dumps({"id": i}).encode()),
        )
        for k, i in enumerate(ids)
    )
    return ids


def delivered(client: redis.Redis, key: str) -> Counter[str]:
    return Counter(json.loads(b)["id"] for b in client.lrange(key, 0, -1))


def remaining(store: DelayStore) -> int:
    return sum(s.scheduled for s in store.stats())


def test_four_forwarders_deliver_every_item_exactly_once(server_url: str, prefix: str, procs: Launcher) -> None:
    store = make_store(server_url, prefix, shards=16)
    key = f"{{{prefix}}}:out"
    ids = schedule_spread(store, key, 20_000, start_s=1.0, spread_s=3.0)
    fleet = Forwarders(procs, server_url, prefix, 16, "--batch", "200")
    for _ in range(4):
        fleet.start()
    client = connect(server_url)
    wait_for(lambda: client.llen(key) >= 20_000 and remaining(store) == 0, 90, "20,000 items forwarded")
    counts = delivered(client, key)
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1, f"duplicates without any crash: {[i for i, c in counts.items() if c > 1][:5]}"
    assert store.dead_letters() == []
    assert all(p.poll() is None for p in fleet.procs), "a forwarder died"


@pytest.mark.parametrize("server", ["valkey", pytest.param("cluster", marks=pytest.mark.cluster)])
def test_kill_9_at_random_points_loses_nothing(
    server: str, request: pytest.FixtureRequest, prefix: str, procs: Launcher, record_property
) -> None:  # type: ignore[no-untyped-def]
    url = request.getfixturevalue("valkey_url") if server == "valkey" else request.getfixturevalue("redis_cluster").url
    store = make_store(url, prefix, shards=16, max_attempts=1000)
    key = f"{{{prefix}}}:out"
    ids = schedule_spread(store, key, 20_000, start_s=0.5, spread_s=12.0)
    fleet = Forwarders(procs, url, prefix, 16, "--batch", "100", "--lease", "1", "--max-attempts", "1000")
    fleet.start()
    fleet.start()
    rng = random.Random(os.getpid())
    kills = 0
    while kills < 25:
        time.sleep(rng.uniform(0.25, 0.6))  # past start-up (~0.3 s), at a random point in the work
        fleet.kill_one(rng)
        kills += 1
        fleet.start()
    client = connect(url)
    wait_for(
        lambda: remaining(store) == 0 and len(delivered(client, key)) == len(ids),
        120,
        "every item delivered after the kills",
    )
    counts = delivered(client, key)
    duplicates = sum(counts.values()) - len(counts)
    record_property("kills", kills)
    record_property("duplicates", duplicates)
    print(f"\n{server}: {kills} kills, {len(ids)} items, {duplicates} duplicates")
    assert set(counts) == set(ids)
    assert store.dead_letters() == []
    assert duplicates <= kills * 100, "more duplicates than kills x batch: re-delivery is not bounded by the lease"


def test_sigterm_finishes_the_batch_and_exits_0(valkey_url: str, prefix: str, procs: Launcher) -> None:
    store = make_store(valkey_url, prefix, shards=16)
    key = f"{prefix}:out"
    ids = schedule_spread(store, key, 30_000, start_s=0, spread_s=0)
    fleet = Forwarders(procs, valkey_url, prefix, 16, "--batch", "500")
    proc = fleet.start()
    client = redis.Redis.from_url(valkey_url)
    wait_for(lambda: client.llen(key) >= 1000, 30, "forwarding to start")
    assert procs.stop(proc) == 0, Launcher.output(proc)
    counts = delivered(client, key)
    assert max(counts.values()) == 1
    assert sum(s.leased for s in store.stats()) == 0, "a lease was left behind"
    assert len(counts) + remaining(store) == len(ids), "an item was lost"
    assert remaining(store) > 0, "SIGTERM came too late to test draining"


def test_oversized_envelopes_are_dead_lettered_at_claim_unread(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    """5 envelopes of 30 MB written past the producer's check: a real forwarder buries each with
    its size (the claim never returns them, so its RSS stays bounded) and the good items flow."""
    store = make_store(valkey_url, prefix, shards=4)
    key = f"{{{prefix}}}:out"
    ids = schedule_spread(store, key, 200, start_s=0.5, spread_s=1.0)
    past = store.server_time_ms() - 1000
    for n in range(5):
        big = f"big-{n}"
        keys = store._keys[store.shard_of(big)]
        store.client.hset(keys.items, big, RedisListTarget.envelope(key, b"x" * 30 * 1024 * 1024).encode())
        store.client.zadd(keys.due, {big: past})
    fleet = Forwarders(procs, valkey_url, prefix, 4, "--batch", "200")
    proc = fleet.start(log=tmp_path / "forwarder.log")
    client = connect(valkey_url)
    wait_for(lambda: client.llen(key) >= 200 and len(store.dead_letters()) == 5, 60, "200 delivered, 5 buried")
    assert set(delivered(client, key)) == set(ids)
    for dead in store.dead_letters():
        assert dead.id.startswith("big-") and "over max_payload_bytes=1048576" in dead.error, dead.error
    status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
    peak_kb = int(next(line for line in status if line.startswith("VmHWM")).split()[1])
    assert peak_kb < 200 * 1024, f"the forwarder's peak RSS was {peak_kb // 1024} MiB"
    print(f"forwarder peak RSS with 5 x 30 MB planted envelopes: {peak_kb // 1024} MiB")
