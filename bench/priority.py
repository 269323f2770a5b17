#!/usr/bin/env python
"""Priority benchmark: what ranked items cost the claim and the schedule in a large due backlog.

Run ``python bench/priority.py`` (about 2 min) or ``python bench/priority.py --quick`` (smoke
test). JSON goes to stdout, progress to stderr, and a dated section is appended to
``bench/RESULTS.md`` (``--no-results`` skips that). Everything runs against one Valkey this script
starts (``BenchServer`` from ``bench/core.py``), one shard per backlog, so a claim sees the
whole backlog:

- **no ranks**: N due items, all rank 0 (the baseline: the claim's one index lookup finds no key);
- **1% ranked**: the same with 1% of the items at ranks 1-3, so each claim takes ranked ones first;
- **1% ranked, all leased**: those ranked items are held by a forwarder (claimed, not acked), so
  every claim steps over them (the bound's stale term at its largest: all in flight);
- **1% ranked, future**: the ranked items lie an hour ahead: one lookup per rank, nothing due.

Each sample times ``claim(200)``, then releases the batch (untimed) so the backlog stays as it
was; samples alternate between the backlogs so machine noise hits them alike. Scheduling is timed
too: the schedule script's calls for rank-0 items against ranked ones, rounds alternating.
Medians of repeats.

``--before REV`` adds the rank-0 cases run with the claim and schedule scripts of git revision
REV (one from before ranks existed), on a backlog of their own in the same run: what ranks cost
the items that have none.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent

from lib.items import envelope  # noqa: E402
from lib.report import RESULTS_PATH, code_digest, distribution, log, write_results  # noqa: E402
from lib.server import BenchServer  # noqa: E402

from delayq_backends import Config, DelayStore  # noqa: E402
from delayq_backends.scripts import _INCLUDE  # noqa: E402
from delayq_backends.scripts.store import Schedule, ScheduleItem  # noqa: E402

LIMIT = 200


@dataclass(frozen=True)
class Sizes:
    name: str
    backlog: int  # due items per backlog (one shard)
    ranked_share: float
    samples: int  # timed claims per backlog
    schedule_items: int  # items per schedule round
    schedule_rounds: int


FULL = Sizes("full", 100_000, 0.01, 300, 20_000, 7)
QUICK = Sizes("quick", 10_000, 0.01, 40, 5_000, 3)


def backlog(server: BenchServer, name: str, sizes: Sizes, *, ranked: bool, ranked_ready_ms: int) -> DelayStore:
    """One shard holding ``sizes.backlog`` due items, 1% of them ranked (when ``ranked``)."""
    store = DelayStore(server.connect(), Config(prefix=f"bench-prio-{name}", shards=1))
    data = envelope(name, 0).encode()
    now = int(time.time() * 1000)
    every = round(1 / sizes.ranked_share)
    rows: list[Any] = []
    for i in range(sizes.backlog):
        if ranked and i % every == 0:
            rows.append((f"{name}-{i:08d}", ranked_ready_ms / 1000, data, 1 + i % 3))
        else:
            rows.append((f"{name}-{i:08d}", (now - 600_000 + i) / 1000, data))
    for start in range(0, len(rows), 50_000):
        store.schedule_many(rows[start : start + 50_000])
    return store


def scripts_at(rev: str, name: str) -> str:
    """The source of script ``name`` at git revision ``rev``, its includes expanded."""

    def show(path: str) -> str:
        where = f"{rev}:delayq_backends/scripts/{path}"
        return subprocess.run(["git", "show", where], cwd=BENCH_DIR, capture_output=True, text=True, check=True).stdout

    return _INCLUDE.sub(lambda m: show(f"includes/{m.group(1)}.lua"), show(f"{name}.lua"))


def with_scripts_of(store: DelayStore, rev: str) -> DelayStore:
    """``store`` running the claim and schedule scripts of ``rev`` (rank-0 items only)."""
    register = store.client.register_script
    old = {name: register(scripts_at(rev, name)) for name in ("claim", "schedule")}
    store.scripts = type(store.scripts)(**{**vars(store.scripts), **old})
    return store


def claim_samples(stores: dict[str, DelayStore], samples: int) -> dict[str, list[float]]:
    """Time claim(LIMIT) on each store in turn; release each batch untimed."""
    timings: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(samples):
        for name, store in stores.items():
            t0 = time.perf_counter()
            claim = store.claim(0, limit=LIMIT, lease_ms=600_000)
            timings[name].append((time.perf_counter() - t0) * 1000)
            if len(claim.items) != LIMIT:
                raise RuntimeError(f"{name}: claimed {len(claim.items)}, expected {LIMIT}")
            store.release(claim)
    return timings


def hold_ranked(store: DelayStore, sizes: Sizes) -> None:
    """Claim the ranked items and keep them (a forwarder's batches in flight, never acked)."""
    ranked = round(sizes.backlog * sizes.ranked_share)
    held = store.claim(0, limit=ranked, lease_ms=3_600_000)
    if len(held.items) != ranked or not all(
        int(i.id.rsplit("-", 1)[1]) % round(1 / sizes.ranked_share) == 0 for i in held.items
    ):
        raise RuntimeError("the first claim should have taken exactly the ranked items")


def schedule_rates(server: BenchServer, sizes: Sizes, before: str | None) -> dict[str, float]:
    """Items/s of schedule script calls (500 items each, arguments built untimed, as
    ``schedule_many`` builds them), rank 0 vs ranked (vs rank 0 with ``before``'s script), rounds
    alternating; median of rounds. Script calls only, so the old and new scripts compare alone."""
    # a store per case: rank-0 rows on a shard that holds ranked items pay a ZREM each
    plain, ranked = (DelayStore(server.connect(), Config(prefix=f"bench-prio-s{n}", shards=1)) for n in (0, 1))
    cases: list[tuple[str, DelayStore, int]] = [("rank 0", plain, 0), ("ranked", ranked, 2)]
    if before:  # the old scripts took all eight shard keys; the typed calls send each only its own
        log(f"--before {before}: not compared since the script layer sends each script only its keys")
    data = envelope("schedule", 0).encode()
    when = int(time.time() * 1000) + 3_600_000
    rates: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for r in range(sizes.schedule_rounds):
        for n, (label, s, rank) in enumerate(cases):
            items = [ScheduleItem(f"s{r}-{n}-{i}", when, data, rank) for i in range(sizes.schedule_items)]
            s.check_meta()
            keys = s.keys(0)
            calls = [
                Schedule.call(keys, items[k : k + 500], keep=False, wake=s.wake_channel)
                for k in range(0, len(items), 500)
            ]
            t0 = time.perf_counter()
            for call in calls:
                s.scripts.run(call)
            rates[label].append(sizes.schedule_items / (time.perf_counter() - t0))
    return {label: round(statistics.median(values)) for label, values in rates.items()}


def run_all(sizes: Sizes, before: str | None) -> dict[str, Any]:
    load_start = [round(x, 2) for x in os.getloadavg()]
    with BenchServer() as server:
        server.wipe()
        hour_ahead = int(time.time() * 1000) + 3_600_000
        recent = int(time.time() * 1000) - 300_000
        log(f"loading 4 backlogs of {sizes.backlog:_} due items")
        stores = {
            "no ranks": backlog(server, "plain", sizes, ranked=False, ranked_ready_ms=0),
            "1% ranked": backlog(server, "ranked", sizes, ranked=True, ranked_ready_ms=recent),
            "1% ranked, all leased": backlog(server, "leased", sizes, ranked=True, ranked_ready_ms=recent),
            "1% ranked, future": backlog(server, "future", sizes, ranked=True, ranked_ready_ms=hour_ahead),
        }
        if before:
            old = backlog(server, "old", sizes, ranked=False, ranked_ready_ms=0)
            stores[f"no ranks, scripts of {before}"] = with_scripts_of(old, before)
        hold_ranked(stores["1% ranked, all leased"], sizes)
        log(f"timing {sizes.samples} claims of {LIMIT} per backlog")
        timings = claim_samples(stores, sizes.samples)
        log("timing the schedule script")
        rates = schedule_rates(server, sizes, before)
        version = server.version()
    claims = {name: distribution(values) for name, values in timings.items()}
    base = claims["no ranks"]["p50"]
    return {
        "sizes": sizes.name,
        "backlog": sizes.backlog,
        "ranked_share": sizes.ranked_share,
        "limit": LIMIT,
        "claim_ms": claims,
        "claim_p50_vs_no_ranks": {name: round(d["p50"] / base, 3) for name, d in claims.items()},
        "schedule_script_items_per_s": rates,
        "schedule_items": sizes.schedule_items,
        "server": version,
        "code_digest": code_digest(),
        "loadavg": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def section(result: dict[str, Any]) -> str:
    """The markdown section appended to RESULTS.md."""
    rows = "\n".join(
        f"| {name} | {d['p50']} | {d['p99']} | {result['claim_p50_vs_no_ranks'][name]} |"
        for name, d in result["claim_ms"].items()
    )
    rates = ", ".join(f"{label} {rate:,} items/s" for label, rate in result["schedule_script_items_per_s"].items())
    return f"""
## Priority under backlog, {result["at"]} (`bench/priority.py`, {result["sizes"]})

One shard holding {result["backlog"]:,} due items ({result["ranked_share"]:.0%} ranked where said); each sample
times `claim({result["limit"]})` and releases the batch untimed; samples alternate between the backlogs.
{result["server"]}, code digest {result["code_digest"]}; load average {result["loadavg"]["start"]} at start,
{result["loadavg"]["end"]} at end (2 cores shared with other work).

| backlog | claim p50 ms | claim p99 ms | p50 vs no ranks |
|---|---:|---:|---:|
{rows}

Schedule script calls (500 items each, one shard, 1 h ahead, {result["schedule_items"]:,} items per round),
median of rounds: {rates}.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="markdown file to append to")
    parser.add_argument("--no-results", action="store_true", help="print JSON only, do not touch RESULTS.md")
    parser.add_argument("--before", metavar="REV", help="also time rank-0 work with the scripts of this git revision")
    args = parser.parse_args(argv)
    result = run_all(QUICK if args.quick else FULL, args.before)
    print(json.dumps(result, indent=1))
    if not args.no_results:
        write_results(args.results, section(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
