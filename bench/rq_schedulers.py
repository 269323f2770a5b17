#!/usr/bin/env python
"""RQ benchmark: delayq_backends.rq side by side with RQ's built-in scheduler and rq-scheduler.

Run ``python bench/rq_schedulers.py`` (about 5 min) or ``python bench/rq_schedulers.py --quick`` (smoke test). JSON goes
to stdout, progress to stderr, and a dated section is appended to ``bench/RESULTS.md``
(``--no-results`` skips that). Every system runs in the same run against one Valkey this script
starts (``BenchServer`` from ``bench/core.py``), with its own real processes:

- **delayq**: ``delayq_backends.rq.Queue.enqueue_at`` and one ``delayq forward --rq-redis``;
- **rq builtin**: ``rq.Queue.enqueue_at`` and ``rq worker --with-scheduler`` (polls every second);
- **rq-scheduler**: ``rq_scheduler.Scheduler.enqueue_at`` and ``rqscheduler -i 1``.

Figures: scheduling throughput (one ``enqueue_at`` call per job, median of rounds run
round-robin); lateness at a steady rate (job start in a ``SimpleWorker`` minus the scheduled
time, and the enqueue into the queue minus the scheduled time). Moving a backlog of due jobs
into the queue is ``bench/target_rq.py``'s (RQ's scheduler, a naive mover and the ``delayq
forward`` process). The machine is small and shared: quote medians and ratios, not single numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent

import rq  # noqa: E402
import rq_scheduler  # noqa: E402
from lib.processes import Processes  # noqa: E402
from lib.report import RESULTS_PATH, distribution, log, write_results  # noqa: E402
from lib.server import BenchServer  # noqa: E402
from lib.waiting import wait_for  # noqa: E402
from rq import Queue as RQQueue  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.registry import FinishedJobRegistry  # noqa: E402

from delayq_backends import Config, DelayStore  # noqa: E402
from delayq_backends.rq import Queue  # noqa: E402
from delayq_backends.scripts import install_functions  # noqa: E402

BIN = Path(sys.executable).parent
PREFIX = "bench"
NOOP = "builtins.abs"  # a job function every worker can import


@dataclass(frozen=True)
class Sizes:
    name: str
    schedule_jobs: int  # enqueue_at calls per round
    rounds: int
    steady_jobs: int  # jobs spread over steady_seconds
    steady_seconds: float


FULL = Sizes("full", schedule_jobs=600, rounds=15, steady_jobs=1000, steady_seconds=10.0)
QUICK = Sizes("quick", schedule_jobs=500, rounds=1, steady_jobs=200, steady_seconds=4.0)


# -- the three systems --------------------------------------------------------------------------


class System:
    """How one system schedules a job and which process moves due jobs into the queue."""

    name = ""
    queue_class = "rq.Queue"

    def __init__(self, server: BenchServer) -> None:
        self.server = server
        self.conn = server.connect()

    def schedule(self, queue_name: str) -> Callable[[float], str]:
        """A function scheduling one NOOP job at epoch seconds ``at``; returns its id."""
        raise NotImplementedError

    def mover(self, queue_name: str) -> list[str]:
        raise NotImplementedError

    def pending(self, queue_name: str) -> int:
        """Jobs still waiting in this system's schedule."""
        raise NotImplementedError


class Delayq(System):
    name = "delayq"
    queue_class = "delayq_backends.rq.Queue"

    def __init__(self, server: BenchServer) -> None:
        super().__init__(server)
        self.store = DelayStore(self.conn, Config(prefix=PREFIX, shards=16))

    def schedule(self, queue_name: str) -> Callable[[float], str]:
        queue = Queue(queue_name, connection=self.conn, delay_store=self.store)
        return lambda at: str(queue.enqueue_at(datetime.fromtimestamp(at, tz=timezone.utc), NOOP, 0).id)

    def mover(self, queue_name: str) -> list[str]:
        url = self.server.url
        return [str(BIN / "delayq"), "forward", "--url", url, "--rq-redis", url, "--prefix", PREFIX,
                "--shards", "16", "--log-level", "warning"]  # fmt: skip

    def pending(self, queue_name: str) -> int:
        return sum(s.scheduled for s in self.store.stats())


class RQBuiltin(System):
    name = "rq builtin"

    def schedule(self, queue_name: str) -> Callable[[float], str]:
        queue = RQQueue(queue_name, connection=self.conn)
        return lambda at: str(queue.enqueue_at(datetime.fromtimestamp(at, tz=timezone.utc), NOOP, 0).id)

    def mover(self, queue_name: str) -> list[str]:
        return [str(BIN / "rq"), "worker", "-u", self.server.url, "--with-scheduler", "-q",
                "-w", "rq.worker.SimpleWorker", queue_name]  # fmt: skip

    def pending(self, queue_name: str) -> int:
        return int(self.conn.zcard(f"rq:scheduled:{queue_name}"))


