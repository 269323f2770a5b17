#!/usr/bin/env python
"""What Prometheus metrics cost a forwarder: throughput with metrics off vs on, and one scrape.

Run ``python bench/metrics.py`` (full, ~3 min) or ``python bench/metrics.py --quick`` (< 1 min).
JSON goes to stdout, progress to stderr, and a dated section is appended to
``bench/RESULTS.md`` (``--no-results`` skips that). Like ``bench/core.py`` it starts its own
Valkey, runs the compared cases round-robin and reports medians, so the off/on ratio holds on a
noisy shared machine even when the absolute rates drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lib.items import envelope
from lib.report import RESULTS_PATH, Figure, code_digest, distribution, fmt_dist, log, write_results
from lib.server import PREFIX, BenchServer
from lib.timing import Case, measure_cases, ms_now
from prometheus_client import generate_latest

from delayq_backends.forwarder import Forwarder
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.targets import RedisListTarget

#: Items go to this many lists, so the counters carry as many label sets as a small deployment.
QUEUES = 10
SCRAPES = 200


def forward_case(server: BenchServer, items: int, *, metrics: bool) -> Case:
    """One forwarder's ``run_once()`` draining ``items`` due items into ``QUEUES`` lists."""

    def prepare() -> Callable[[], int]:
        server.wipe()
        client = server.connect()
        store = server.store(client=client)
        due = int(ms_now()) - 1000
        data = [envelope(f"q{q}", 0, f"bench:out:{q}").encode() for q in range(QUEUES)]
        for start in range(0, items, 50_000):
            rows = range(start, min(items, start + 50_000))
            store.schedule_many([(f"m-{i:08d}", (due - i % 1000) / 1000, data[i % QUEUES]) for i in rows])
        forwarder = Forwarder(store, [RedisListTarget(client)], metrics=ForwarderMetrics() if metrics else None)

        def work() -> int:
            claimed = forwarder.run_once()
            if claimed != items:
                raise RuntimeError(f"forwarded {claimed} of {items}")
            return claimed

        return work

    state = "on" if metrics else "off"
    return Case(f"forward_metrics_{state}", f"forward, batch 200, {QUEUES} queues, metrics {state}", prepare)


def scrape_ms(server: BenchServer, shards: int) -> dict[str, float]:
    """Milliseconds to render a forwarder's whole registry, store gauges included (what one
    Prometheus scrape costs the forwarder process), after a forwarding run filled the counters."""
    server.wipe()
    client = server.connect()
    store = server.store(shards=shards, client=client)
    metrics = ForwarderMetrics(store=store)
    forwarder = Forwarder(store, [RedisListTarget(client)], metrics=metrics)
    now = int(ms_now())
    store.schedule_many(
        [(f"s-{i}", (now - 1000) / 1000, envelope(f"s{i}", 0, f"bench:out:{i % QUEUES}")) for i in range(5000)]
    )
    store.schedule_many([(f"f-{i}", (now + 3_600_000) / 1000, envelope(f"f{i}", 0)) for i in range(5000)])
    forwarder.run_once()
    samples = []
    for _ in range(SCRAPES):
        t0 = time.perf_counter()
        generate_latest(metrics.registry)
        samples.append((time.perf_counter() - t0) * 1000)
    return distribution(samples)


def run_all(quick: bool) -> dict[str, Any]:
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    items, reps = (30_000, 3) if quick else (200_000, 5)
    with BenchServer() as server:
        log(f"forwarding {items} items, metrics off vs on, {reps} rounds ...")
        off, on = measure_cases(server, reps, [forward_case(server, items, metrics=m) for m in (False, True)])
        log("scrape cost ...")
        scrape = scrape_ms(server, 16)
        server.wipe()
    figures: list[Figure] = [off, on]
    for fig in figures:
        log(f"  {fig.label}: {fig.value:,.0f} items/s (runs {fig.detail['runs']})")
    ratio = on.value / off.value
    paired = [b / a for a, b in zip(off.detail["runs"], on.detail["runs"])]
    log(f"  on/off: {ratio:.3f} (per round {[round(x, 3) for x in paired]}); scrape {fmt_dist(scrape)}")
    return {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": round(time.monotonic() - t0, 1),
        "items": items,
        "reps": reps,
        "code_digest": code_digest(),
        "off": asdict(off),
        "on": asdict(on),
        "ratio_on_off": round(ratio, 3),
        "ratio_per_round": [round(x, 3) for x in paired],
        "ratio_per_round_median": round(statistics.median(paired), 3),
        # the forwarder's own CPU per item: what metrics add, whatever else loads the machine
        "client_cpu_us_per_item_added": round(
            on.detail["client_cpu_us_per_item"] - off.detail["client_cpu_us_per_item"], 2
        ),
        "scrape_ms_16_shards": scrape,
    }


def markdown_section(r: dict[str, Any], quick: bool) -> str:
    off, on = r["off"], r["on"]
    return (
        f"## Metrics overhead, {r['started']} ({'quick' if quick else 'full'}, code {r['code_digest']})\n\n"
        "| case | items/s (median) | runs | client CPU µs/item |\n|---|---:|---|---:|\n"
        + "".join(
            f"| {f['label']} | {f['value']:,.0f} | {f['runs']} | {f['detail']['client_cpu_us_per_item']} |\n"
            for f in ({**off, "runs": off["detail"]["runs"]}, {**on, "runs": on["detail"]["runs"]})
        )
        + f"\n- on/off throughput: **{r['ratio_on_off']}** (medians); per round {r['ratio_per_round']}, "
        f"median {r['ratio_per_round_median']}\n"
        f"- forwarder CPU added by metrics: {r['client_cpu_us_per_item_added']} µs/item (medians of client CPU "
        "per item; steadier than throughput on a shared machine)\n"
        f"- one scrape of a forwarder's registry with 16 shards' gauges (includes the store round trip): "
        f"{fmt_dist(r['scrape_ms_16_shards'])}\n"
        f"- {r['items']} due items per run into {QUEUES} lists, one forwarder `run_once()`, {r['reps']} rounds "
        f"round-robin; prefix `{PREFIX}` on a Valkey started by the run.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 min (smoke test)")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="markdown file to append to")
    parser.add_argument("--no-results", action="store_true", help="print JSON only, do not touch RESULTS.md")
    args = parser.parse_args(argv)
    report = run_all(args.quick)
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    if not args.no_results:
        write_results(args.results, markdown_section(report, args.quick))
        log(f"appended a section to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
