#!/usr/bin/env python
"""RQ target bench: moving due jobs into their queue, and ``enqueue_at``, against RQ in one run.

Run ``python bench/target_rq.py`` (30,000 due jobs, 5 rounds) or ``--quick`` (6,000, 2 rounds).
Each round wipes the bench's own Valkey, loads the same number of due jobs of one queue
(untimed, in bulk) and moves them into ``rq:queue:<name>``, once by each case, back to back:

- **rq scheduler**: RQ's own scheduler (the ``RQScheduler`` process that ``rq worker
  --with-scheduler`` forks, without a worker taking the jobs), on jobs a plain ``rq.Queue``
  scheduled;
- **naive mover**: the same jobs scheduled by ``delayq_backends.rq.Queue``, moved in this
  process by ``lib.movers.naive_rq_move`` (RQ's enqueue writes, pipelined; no lease, no ack, no
  job hash read);
- **delayq forward**: the same, moved by the ``delayq forward --rq-redis`` process users run.

Each process is timed from its first job in the queue to the last (its start-up is shown
beside it). Then ``enqueue_at`` of ``delayq_backends.rq.Queue`` against plain RQ's, one call per
job, rounds interleaved (``rq_schedulers.bench_scheduling``). Prints a markdown table
(medians, min–max, ratios per round, load average); JSON with ``--json``. Issue 23's goals:
RQ ≥ 25k jobs/s moved by one forwarder; ``enqueue_at`` ≥ 0.9× plain RQ.

``--only move`` or ``--only enqueue_at`` runs that step alone (``python bench/target_rq.py
--quick --only enqueue_at``: the enqueue_at rounds, in about ten seconds).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from lib.movers import (
    Case,
    Results,
    cli_forward,
    in_process,
    load_line,
    naive_rq_move,
    options,
    process_drain,
    rounds,
    summary,
    table,
)
from lib.server import BenchServer
from lib.timing import ms_now
from rq import Queue as RQQueue
from rq_schedulers import NOOP, Delayq, RQBuiltin, bench_scheduling
from rq_schedulers import Sizes as SchedulingSizes

from delayq_backends.rq import Queue

QUEUE = "bench-rq"
#: what ``--only`` may pick: the move of due jobs, or the enqueue_at calls
STEPS = ("move", "enqueue_at")
#: jobs per bulk-load pipeline
CHUNK = 2000
#: RQ's scheduler component alone: what ``rq worker --with-scheduler`` forks
RQ_SCHEDULER = (
    "import sys; from redis import Redis; from rq.scheduler import RQScheduler; "
    "RQScheduler([sys.argv[2]], connection=Redis.from_url(sys.argv[1])).work()"
)


@dataclass(frozen=True)
class Sizes:
    jobs: int
    rounds: int
    enqueue_calls: int
    enqueue_rounds: int


FULL = Sizes(30_000, 5, 600, 15)
QUICK = Sizes(6_000, 2, 300, 3)


def load_rq(server: BenchServer, n: int) -> None:
    """``n`` due jobs a plain ``rq.Queue`` scheduled (in ``rq:scheduled:<queue>``)."""
    conn = server.connect()
    queue = RQQueue(QUEUE, connection=conn)
    past = datetime.now(timezone.utc) - timedelta(seconds=60)
    for start in range(0, n, CHUNK):
        with conn.pipeline() as pipe:
            for i in range(start, min(n, start + CHUNK)):
                queue.schedule_job(queue.create_job(NOOP, args=(i,)), past, pipeline=pipe)
            pipe.execute()


def load_delayq(server: BenchServer, n: int) -> None:
    """``n`` due jobs ``delayq_backends.rq.Queue`` scheduled: saved as its ``enqueue_at`` saves
    them, their ids put in the store in bulk (``save_scheduled`` + ``schedule_many``)."""
    conn = server.connect()
    store = server.store(client=conn)
    queue = Queue(QUEUE, connection=conn, delay_store=store)
    past = datetime.now(timezone.utc) - timedelta(seconds=60)
    envelope = queue.envelope_bytes()
    for start in range(0, n, CHUNK):
        ids = []
        with conn.pipeline() as pipe:
            for i in range(start, min(n, start + CHUNK)):
                job = queue.create_job(NOOP, args=(i,))
                queue.save_scheduled(job, past, pipe)
                ids.append(job.id)
            pipe.execute()
        store.schedule_many([(job_id, past.timestamp(), envelope) for job_id in ids])


def cases(server: BenchServer, sizes: Sizes) -> list[Case]:
    def queued() -> int:
        return int(server.client.llen(f"rq:queue:{QUEUE}"))

    def naive() -> int:
        client = server.connect()
        return naive_rq_move(client, server.store(client=client), QUEUE, int(ms_now()))

    rq_scheduler = [sys.executable, "-c", RQ_SCHEDULER, server.url, QUEUE]
    forward = cli_forward(server, "--rq-redis", server.url)
    return [
        Case(
            "rq scheduler",
            lambda: load_rq(server, sizes.jobs),
            lambda: process_drain(server, rq_scheduler, queued, sizes.jobs, delayq=False),
        ),
        Case("naive mover", lambda: load_delayq(server, sizes.jobs), lambda: in_process(server, naive, sizes.jobs)),
        Case(
            "delayq forward",
            lambda: load_delayq(server, sizes.jobs),
            lambda: process_drain(server, forward, queued, sizes.jobs),
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__, argv, steps=STEPS)
    sizes = QUICK if args.quick else FULL
    out: dict[str, Any] = {}
    with BenchServer() as server:
        version = server.version()
        if args.only in (None, "move"):
            moved = rounds(server, cases(server, sizes), sizes.rounds)
            print_moves(moved, sizes, version)
            out.update(summary(moved))
        if args.only in (None, "enqueue_at"):
            before = os.getloadavg()[0]
            calls = SchedulingSizes("", sizes.enqueue_calls, sizes.enqueue_rounds, 0, 0.0)
            scheduling = bench_scheduling(server, calls, (Delayq, RQBuiltin))
            print_enqueue_at(scheduling, sizes, (before, os.getloadavg()[0]))
            out["enqueue_at"] = scheduling
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


def print_moves(moved: Results, sizes: Sizes, version: str) -> None:
    print(f"## RQ: {sizes.jobs:,} due jobs moved into their queue, {sizes.rounds} rounds, {version}\n")
    print("\n".join(table(moved, "delayq forward", "rq scheduler", goal=None, unit="jobs/s")))
    print(f"\nGoal: delayq forward ≥ 25,000 jobs/s. {load_line(moved)}\n")


def print_enqueue_at(scheduling: dict[str, Any], sizes: Sizes, load: tuple[float, float]) -> None:
    """The enqueue_at table; ``load``: the 1-minute load average before and after the step."""
    ours, theirs = scheduling[Delayq.name], scheduling[RQBuiltin.name]
    ratio = ours[f"ratio_to_{RQBuiltin.name}"]
    print(f"| `enqueue_at`, {sizes.enqueue_calls} calls × {sizes.enqueue_rounds} rounds | calls/s, median (min–max) |")
    print("|---|---:|")
    for name, result in ((f"`{Delayq.queue_class}`", ours), ("plain `rq.Queue`", theirs)):
        print(f"| {name} | {result['median']:,} ({min(result['runs']):,}–{max(result['runs']):,}) |")
    met = "met" if ratio["median"] >= 0.9 else "NOT met"
    print(f"| **ours / plain RQ** per round (goal ≥ 0.9) | **{ratio['median']:.2f}** ({ratio['min']:.2f}–"
          f"{ratio['max']:.2f}) {met} |")  # fmt: skip
    print(f"\nload average (1 min) before and after the enqueue_at step: {load[0]:.2f}, {load[1]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