class RQScheduler(System):
    name = "rq-scheduler"

    def schedule(self, queue_name: str) -> Callable[[float], str]:
        scheduler = rq_scheduler.Scheduler(queue_name, connection=self.conn)
        # rq-scheduler wants naive UTC datetimes
        return lambda at: str(
            scheduler.enqueue_at(datetime.fromtimestamp(at, tz=timezone.utc).replace(tzinfo=None), NOOP, 0).id
        )  # noqa: E501

    def mover(self, queue_name: str) -> list[str]:
        return [str(BIN / "rqscheduler"), "-H", "127.0.0.1", "-p", str(self.server.port), "-i", "1"]

    def pending(self, queue_name: str) -> int:
        return int(self.conn.zcard(rq_scheduler.Scheduler.scheduled_jobs_key))


SYSTEMS = (Delayq, RQBuiltin, RQScheduler)


# -- processes ---------------------------------------------------------------------------------


def simple_worker(system: System, queue_name: str) -> list[str]:
    return [str(BIN / "rq"), "worker", "-u", system.server.url, "-q", "-w", "rq.worker.SimpleWorker",
            "--queue-class", system.queue_class, queue_name]  # fmt: skip


# -- measurements ------------------------------------------------------------------------------


def bench_scheduling(server: BenchServer, sizes: Sizes, systems: Sequence[type[System]] = SYSTEMS) -> dict[str, Any]:
    """enqueue_at calls per second, one call per job, a round of each system in turn (the first
    is delayq, the others its peers).

    Many short rounds rather than a few long ones: on a shared machine the load changes within
    seconds, and each round's ratio compares systems measured a second apart."""
    rates: dict[str, list[float]] = {cls.name: [] for cls in systems}
    for r in range(sizes.rounds):
        for cls in systems:
            server.wipe()
            system = cls(server)
            schedule = system.schedule(f"sched-{r}")
            later = time.time() + 3600
            start = time.perf_counter()
            for i in range(sizes.schedule_jobs):
                schedule(later + i / 1000)
            rates[cls.name].append(sizes.schedule_jobs / (time.perf_counter() - start))
            log(f"schedule {cls.name}: {rates[cls.name][-1]:,.0f}/s")
    out: dict[str, Any] = {
        name: {"median": round(statistics.median(v)), "runs": [round(x) for x in v]} for name, v in rates.items()
    }
    # each round runs the systems back to back, so a round's ratio shares that moment's load
    for peer in names_of(systems)[1:]:
        paired = [ours / theirs for ours, theirs in zip(rates[systems[0].name], rates[peer])]
        out[systems[0].name][f"ratio_to_{peer}"] = {
            "median": round(statistics.median(paired), 3),
            "min": round(min(paired), 3),
            "max": round(max(paired), 3),
        }
    return out


def names_of(systems: Sequence[type[System]]) -> list[str]:
    return [cls.name for cls in systems]


def bench_lateness(server: BenchServer, sizes: Sizes) -> dict[str, Any]:
    """Jobs spread evenly over a few seconds; when each started (and was queued) vs its time."""
    out: dict[str, Any] = {}
    for cls in SYSTEMS:
        server.wipe()
        system = cls(server)
        name = "steady"
        procs = Processes()
        procs.start(system.mover(name))
        if cls is not RQBuiltin:  # the builtin scheduler's worker runs the jobs itself
            procs.start(simple_worker(system, name))
        time.sleep(2.0)  # let the processes start before the first job is due
        schedule = system.schedule(name)
        first = time.time() + 1.0
        due = {}
        for i in range(sizes.steady_jobs):
            at = first + i * sizes.steady_seconds / sizes.steady_jobs
            due[schedule(at)] = at
        registry = FinishedJobRegistry(name, connection=system.conn)
        try:
            wait_for(
                lambda r=registry: r.count >= sizes.steady_jobs,
                sizes.steady_seconds + 30,
                f"{cls.name} jobs",
                interval=0.02,
            )
        finally:
            procs.stop()
        jobs = [j for j in Job.fetch_many(list(due), connection=system.conn) if j is not None]
        started = [(j.started_at.replace(tzinfo=timezone.utc).timestamp() - due[j.id]) * 1000 for j in jobs]
        queued = [(j.enqueued_at.replace(tzinfo=timezone.utc).timestamp() - due[j.id]) * 1000 for j in jobs]
        out[cls.name] = {"start_ms": distribution(started), "queued_ms": distribution(queued),
                         "early": sum(1 for s in started if s < 0)}  # fmt: skip
        log(f"lateness {cls.name}: start {out[cls.name]['start_ms']}, early {out[cls.name]['early']}")
    return out


