#!/usr/bin/env python
"""What the operators' views of many groups cost: one page of ``GET /api/v1/groups`` (the
dashboard asks every 2 s; ``delayq groups list`` is the same read), one exporter scrape of the
group gauges, and the SCAN that lists the groups, against the slot keys' page over the same keys.

Run ``python bench/group_views.py`` (1,000, 10,000 and 50,000 groups, ~3 min) or ``--quick``
(1,000 and 10,000, < 1 min). JSON goes to stdout, progress to stderr, and a dated section is
appended to ``bench/RESULTS.md`` (``--no-results`` skips that). It starts its own Valkey; each
figure is the median of 5 reads, and the views compared run round-robin, so their ratio holds on
a noisy shared machine even when the absolute times drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from lib.report import RESULTS_PATH, code_digest, loadavg, log, write_results
from lib.server import BenchServer
from prometheus_client import CollectorRegistry, generate_latest

from delayq_backends.metrics import GroupCollector
from delayq_backends.store import DelayStore, SlotAsk
from delayq_backends.store.groupboard import group_board

#: Reads per figure (the median is reported).
REPEATS = 5
#: One group in this many has a policy set at runtime (a rate and a weight).
WITH_POLICY = 10


def fill(store: DelayStore, groups: int) -> None:
    """``groups`` groups, each with 2 items running and 1 waiting, one in :data:`WITH_POLICY` with a policy."""
    for start in range(0, groups, 500):
        chunk = range(start, min(groups, start + 500))
        asks = {f"tenant-{i}": SlotAsk(2, [("a", 0), ("b", 1), ("c", 2)]) for i in chunk}
        store.take_slots(asks, hold_ms=3_600_000, wait_ms=3_600_000)
    for i in range(0, groups, WITH_POLICY):
        store.set_group(f"tenant-{i}", rate="10/s", weight=2)


def timed(read: Callable[[], object]) -> float:
    started = time.perf_counter()
    read()
    return (time.perf_counter() - started) * 1000


def measure(server: BenchServer, groups: int) -> dict[str, Any]:
    server.wipe()
    store = server.store()
    fill(store, groups)
    keys = store.groups_in_use()
    assert len(keys) == groups, (len(keys), groups)
    registry = CollectorRegistry()
    registry.register(GroupCollector(store))
    views: dict[str, Callable[[], object]] = {
        "scan_ms": store.groups_in_use,
        "groups_page_ms": lambda: group_board(store, keys, limit=50),
        "slots_page_ms": lambda: store.slot_board(keys, limit=50),
        "scrape_ms": lambda: generate_latest(registry),
    }
    times: dict[str, list[float]] = {name: [] for name in views}
    for _ in range(REPEATS):
        for name, read in views.items():
            times[name].append(timed(read))
    figures = {name: round(statistics.median(ms), 1) for name, ms in times.items()}
    log(f"{groups:>7,} groups: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    return {"groups": groups, **figures, "per_group_us": round(figures["groups_page_ms"] * 1000 / groups, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 groups only")
    parser.add_argument("--no-results", action="store_true", help="print JSON only, append nothing")
    args = parser.parse_args()
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 50_000)
    digest = code_digest()
    with BenchServer() as server:
        rows = [measure(server, n) for n in sizes]
    out = {"bench": "group_views", "code": digest, "quick": args.quick, "rows": rows}
    json.dump(out, sys.stdout, indent=2)
    print()
    if args.no_results:
        return
    lines = [
        f"## group_views {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
        f"(code {digest}{', quick' if args.quick else ''}, load {loadavg()[0]:.1f})",
        "",
        "Command: `python bench/group_views.py" + (" --quick`" if args.quick else "`") + "; medians of 5 reads.",
        "",
        "| groups | SCAN (list) | /groups page | /slots page | exporter scrape | per group |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['groups']:,} | {r['scan_ms']} ms | {r['groups_page_ms']} ms | {r['slots_page_ms']} ms "
            f"| {r['scrape_ms']} ms | {r['per_group_us']} µs |"
            for r in rows
        ),
        "",
    ]
    write_results(RESULTS_PATH, "\n".join(lines))


if __name__ == "__main__":
    main()
