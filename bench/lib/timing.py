"""Timing: repetitions of a case, interleaved, each metered on both sides (client CPU, server
CPU, time inside commands), reported as a median rate with every run listed."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report import Figure, Goal, figure, log
from .server import BenchServer

__all__ = ["Case", "Run", "measure_cases", "ms_now", "profile_top", "rate_figure", "timed_run"]


def ms_now() -> float:
    """Wall clock in (fractional) epoch ms: the clock the server's TIME and ready times use."""
    return time.time_ns() / 1e6


@dataclass
class Run:
    """One timed repetition: wall time and where the CPU went, for ``items`` items."""

    items: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float | None
    server_cmd_s: float

    @property
    def rate(self) -> float:
        return self.items / self.wall_s


def timed_run(server: BenchServer, work: Callable[[], int]) -> Run:
    """Time ``work`` (which returns how many items it handled) and meter both sides.

    Client CPU is this process's CPU time; server CPU comes from /proc and command time from
    INFO commandstats. Together they tell whether Python or Valkey limits a figure.
    """
    cmd0, cpu0 = server.command_seconds(), server.cpu_seconds()
    pcpu0, t0 = time.process_time(), time.perf_counter()
    items = work()
    wall, pcpu = time.perf_counter() - t0, time.process_time() - pcpu0
    cpu1 = server.cpu_seconds()
    server_cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return Run(items, wall, pcpu, server_cpu, server.command_seconds() - cmd0)


def rate_figure(key: str, label: str, runs: list[Run], target: Goal | None = None, **detail: Any) -> Figure:
    """Median rate over runs, with per-item CPU split (µs/item) as evidence of the limit."""

    def per_item_us(seconds: Callable[[Run], float | None]) -> float | None:
        values = [s / r.items * 1e6 for r in runs if (s := seconds(r)) is not None]
        return round(statistics.median(values), 2) if values else None

    rates = [r.rate for r in runs]
    return figure(
        key,
        label,
        statistics.median(rates),
        "items/s",
        target,
        runs=[round(x) for x in rates],
        items_per_run=runs[0].items,
        wall_us_per_item=per_item_us(lambda r: r.wall_s),
        client_cpu_us_per_item=per_item_us(lambda r: r.client_cpu_s),
        server_cpu_us_per_item=per_item_us(lambda r: r.server_cpu_s),
        server_cmd_us_per_item=per_item_us(lambda r: r.server_cmd_s),
        **detail,
    )


def profile_top(work: Callable[[], Any], limit: int = 12) -> list[str]:
    """cProfile ``work`` and return the functions with the most own time, for a missed target."""
    profiler = cProfile.Profile()
    profiler.runcall(work)
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    out = []
    for (filename, line, name), (_, ncalls, tottime, cumtime, _) in rows[:limit]:
        where = f"{Path(filename).name}:{line}({name})" if line else name
        out.append(f"{tottime / total:5.1%} own, {cumtime / total:5.1%} cum, {ncalls:>8} calls  {where}")
    return out


@dataclass
class Case:
    """One throughput measurement: ``prepare`` (untimed) wipes and loads, then returns the
    timed work, which returns how many items it handled."""

    key: str
    label: str
    prepare: Callable[[], Callable[[], int]]
    target: Goal | None = None


def measure_cases(server: BenchServer, reps: int, cases: Sequence[Case]) -> list[Figure]:
    """Run every case once per round, ``reps`` rounds, and report each one's median.

    Interleaving makes load from other jobs on the shared machine hit all cases alike, so the
    ratios between them (e.g. schedule_many vs its ceiling) hold even when absolute numbers
    drift. A case that misses its target gets one extra, untimed repetition under cProfile.
    """
    runs: dict[str, list[Run]] = {case.key: [] for case in cases}
    for _ in range(reps):
        for case in cases:
            runs[case.key].append(timed_run(server, case.prepare()))
    figures = []
    for case in cases:
        fig = rate_figure(case.key, case.label, runs[case.key], case.target)
        if fig.met is False:
            log(f"  {fig.key} missed its target: profiling one more repetition")
            fig.detail["profile_top_own_time"] = profile_top(case.prepare())
        figures.append(fig)
    return figures
