#!/usr/bin/env python
"""Reliability benchmark: the whole Celery path under ≥ 100 forwarder kills, broker and store
restarts (AOF) and network cuts, then a count of what was lost (must be 0) and duplicated.

Run ``python bench/chaos.py`` (about 3 min) or ``--quick`` (about 40 s). It starts its own
servers (``bench/lib/chaos.py`` holds the run, shared with the test suite's short version), prints
JSON, and appends a reliability table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from datetime import datetime, timezone

from lib.chaos import ChaosPlan, ChaosReport, run_chaos
from lib.report import RESULTS_PATH, code_digest, log, write_results

FULL = ChaosPlan(
    tasks=8000,
    spread=150.0,
    forwarders=4,
    faults={
        "kill-forwarder": 120,
        "cut-broker": 8,
        "cut-store": 8,
        "slow-broker": 4,
        "slow-store": 4,
        "restart-broker": 3,
        "restart-store": 3,
    },
    settle_timeout=300.0,
)
BROKERS = {
    "redis": "a Redis broker (restarts: kill -9, then start with AOF)",
    "rabbitmq": "RabbitMQ (restarts: rabbitmqctl stop_app and start_app)",
}
QUICK = ChaosPlan(
    tasks=3000,
    spread=25.0,
    forwarders=3,
    faults={
        "kill-forwarder": 20,
        "cut-broker": 2,
        "cut-store": 2,
        "slow-broker": 1,
        "slow-store": 1,
        "restart-broker": 1,
        "restart-store": 1,
    },
)


def markdown(report: ChaosReport, mode: str, load: tuple[float, float], broker: str) -> str:
    faults = ", ".join(f"{n} {kind}" for kind, n in report.faults.items())
    late = report.lateness_ms
    return (
        f"\n## Reliability (chaos), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC ({mode}, code {code_digest()})\n\n"
        "| faults injected | scheduled | executed | still waiting | lost | duplicated | dead-lettered | "
        "lateness p50 / p99 / max |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {faults} | {report.scheduled:,} | {report.executed:,} | {report.waiting:,} | **{report.lost}** | "
        f"{report.duplicates} | "
        f"{report.dead_letters} | {late['p50'] / 1000:.2f} / {late['p99'] / 1000:.1f} / "
        f"{late['max'] / 1000:.1f} s |\n\n"
        f"- lost: {report.lost} ({report.lost_after_broker_accepted} of them after the broker had accepted them, "
        f"by the forwarders' audit stream){': ' + ', '.join(report.lost_ids) if report.lost_ids else ''}\n"
        f"- {report.late_over_5s:,} tasks started more than 5 s after their eta; the latest: {report.worst}\n"
        f"- one `celery worker -P threads -c 4` on {broker}, {report.seconds:.0f} s in all; the store (and a "
        "Redis broker) run with AOF (`appendfsync always`); cuts and slow links (50 ms per packet) last 1 s; "
        "forwarder lease 3 s. On Redis, lateness after a broker restart is the worker's unacked messages "
        "coming back after `visibility_timeout` (10 s here).\n"
        f"- the worker was replaced {report.worker_restarts} time(s) after running nothing for 20 s "
        "(a Celery worker that stalled or died after a broker restart; at most once per stall)\n"
        f"- load average (1 min) {load[0]:.2f} at start, {load[1]:.2f} at end\n"
        "- peer: Celery's native ETA on the same Redis broker runs tasks twice or more once a countdown outlasts "
        "`visibility_timeout`, with no fault at all (see the Celery section: 400 duplicates of 200 tasks).\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="about 40 s, 26 faults")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument(
        "--broker",
        choices=["redis", "rabbitmq"],
        default="redis",
        help="redis: a broker of the run's own, restarted by kill -9 (AOF); rabbitmq: the system RabbitMQ, "
        "restarted with rabbitmqctl stop_app/start_app",
    )
    args = parser.parse_args(argv)
    plan = replace(QUICK if args.quick else FULL, broker=args.broker)
    load_start = os.getloadavg()[0]
    report = run_chaos(plan, log=log)
    print(json.dumps(report.as_dict(), indent=2))
    if not args.no_results:
        write_results(
            RESULTS_PATH,
            markdown(report, "quick" if args.quick else "full", (load_start, os.getloadavg()[0]), BROKERS[args.broker]),
        )
        log(f"appended to {RESULTS_PATH}")
    return 1 if report.lost else 0


if __name__ == "__main__":
    sys.exit(main())