# -- report ------------------------------------------------------------------------------------


def section(result: dict[str, Any], sizes: Sizes) -> str:
    sched, late = result["scheduling"], result["lateness"]
    names = [cls.name for cls in SYSTEMS]
    rows = [
        "| figure | " + " | ".join(names) + " | delayq / rq builtin | delayq / rq-scheduler |",
        "|---|" + "---:|" * (len(names) + 2),
    ]

    def row(label: str, values: list[float], fmt: str, higher_is_better: bool) -> str:
        ours, *peers = values
        ratios = [(ours / p if higher_is_better else p / ours) if ours > 0 and p > 0 else None for p in peers]
        cells = [format(v, fmt) for v in values] + ["—" if r is None else f"{r:.2f}" for r in ratios]
        return f"| {label} | " + " | ".join(cells) + " |"

    rows.append(row("enqueue_at, jobs/s (median)", [sched[n]["median"] for n in names], ",.0f", True))
    for q in ("p50", "p99", "max"):
        values = [late[n]["start_ms"][q] for n in names]
        rows.append(row(f"lateness {q}, job start − scheduled (ms)", values, ".1f", False))
    values = [late[n]["queued_ms"]["p99"] for n in names]
    rows.append(row("lateness p99, put in the queue − scheduled (ms)", values, ".1f", False))
    rows.append("| jobs started *before* their time | " + " | ".join(str(late[n]["early"]) for n in names) + " | | |")
    spread = ", ".join(f"{n} {min(sched[n]['runs']):,}–{max(sched[n]['runs']):,}" for n in names)
    paired = "; ".join(
        f"delayq / {n} median {r['median']:.2f} (min {r['min']:.2f}, max {r['max']:.2f})"
        for n in names[1:]
        if (r := sched[names[0]].get(f"ratio_to_{n}"))
    )
    return "\n".join([
        f"## RQ: {result['at']} ({sizes.name}), {result['server']}, rq {result['rq']}, "
        f"rq-scheduler {result['rq_scheduler']}",
        "",
        "Produced by `bench/rq_schedulers.py`: delayq (`delayq_backends.rq.Queue` + one `delayq forward "
        "--rq-redis`), RQ's",
        "built-in scheduler (`rq worker --with-scheduler`) and rq-scheduler (`rqscheduler -i 1`), side by side in one",
        "run on one embedded Valkey. Ratios > 1 favour delayq (throughput: delayq/peer; lateness: peer/delayq).",
        f"Lateness: {sizes.steady_jobs:,} no-op jobs spread over {sizes.steady_seconds:g} s, run by a SimpleWorker",
        "(the builtin scheduler's own worker for RQ builtin). Moving a backlog: `bench/target_rq.py`.",
        "delayq runs its scripts as the installed Function library (FCALL), as `delayq functions install` sets up.",
        f"enqueue_at rounds (jobs/s, min–max of {sizes.rounds}): {spread}. Load average (1 min): "
        f"{result['load']:.2f} at start, {result['load_end']:.2f} at end.",
        f"enqueue_at, ratio within each round: {paired}.",
        "RQ's registry and rq-scheduler keep whole seconds (the score drops the fraction) and poll once a second, so",
        "their jobs run up to a second early or late; negative lateness is early, and no ratio is given for it.",
        "",
        *rows,
        "",
        "Details (JSON):",
        "",
        "```json",
        json.dumps(result, indent=1),
        "```",
        "",
    ])  # fmt: skip


def run_all(sizes: Sizes) -> dict[str, Any]:
    with BenchServer() as server:
        result: dict[str, Any] = {
            "server": server.version(),
            "at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "rq": rq.__version__,
            "rq_scheduler": metadata.version("rq-scheduler"),
            "sizes": sizes.__dict__,
            "load": os.getloadavg()[0],
            "functions": True,
        }
        install_functions(server.client)  # FLUSHALL keeps functions: delayq calls FCALL throughout
        log("scheduling throughput")
        result["scheduling"] = bench_scheduling(server, sizes)
        log("lateness at a steady rate")
        result["lateness"] = bench_lateness(server, sizes)
        result["load_end"] = os.getloadavg()[0]
        return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="markdown file to append to")
    parser.add_argument("--no-results", action="store_true", help="print JSON only, do not touch RESULTS.md")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    result = run_all(sizes)
    print(json.dumps(result, indent=1))
    if not args.no_results:
        write_results(args.results, section(result, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
