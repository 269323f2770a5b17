#!/usr/bin/env python
"""Forwarding throughput of this tree against another git revision, in one run.

``python bench/forward_ab.py --before REV`` checks REV out into a temporary worktree, starts one
Valkey, and then, round after round, runs the same work with each tree's code in its own
process (``PYTHONPATH`` set to that tree): schedule ``--items`` list items due now on a fresh
prefix, then one in-process ``Forwarder`` drains them to a Redis list at ``--batch``. The two
trees alternate, so load from elsewhere on a shared machine falls on both alike. It prints the
median items/s of each tree with its spread, their ratio and the load average, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

#: Run inside each tree's process: prints the forwarding rate in items/s.
WORK = """
import sys, time, uuid
from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
url, items, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prefix = "ab" + uuid.uuid4().hex[:10]
store = DelayStore(connect(url), Config(prefix=prefix, shards=16))
body = b"x" * 200
store.schedule_many((f"i{n}", 0, RedisListTarget.envelope(prefix + ":out", body)) for n in range(items))
forwarder = Forwarder(store, [RedisListTarget(connect(url))], batch=batch)
started, moved = time.perf_counter(), 0
while moved < items:
    moved += forwarder.run_once()
elapsed = time.perf_counter() - started
store.client.delete(prefix + ":out")
print(items / elapsed)
"""


def rate(tree: Path, url: str, items: int, batch: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", WORK, url, str(items), str(batch)], env=env, check=True, capture_output=True, text=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def summary(rates: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(rates)),
        "min": round(min(rates)),
        "max": round(max(rates)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, metavar="REV", help="git revision to compare with")
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HERE))
    from delayq_backends.embedded import EmbeddedServer

    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer() as server:
        before = Path(tmp) / "before"
        git = ["git", "-C", str(HERE), "worktree"]
        subprocess.run([*git, "add", "-q", "--detach", str(before), args.before], check=True)
        try:
            trees = {"before": before, "after": HERE}
            rates: dict[str, list[float]] = {name: [] for name in trees}
            for n in range(args.rounds):
                order = list(trees) if n % 2 == 0 else list(reversed(trees))
                for name in order:
                    rates[name].append(rate(trees[name], server.url, args.items, args.batch))
                print(f"round {n + 1}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rates.items()), file=sys.stderr)
        finally:
            subprocess.run([*git, "remove", "--force", str(before)], check=False)
    result = {
        "before": args.before,
        "items": args.items,
        "batch": args.batch,
        "rounds": args.rounds,
        "items_per_s": {name: summary(r) for name, r in rates.items()},
        "ratio_of_medians": round(statistics.median(rates["after"]) / statistics.median(rates["before"]), 3),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
