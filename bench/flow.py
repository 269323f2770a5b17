#!/usr/bin/env python
"""Flow-control benchmark: achieved forwarding rate vs the cap, and the cost of flow control.

Run ``python bench/flow.py`` (full, about 2 min) or ``python bench/flow.py --quick`` (smoke
test). JSON goes to stdout, progress to stderr, and a dated section is appended to
``bench/RESULTS.md`` (``--no-results`` skips that). Everything runs against a Valkey this
script starts itself, so the only data it wipes is its own.

1. *Rate accuracy*: a due backlog worth ``seconds`` at the cap, two real ``delayq forward
   --rate`` processes sharing the cap; achieved rate = items after the first burst / time from
   the first to the last delivery (polled every 5 ms), median of ``reps`` runs per cap.
2. *Overhead*: one in-process forwarder drains a due backlog with flow control off, with a
   depth ceiling it never reaches (a depth probe every 0.5 s), and with that ceiling plus a rate
   cap it never reaches (also one token script call per batch). After one warm-up drain the
   three run round robin, and each overhead is the median of the paired ratios (on / off of the
   same round), robust to a shared machine's drift.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from typing import Any

import redis
from lib.processes import Processes
from lib.report import RESULTS_PATH, loadavg, log, write_results

from delayq_backends import Config, DelayStore
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.flow import FlowControl, burst_of
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget

OUT = "bench:flow:out"
SHARDS = 16


def schedule_due(store: DelayStore, n: int, ready_ms: int, tag: str) -> None:
    envelope = RedisListTarget.envelope(OUT, b"x" * 200)
    store.schedule_many((f"{tag}-{i}", ready_ms / 1000, envelope) for i in range(n))


def rate_run(server: EmbeddedServer, client: redis.Redis, cap: int, seconds: float, run: int) -> float:
    """One run of two forwarder processes at ``--rate OUT=cap/s``; returns the achieved rate."""
    client.execute_command("FLUSHALL", "SYNC")
    prefix = f"flow{run}"
    store = DelayStore(client, Config(prefix=prefix, shards=SHARDS))
    n = int(cap * seconds)
    schedule_due(store, n, store.server_time_ms() + 1500, f"r{run}")  # time for both to start
    args = ["forward", "--url", server.url, "--prefix", prefix]
    args += ["--shards", str(SHARDS), "--log-level", "warning", "--rate", f"{OUT}={cap}/s"]
    with Processes() as procs:
        for _ in range(2):
            procs.delayq(*args)
        while client.llen(OUT) == 0:
            time.sleep(0.005)
        first = time.monotonic()
        while client.llen(OUT) < n:
            time.sleep(0.005)
        took = time.monotonic() - first
    return (n - burst_of(cap)) / took


def drain_run(client: redis.Redis, n: int, flow: FlowControl, run: int) -> float:
    """Items per second one in-process forwarder moves from a due backlog of ``n``."""
    client.execute_command("FLUSHALL", "SYNC")
    store = DelayStore(client, Config(prefix=f"drain{run}", shards=SHARDS))
    schedule_due(store, n, store.server_time_ms() - 1000, f"d{run}")
    forwarder = Forwarder(store, [RedisListTarget(client)], batch=200, flow=flow)
    started = time.perf_counter()
    while forwarder.run_once():
        pass
    took = time.perf_counter() - started
    assert client.llen(OUT) == n and forwarder.stats.deferred == 0
    return n / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: small sizes, one repetition")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    opts = parser.parse_args()
    caps, seconds, reps = ([200, 500, 2000], 1.5, 1) if opts.quick else ([200, 500, 2000], 4.0, 3)
    drain_items, drain_reps = (5_000, 2) if opts.quick else (30_000, 7)
    started = time.monotonic()
    result: dict[str, Any] = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        accuracy = {}
        for cap in caps:
            runs = [rate_run(server, client, cap, seconds, r) for r in range(reps)]
            accuracy[cap] = {"runs": [round(r, 1) for r in runs], "median": round(statistics.median(runs), 1)}
            log(f"cap {cap}/s: achieved {accuracy[cap]}")
        depth_only = FlowControl(max_depth={OUT: 10**9})
        unhit = FlowControl(max_depth={OUT: 10**9}, rates={OUT: 1e9})
        drain_run(client, drain_items, FlowControl(), -1)  # warm-up: first connections, script loads
        off, depth, on = [], [], []
        for r in range(drain_reps):  # round robin, so drift on a shared machine hits all alike
            off.append(drain_run(client, drain_items, FlowControl(), 3 * r))
            depth.append(drain_run(client, drain_items, depth_only, 3 * r + 1))
            on.append(drain_run(client, drain_items, unhit, 3 * r + 2))
            log(f"drain {drain_items}: off {off[-1]:.0f}/s, depth cap {depth[-1]:.0f}/s, both caps {on[-1]:.0f}/s")
        client.close()
    result.update(
        mode="quick" if opts.quick else "full",
        seconds_of_backlog=seconds,
        rate_accuracy=accuracy,
        drain_items=drain_items,
        throughput_off=[round(x) for x in off],
        throughput_depth=[round(x) for x in depth],
        throughput_on=[round(x) for x in on],
        depth_ratio=round(statistics.median(b / a for a, b in zip(off, depth)), 3),
        overhead_ratio=round(statistics.median(b / a for a, b in zip(off, on)), 3),
        took_s=round(time.monotonic() - started, 1),
        code=subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip(),
        python=platform.python_version(),
        loadavg_end=loadavg(),
    )
    print(json.dumps(result, indent=2))
    if not opts.no_results:
        write_results(RESULTS_PATH, section(result))


def section(r: dict[str, Any]) -> str:
    rows = [
        f"| achieved rate at cap {cap}/s (2 forwarders) | {a['median']:,}/s | {a['median'] / cap:.3f} | {a['runs']} |"
        for cap, a in r["rate_accuracy"].items()
    ]
    off, on = statistics.median(r["throughput_off"]), statistics.median(r["throughput_on"])
    depth = statistics.median(r["throughput_depth"])
    rows.append(
        f"| drain of {r['drain_items']:,} due items, off → depth ceiling not hit (median of pairs) | "
        f"{off:,.0f} → {depth:,.0f} items/s | {r['depth_ratio']} | depth {r['throughput_depth']} |"
    )
    rows.append(
        f"| drain of {r['drain_items']:,} due items, off → depth ceiling + rate cap not hit (median of pairs) | "
        f"{off:,.0f} → {on:,.0f} items/s | {r['overhead_ratio']} | off {r['throughput_off']}, on {r['throughput_on']} |"
    )
    return (
        f"## Flow control, {r['when']} ({r['mode']}, code {r['code']}, {r['took_s']} s, load average at end "
        f"{r['loadavg_end']}, `bench/flow.py`)\n\n"
        "| figure | median | ratio | runs |\n|---|---:|---:|---|\n" + "\n".join(rows) + "\n\n"
        f"- rate runs: a due backlog of {r['seconds_of_backlog']} s at the cap; achieved = items after the first "
        "burst (0.1 s worth) / first-to-last delivery, polled every 5 ms\n"
        "- overhead: one in-process forwarder, batch 200, 16 shards, list target; the same backlog with "
        "`FlowControl()`, with a depth ceiling never reached, and with it plus a rate cap never reached "
        "(one token-script round trip per batch)\n"
    )


if __name__ == "__main__":
    main()
