"""Other items' lateness beside items no forwarder can release (issue 30, finding 6).

Per run, on its own embedded server: a real ``delayq forward`` (the list target), and 300 good
items due over 6 s, their lateness timed by a consumer that pops them as they arrive (the body
carries the ready time); once with nothing else in the store, once beside N planted items of an
envelope format no release reads (parked by the forwarder before the stream starts). Also the
server's and the forwarder's CPU during the stream. Goal: p99 <= 50 ms beside 100,000.

Usage: python bench/parking.py [--planted 100000] [--runs 3] [--good 300] [--over 6]
Prints one JSON document (median and spread over the runs, load average); imports no test module.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from lib.items import OUT_LIST, envelope, plant_newer
from lib.movers import cpu_seconds
from lib.processes import Processes
from lib.report import distribution, loadavg, log, median_spread
from lib.server import PREFIX, BenchServer
from lib.timing import ms_now
from lib.waiting import wait_for

SHARDS = 16
GOAL_P99_MS = 50.0


def consume(server: BenchServer, expected: int, late: list[float]) -> None:
    """Pop ``expected`` good items as they arrive; record each one's lateness (ms)."""
    client = server.connect()
    while len(late) < expected:
        got = client.blpop([OUT_LIST], timeout=30)
        if got is None:
            return
        arrived = ms_now()
        late.append(arrived - json.loads(got[1])["ready_ms"])
    client.close()


def one(server: BenchServer, planted: int, good: int, over_s: float, logs: Path) -> dict[str, Any]:
    """One measurement: the stream's lateness, and the CPU of both sides while it ran."""
    server.wipe()
    store = server.store(shards=SHARDS)
    if planted:
        plant_newer(store, "newer", planted, store.server_time_ms() - 1000)
    with Processes() as procs:
        args = ["forward", "--url", server.url, "--prefix", PREFIX, "--shards", str(SHARDS), "--log-level", "info"]
        forwarder = procs.delayq(*args, log=logs / f"forwarder-{planted}.log")

        def parked() -> int:
            return sum(s.parked for s in store.stats())

        started = time.monotonic()
        wait_for(lambda: parked() == planted and "started" in (logs / f"forwarder-{planted}.log").read_text(), 300,
                 "the planted items parked", interval=0.2)  # fmt: skip
        parked_s = time.monotonic() - started
        late: list[float] = []
        reader = threading.Thread(target=consume, args=(server, good, late), daemon=True)
        reader.start()
        start_ms = int(ms_now()) + 1000
        rows = [(f"good-{n}", start_ms + int(n * over_s * 1000 / good)) for n in range(good)]
        cpu = (server.cpu_seconds(), cpu_seconds(forwarder.pid))
        store.schedule_many((i, ready / 1000, envelope(i, ready)) for i, ready in rows)
        reader.join(over_s + 60)
        cpu_after = (server.cpu_seconds(), cpu_seconds(forwarder.pid))
        window_s = over_s + 1
    assert len(late) == good, f"{len(late)} of {good} good items arrived"
    redis_cpu = None if cpu[0] is None or cpu_after[0] is None else (cpu_after[0] - cpu[0]) / window_s
    return {
        "lateness_ms": distribution(late),
        "parked_s": round(parked_s, 2),
        "redis_cpu_pct": None if redis_cpu is None else round(100 * redis_cpu, 1),
        "forwarder_cpu_pct": round(100 * (cpu_after[1] - cpu[1]) / window_s, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planted", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--good", type=int, default=300)
    parser.add_argument("--over", type=float, default=6.0, help="seconds the good items are due over")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"planted": args.planted, "good": args.good, "over_s": args.over, "runs": {}}
    with BenchServer() as server, TemporaryDirectory() as tmp:
        out["server"] = server.version()
        for run in range(args.runs):
            for planted in (0, args.planted):  # interleaved: both cases see the same machine
                load = loadavg()
                result = one(server, planted, args.good, args.over, Path(tmp))
                result["load"] = load
                log(f"run {run + 1}, planted {planted}: {result}")
                out["runs"].setdefault(str(planted), []).append(result)
    for planted, results in out["runs"].items():
        out.setdefault("p99_ms", {})[planted] = median_spread([r["lateness_ms"]["p99"] for r in results])
        out.setdefault("redis_cpu_pct", {})[planted] = [r["redis_cpu_pct"] for r in results]
    out["goal"] = {"p99_ms_at_most": GOAL_P99_MS, "met": out["p99_ms"][str(args.planted)]["median"] <= GOAL_P99_MS}
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
