#!/usr/bin/env python
"""This tree against other git revisions, side by side in one run: the store's core rates.

``python bench/ab.py --before REV [--before REV2 ...]`` checks each REV out into a temporary
worktree, starts one Valkey, and then, round after round, runs the same work with each tree's
code in its own process (``PYTHONPATH`` set to that tree), on a fresh prefix each time:

- ``schedule``: ``store.schedule()`` one call per item (``--single`` items);
- ``schedule_many``: ``store.schedule_many()`` of ``--items`` list items due now;
- ``forward``: one in-process ``Forwarder`` draining them to a Redis list at ``--batch``.

The trees take turns in a rotating order, so load from elsewhere on a shared machine falls on
all alike. Besides items/s, each figure has its CPU µs per item in the client process and in the
server (``INFO cpu``), which a loaded machine disturbs far less than wall time. It prints each
tree's medians with their spread, each tree's ratio to the first ``--before`` (for the µs
figures, above 1 means more CPU per item) and the load
average, as JSON. Only APIs every revision since the first
release has are used, so old trees run unchanged.
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
RATES = ("schedule", "schedule_many", "forward")
#: per rate: items/s, and CPU µs per item in the producing/forwarding process and in the server
FIGURES = tuple(f"{r}{part}" for r in RATES for part in ("", "_client_us", "_server_us"))

#: Run inside each tree's process: prints {figure: items/s} as JSON.
WORK = """
import json, sys, time, uuid
from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
url, items, single, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prefix = "ab" + uuid.uuid4().hex[:10]
client = connect(url)
store = DelayStore(client, Config(prefix=prefix, shards=16))
envelope = RedisListTarget.envelope(prefix + ":out", b"x" * 200)
out = {}

def server_cpu():
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]

def measure(name, n, work):
    wall, cpu, server = time.perf_counter(), time.process_time(), server_cpu()
    work()
    out[name] = n / (time.perf_counter() - wall)
    out[name + "_client_us"] = (time.process_time() - cpu) / n * 1e6
    out[name + "_server_us"] = (server_cpu() - server) / n * 1e6

def schedule_each():
    for n in range(single):
        store.schedule(f"s{n}", 0, envelope)

def forward():
    forwarder = Forwarder(store, [RedisListTarget(connect(url))], batch=batch)
    moved = 0
    while moved < items + single:
        moved += forwarder.run_once()

measure("schedule", single, schedule_each)
measure("schedule_many", items, lambda: store.schedule_many((f"i{n}", 0, envelope) for n in range(items)))
measure("forward", items + single, forward)
client.delete(prefix + ":out")
print(json.dumps(out))
"""


def rates(tree: Path, url: str, items: int, single: int, batch: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # cwd=tree: ``python -c`` puts the working directory first on sys.path, so run from
    # elsewhere every tree would import the caller's checkout.
    done = subprocess.run(
        [sys.executable, "-c", WORK, url, str(items), str(single), str(batch)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, action="append", metavar="REV", help="git revision(s) to compare")
    parser.add_argument("--items", type=int, default=50_000, help="items for schedule_many and forward")
    parser.add_argument("--single", type=int, default=5_000, help="items scheduled one call each")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HERE))
    from delayq_backends.embedded import EmbeddedServer

    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer() as server:
        git = ["git", "-C", str(HERE), "worktree"]
        trees: dict[str, Path] = {}
        for rev in args.before:
            trees[rev] = Path(tmp) / f"rev{len(trees)}"
            subprocess.run([*git, "add", "-q", "--detach", str(trees[rev]), rev], check=True)
        trees["this tree"] = HERE
        try:
            seen: dict[str, dict[str, list[float]]] = {name: {f: [] for f in FIGURES} for name in trees}
            names = list(trees)
            for n in range(args.rounds):
                for name in names[n % len(names) :] + names[: n % len(names)]:
                    for figure, value in rates(trees[name], server.url, args.items, args.single, args.batch).items():
                        seen[name][figure].append(value)
                print(
                    f"round {n + 1}: "
                    + "; ".join(
                        f"{k}: " + ", ".join(f"{f} {v[f][-1]:.0f}/s" for f in FIGURES) for k, v in seen.items()
                    ),
                    file=sys.stderr,
                )
        finally:
            for tree in trees.values():
                if tree != HERE:
                    subprocess.run([*git, "remove", "--force", str(tree)], check=False)
    base = args.before[0]
    result = {
        "revisions": {
            name: subprocess.run(
                ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD" if name == "this tree" else name],
                capture_output=True,
                text=True,
            ).stdout.strip()
            for name in trees
        },
        "items": args.items,
        "single": args.single,
        "batch": args.batch,
        "rounds": args.rounds,
        "items_per_s": {name: {f: summary(v[f]) for f in FIGURES} for name, v in seen.items()},
        "ratio_to_" + base: {
            name: {f: round(statistics.median(v[f]) / statistics.median(seen[base][f]), 3) for f in FIGURES}
            for name, v in seen.items()
        },
        "loadavg": {"start": load_before, "end": [round(x, 2) for x in os.getloadavg()]},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
