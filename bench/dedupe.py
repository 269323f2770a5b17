#!/usr/bin/env python
"""Cost of worker-side dedupe (issue 15 item 2): tasks/s with and without, Celery and RQ.

Run ``python bench/dedupe.py`` (about 2 min) or ``--quick``. It starts its own Valkey (delay
store, Redis broker, result sink) and measures:

- the record itself: :meth:`RunGuard.start` round trips per second, one client, first starts
  (SET NX PX succeeds) and duplicates (SET NX fails, then GET);
- Celery: one ``celery worker`` (threads, 4) on the Redis broker drains N no-op tasks sent
  up front, with ``delayq_dedupe`` on and off, alternating rounds; tasks/s = N / (last
  task's start − first task's start), from the tasks' own records;
- RQ: one burst ``rq worker`` (SimpleWorker, no fork) drains N jobs with
  ``DedupeSimpleWorker`` and with ``SimpleWorker``; jobs/s from the jobs' own start times.

JSON goes to stdout, progress to stderr, a dated section is appended to bench/RESULTS.md
with the load average at start and end (the machine is shared: compare within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
from lib.celery_run import CeleryRun
from lib.report import RESULTS_PATH, code_digest, log, write_results
from lib.waiting import wait_for

from delayq_backends import Config, DelayStore
from delayq_backends.dedupe import RunGuard
from delayq_backends.embedded import EmbeddedServer

BENCH_DIR = Path(__file__).resolve().parent


def guard_rate(server: EmbeddedServer, n: int) -> dict[str, float]:
    """RunGuard.start for n first starts, then the same n again (duplicates): calls per second
    the median call in µs (the median shrugs off the other jobs' bursts better) and the
    client CPU per call (what a worker spends, whatever the load)."""
    store = DelayStore(redis.Redis.from_url(server.url), Config(prefix=f"bd{uuid.uuid4().hex[:8]}", shards=16))
    store.check_meta()
    guard = RunGuard(store, ttl_ms=60_000)
    ids = [str(uuid.uuid4()) for _ in range(n)]
    out: dict[str, float] = {}
    for label in ("first", "duplicate"):
        calls = []
        start, cpu = time.perf_counter(), time.process_time()
        for item_id in ids:
            before = time.perf_counter()
            guard.start(item_id, 0)
            calls.append(time.perf_counter() - before)
        out[f"{label}_cpu_us"] = round((time.process_time() - cpu) / n * 1e6)
        out[f"{label}_per_s"] = round(n / (time.perf_counter() - start))
        out[f"{label}_p50_us"] = round(statistics.median(calls) * 1e6)
    return out


def celery_round(server: EmbeddedServer, n: int, dedupe: bool) -> float:
    """Tasks/s of one worker draining ``n`` queued no-op tasks."""
    env = CeleryRun.on("redis", f"{server.url.rsplit('/', 1)[0]}/1", server)
    env.dedupe = dedupe
    tmp = Path(tempfile.mkdtemp(prefix="dq-bench-dedupe-"))
    try:
        proc = env.start_worker(tmp)
        env.app().send_task("dqb.ping", queue=env.queue)  # warm the store connection
        app = env.app()
        sink = redis.Redis.from_url(env.records_url)
        with app.connection_for_write() as conn, conn.Producer() as producer:
            for i in range(n):
                app.send_task("dqb.record", args=[f"b{i}"], queue=env.queue, producer=producer)
        wait_for(lambda: proc.poll() is not None or sink.llen(env.sink) >= n, 600, "the worker to drain", interval=0.2)
        starts = [json.loads(r)["started_ms"] for r in sink.lrange(env.sink, 0, -1)]
        return n / max(1e-3, (max(starts) - min(starts)) / 1000)
    finally:
        env.stop()


def rq_round(server: EmbeddedServer, n: int, worker_class: str) -> float:
    """Jobs/s of one burst SimpleWorker draining ``n`` queued jobs."""
    from lib.rq_jobs import record, runs_key
    from rq import Queue

    conn = redis.Redis.from_url(server.url)
    prefix = f"bq{uuid.uuid4().hex[:8]}"
    queue = Queue(f"{prefix}-q", connection=conn)
    with conn.pipeline() as pipe:
        for i in range(n):
            queue.enqueue(record, i, pipeline=pipe)
        pipe.execute()
    path = os.pathsep.join([str(BENCH_DIR.parent), str(BENCH_DIR)])  # this checkout, and lib.rq_jobs
    env = {**os.environ, "PYTHONPATH": path, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "16"}
    args = [sys.executable, "-m", "rq.cli", "worker", "-u", server.url, "--burst", "-q"]
    subprocess.run([*args, "--worker-class", worker_class, queue.name], cwd=BENCH_DIR, env=env, check=True, timeout=600)
    starts = [json.loads(r)["at"] for r in conn.lrange(runs_key(queue.name), 0, -1)]
    return n / max(1e-3, max(starts) - min(starts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    n_celery, n_rq, rounds = (300, 200, 1) if args.quick else (800, 400, 4)
    report: dict[str, Any] = {"load_start": os.getloadavg(), "code": code_digest(), "quick": args.quick}
    began = time.monotonic()
    with EmbeddedServer() as server:
        log("RunGuard.start round trips")
        report["guard"] = guard_rate(server, 2000 if args.quick else 10000)
        celery: dict[str, list[float]] = {"on": [], "off": []}
        rq: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):  # neither always goes first
                log(f"round {r + 1}: Celery, dedupe {mode}")
                celery[mode].append(round(celery_round(server, n_celery, mode == "on"), 1))
                log(f"round {r + 1}: RQ, dedupe {mode}")
                worker = "delayq_backends.rq.DedupeSimpleWorker" if mode == "on" else "rq.SimpleWorker"
                rq[mode].append(round(rq_round(server, n_rq, worker), 1))
        report["celery_tasks_per_s"] = celery
        report["rq_jobs_per_s"] = rq
    report["load_end"] = os.getloadavg()
    report["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(report, indent=2))
    if not args.no_results:
        write_results(RESULTS_PATH, section(report, n_celery, n_rq))


def section(report: dict[str, Any], n_celery: int, n_rq: int) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):g} ({', '.join(f'{v:g}' for v in values)})"

    def cost(values: dict[str, list[float]]) -> str:
        off, on = statistics.median(values["off"]), statistics.median(values["on"])
        return f"{(1 / on - 1 / off) * 1e6:+.0f} µs/task ({(on / off - 1) * 100:+.1f} %)"

    c, q, g = report["celery_tasks_per_s"], report["rq_jobs_per_s"], report["guard"]
    load = ", ".join(f"{x:.2f}" for x in report["load_start"]), ", ".join(f"{x:.2f}" for x in report["load_end"])
    return (
        f"\n## Worker-side dedupe, {when} ({'quick' if report['quick'] else 'full'}, code {report['code']}, "
        f"{report['seconds']} s, `bench/dedupe.py`)\n\n"
        f"Load average [{load[0]}] at start, [{load[1]}] at end (2 shared cores: other jobs ran too).\n\n"
        "| what | dedupe off | dedupe on | cost |\n|---|---|---|---|\n"
        f"| Celery worker (threads 4, Redis broker), {n_celery} no-op tasks, tasks/s: median (rounds) "
        f"| {cell(c['off'])} | {cell(c['on'])} | {cost(c)} |\n"
        f"| RQ SimpleWorker, {n_rq} jobs, jobs/s | {cell(q['off'])} | {cell(q['on'])} | {cost(q)} |\n\n"
        f"`RunGuard.start` alone, one client: {g['first_per_s']:,} first starts/s, median "
        f"{g['first_p50_us']} µs, {g['first_cpu_us']} µs client CPU per call (SET NX PX); "
        f"{g['duplicate_per_s']:,} duplicates/s, median {g['duplicate_p50_us']} µs, "
        f"{g['duplicate_cpu_us']} µs CPU (SET NX + GET).\n"
    )


if __name__ == "__main__":
    main()
