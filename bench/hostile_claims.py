"""Claims next to 100k deferred ranked items, and the longest Redis stall of a dead-letter requeue.

Runs on its own embedded server (never a shared one) and prints:

1. claim(200) of due rank-5 items on a shard that also holds 100k deferred rank-5 items (given back
   by defer.lua, as a rate cap or a full queue does), against the same shard without them, in the
   same run and interleaved, so both see the same machine; plus how booking that backlog scales
   (time per claim+defer of 200 while the deferred count grows: flat means linear in total);
2. requeue_dead() of 200k dead letters of one shard: the longest single script call, in one call
   per shard (what the store did before) against the chunked calls (DEAD_CHUNK).

Usage: python bench/hostile_claims.py [--deferred 100000] [--dead 200000] [--claims 40]
Imports no test module.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis

import delayq_backends.store.reader as store_module
from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.targets import RedisListTarget

BODY = RedisListTarget.envelope("out", b"x" * 100)
RANK = 5


def make(url: str, prefix: str) -> DelayStore:
    # no socket timeout: the one-call requeue of "before" holds the server for seconds
    return DelayStore(connect(url, socket_timeout=600), Config(url=url, prefix=prefix, shards=1, lease_seconds=600))


def spread(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=10)
    return f"p50 {statistics.median(samples):7.2f} ms  (p10 {q[0]:.2f}, p90 {q[-1]:.2f}, n={len(samples)})"


def book_deferred(store: DelayStore, count: int) -> list[float]:
    """Schedule ``count`` due rank-5 items and give them all back an hour ahead, 200 per claim,
    as the forwarder's flow control does; returns each claim+defer's duration in ms."""
    now = store.server_time_ms()
    rows = [(f"d{n}", (now - 1000) / 1000, BODY, RANK) for n in range(count)]
    for i in range(0, count, 20_000):
        store.schedule_many(rows[i : i + 20_000])
    took = []
    while True:
        start = time.perf_counter()
        claim = store.claim(0, limit=200)
        if not claim.items:
            break
        store.defer(claim, [(item.id, now + 3_600_000) for item in claim.items])
        took.append((time.perf_counter() - start) * 1000)
    return took


def timed_claims(stores: list[DelayStore], claims: int) -> list[list[float]]:
    """``claims`` claim(200)s of each store, interleaved; each claim is acked outside the timing."""
    now = stores[0].server_time_ms()
    for store in stores:
        store.schedule_many([(f"r{n}", (now - 1000) / 1000, BODY, RANK) for n in range(claims * 200)])
    out: list[list[float]] = [[] for _ in stores]
    for _ in range(claims):
        for k, store in enumerate(stores):
            start = time.perf_counter()
            claim = store.claim(0, limit=200)
            out[k].append((time.perf_counter() - start) * 1000)
            assert len(claim.items) == 200, len(claim.items)
            store.ack(claim)
    return out


def bury(store: DelayStore, count: int) -> None:
    """``count`` dead letters on shard 0, written directly (as burying them would leave them)."""
    k, now = store.keys(0), store.server_time_ms()
    store.check_meta()
    data = store.check_payload("x", BODY)
    for i in range(0, count, 5000):
        with store.client.pipeline(transaction=False) as pipe:
            for n in range(i, min(count, i + 5000)):
                pipe.zadd(k.dead, {f"x{n}": now + n})
                pipe.hset(k.dead_items, f"x{n}", data)
                pipe.hset(k.dead_info, f"x{n}", '{"error":"bench","attempts":10,"ready_ms":1,"rank":0}')
            pipe.execute()


def longest_call(store: DelayStore, action: Callable[[], Any], admin: redis.Redis) -> tuple[float, float, int, float]:
    """(longest script call in ms by SLOWLOG, longest round trip of a script call in ms, script
    calls, wall ms) of ``action``. SLOWLOG keeps the 128 longest-logged calls over 1 ms."""
    admin.config_set("slowlog-log-slower-than", 1000)
    admin.config_set("slowlog-max-len", 128)
    admin.slowlog_reset()
    trips: list[float] = []
    real = store._write

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args)
        finally:
            trips.append((time.perf_counter() - start) * 1000)

    store._write = timed  # type: ignore[method-assign,assignment]
    start = time.perf_counter()
    action()
    wall = (time.perf_counter() - start) * 1000
    entries = [e for e in admin.slowlog_get(128) if e["command"].split()[0].upper() in (b"EVALSHA", b"EVAL")]
    admin.config_set("slowlog-log-slower-than", 10_000)
    return max(e["duration"] for e in entries) / 1000, max(trips), len(trips), wall


def claims(url: str, opts: argparse.Namespace) -> None:
    print(f"\n1. claim(200) of due rank-{RANK} items, with {opts.deferred} deferred rank-{RANK} items vs none")
    with_deferred, plain = make(url, "withdeferred"), make(url, "plain")
    booking = book_deferred(with_deferred, opts.deferred)
    tenth = max(1, len(booking) // 10)
    print(
        f"   booking {opts.deferred} deferred: {sum(booking) / 1000:.1f} s in {len(booking)} claim+defer calls; "
        f"first tenth {statistics.median(booking[:tenth]):.2f} ms, last tenth "
        f"{statistics.median(booking[-tenth:]):.2f} ms each"
    )
    deferred_ms, plain_ms = timed_claims([with_deferred, plain], opts.claims)
    print(f"   none:     {spread(plain_ms)}")
    print(f"   deferred: {spread(deferred_ms)}")
    print(f"   ratio of medians: {statistics.median(deferred_ms) / statistics.median(plain_ms):.2f}")


def dead_letters(url: str, opts: argparse.Namespace, admin: redis.Redis) -> None:
    print(f"\n2. requeue_dead() of {opts.dead} dead letters on one shard: longest single script call")
    for label, chunk in (("one call per shard (before)", 10**12), (f"chunks of {store_module.DEAD_CHUNK}", None)):
        store = make(url, f"dead{chunk or 0}")
        bury(store, opts.dead)
        saved = store_module.DEAD_CHUNK
        store_module.DEAD_CHUNK = chunk or saved
        try:
            longest, trip, calls, wall = longest_call(store, store.requeue_dead, admin)
        finally:
            store_module.DEAD_CHUNK = saved
        scheduled = sum(s.scheduled for s in store.stats())
        print(
            f"   {label:28s} longest call {longest:7.1f} ms in the server (SLOWLOG), {trip:7.1f} ms round trip; "
            f"{calls} calls, {wall / 1000:.2f} s in all, {scheduled} requeued"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deferred", type=int, default=100_000)
    parser.add_argument("--dead", type=int, default=200_000)
    parser.add_argument("--claims", type=int, default=40)
    parser.add_argument("--only-dead", action="store_true", help="skip part 1")
    opts = parser.parse_args()
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url)
        print(f"server {admin.info('server').get('redis_version')}, load average before: {os.getloadavg()}")
        if not opts.only_dead:
            claims(server.url, opts)
        dead_letters(server.url, opts, admin)
        print(f"\nload average after: {os.getloadavg()}")
        admin.close()


if __name__ == "__main__":
    main()
