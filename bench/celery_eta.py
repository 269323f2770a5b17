#!/usr/bin/env python
"""Celery benchmark: the plugin against Celery's native ETA handling, side by side in one run.

Run ``python bench/celery_eta.py`` (full, about 6 min) or ``--quick`` (about 2 min). It starts its
own Valkey (delay store, Redis broker, result sink) and uses the RabbitMQ at 127.0.0.1:5672 when
it answers (``DELAYQ_TEST_AMQP_URL`` overrides it). On each broker it measures:

- ``apply_async(countdown=…)`` calls per second, plugin vs native (no worker: the call alone);
- end-to-end lateness (task start − eta) with one real ``celery worker`` and, for the plugin,
  one ``delayq forward``: tasks fall due over a few seconds;

and on the Redis broker:

- the worker's RSS with 10k (and, full run, 100k) tasks scheduled hours ahead;
- duplicate executions when countdowns outlast the Redis transport's ``visibility_timeout``.

JSON goes to stdout, progress to stderr, and a dated section is appended to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
from kombu import Connection
from lib.brokers import AMQP_URL, amqp_problem
from lib.celery_run import CeleryRun
from lib.report import RESULTS_PATH, code_digest, distribution, fmt_dist, log, write_results
from lib.waiting import wait_for

from delayq_backends.celery import forget_store
from delayq_backends.embedded import EmbeddedServer

HOURS = 3 * 3600
WAYS = ("plugin", "native")
POLL = 0.05  # seconds between checks: reading the sink must not steal the CPU being measured


@contextmanager
def running(env: CeleryRun, *, forwarder: bool) -> Iterator[CeleryRun]:
    """A worker (and for the plugin a forwarder) on ``env``, stopped and cleaned up after."""
    tmp = Path(tempfile.mkdtemp(prefix="dq-bench-"))
    try:
        env.start_worker(tmp)
        if forwarder:
            env.start_forwarder(tmp)
        yield env
    finally:
        env.stop()
        env.delete_queue()


def purge(env: CeleryRun) -> None:
    """Empty the queue a no-worker measurement filled."""
    with Connection(env.broker) as conn:
        conn.default_channel.queue_purge(env.queue)


# -- apply_async throughput -------------------------------------------------------------------


def apply_async_rates(kind: str, broker: str, valkey: EmbeddedServer, n: int, reps: int) -> dict[str, Any]:
    """Calls per second of ``send_task(countdown=3h)``, plugin and native in short alternating blocks.

    On a shared machine the load changes within seconds: blocks of ``BLOCK`` calls, plugin and
    native back to back (in alternating order), let each pair see the same load. The ratio is the
    median of the pairs' ratios; ``runs`` are the per-``n`` rates as before.
    """
    env = CeleryRun.on(kind, broker, valkey)
    plugin, native = env.app(), env.native_app()
    ways = {"plugin": plugin, "native": native}
    rates: dict[str, list[float]] = {"plugin": [], "native": []}
    cpu: dict[str, list[float]] = {"plugin": [], "native": []}  # this process's CPU µs per call
    pairs: list[float] = []
    try:
        for app in (plugin, native):  # warm up: connections, pools, scripts
            app.send_task("dqb.record", args=["warm"], countdown=HOURS)
        for rep in range(reps):
            spent = {"plugin": 0.0, "native": 0.0}
            for block in range(max(1, n // BLOCK)):
                order = ("plugin", "native") if (rep + block) % 2 == 0 else ("native", "plugin")
                took = {name: _block(ways[name], BLOCK) for name in order}
                pairs.append(took["native"][0] / took["plugin"][0])
                for name, (seconds, cpu_seconds) in took.items():
                    spent[name] += seconds
                    cpu[name].append(cpu_seconds / BLOCK * 1e6)
            for name, seconds in spent.items():
                rates[name].append(round(max(1, n // BLOCK) * BLOCK / seconds))
            purge(env)
    finally:
        forget_store(plugin)
        env.delete_queue()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "runs": rates,
        "median": medians,
        "ratio": round(statistics.median(pairs), 3),
        "pairs": len(pairs),
        "cpu_us_per_call": {k: round(statistics.median(v)) for k, v in cpu.items()},
    }


#: calls per block of the alternating apply_async measurement
BLOCK = 200


def _block(app: Any, n: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``n`` calls. CPU time is what the call costs the producer, and the
    load of the other processes sways it less than the wall time, which includes waiting."""
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        app.send_task("dqb.record", args=["tp", i], kwargs={"k": "v"}, countdown=HOURS)
    return time.perf_counter() - started, time.process_time() - cpu


# -- lateness ---------------------------------------------------------------------------------


def lateness(kind: str, broker: str, valkey: EmbeddedServer, n: int, spread: float) -> dict[str, Any]:
    """Task start − eta for ``n`` tasks falling due over ``spread`` seconds, each way."""
    out = {name: distribution(_lateness_run(name, CeleryRun.on(kind, broker, valkey), n, spread)) for name in WAYS}
    for name in WAYS:
        log(f"{kind} lateness {name}: {fmt_dist(out[name])}")
    return out


def _lateness_run(name: str, env: CeleryRun, n: int, spread: float) -> list[float]:
    with running(env, forwarder=name == "plugin"):
        app = env.app() if name == "plugin" else env.native_app()
        rng = random.Random(1)
        for i in range(n):
            app.send_task("dqb.record", args=["late", i], countdown=1 + rng.uniform(0, spread))
        wait_for(lambda: len(env.records()) >= n, 60 + spread, f"{n} {name} tasks to run", interval=POLL)
        forget_store(app)
        return [r["started_ms"] - _eta_ms(r) for r in env.records() if r["tag"] == "late"]


def _eta_ms(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["eta"]).timestamp() * 1000


# -- worker memory ----------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def held_by_worker(app: Any) -> int | None:
    """ETA tasks the worker holds in memory (its ``inspect scheduled`` list), None if it does not say."""
    try:
        return sum(len(v) for v in (app.control.inspect(timeout=10).scheduled() or {}).values())
    except Exception as exc:  # a reply of 100k entries may not make it back in time
        log(f"inspect scheduled failed: {exc}")
        return None


def worker_rss(broker: str, valkey: EmbeddedServer, sizes: list[int]) -> dict[str, Any]:
    """Worker RSS (MB) before and after ``size`` tasks are scheduled 3 h ahead, each way."""
    out: dict[str, Any] = {}
    for name in WAYS:
        for size in sizes:
            out[f"{name}_{size}"] = _rss_run(name, CeleryRun.on("redis", broker, valkey), size)
            log(f"rss {name} {size}: {out[f'{name}_{size}']}")
    return out


def _rss_run(name: str, env: CeleryRun, size: int) -> dict[str, Any]:
    with running(env, forwarder=False):
        app = env.app() if name == "plugin" else env.native_app()
        pid = env.processes.procs[0].pid
        before = rss_mb(pid)
        for i in range(size):
            app.send_task("dqb.record", args=["rss", i], countdown=HOURS)
        queue = redis.Redis.from_url(env.broker)
        wait_for(lambda: queue.llen(env.queue) == 0, 600, "the worker to take every native task", interval=POLL)
        env.wait_ready(env.processes.procs[0])  # the worker has caught up with its queue
        held = held_by_worker(app)
        forget_store(app)
        return {"before": before, "after": rss_mb(pid), "held_by_worker": held}


# -- duplicates past visibility_timeout -------------------------------------------------------


def duplicates(broker: str, valkey: EmbeddedServer, n: int, countdown: float, visibility: float) -> dict[str, Any]:
    """Executions per task when countdowns outlast the Redis transport's visibility timeout."""
    out: dict[str, Any] = {}
    for name in WAYS:
        env = CeleryRun.on("redis", broker, valkey)
        # kombu scans for unacked messages every unacked_restore_interval (10 s) x throttle (10)
        # calls; a 1 s scan shows in seconds what its defaults show after ~100 s more.
        env.transport_options = {
            "visibility_timeout": visibility,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
        executions = _duplicates_run(name, env, n, countdown, visibility)
        out[name] = {"tasks": n, "executions": executions, "duplicates": executions - n}
        log(f"duplicates {name}: {out[name]}")
    return out


def _duplicates_run(name: str, env: CeleryRun, n: int, countdown: float, visibility: float) -> int:
    with running(env, forwarder=name == "plugin"):
        app = env.app() if name == "plugin" else env.native_app()
        ids = {app.send_task("dqb.record", args=["dup", i], countdown=countdown).id for i in range(n)}
        wait_for(
            lambda: ids <= {r["id"] for r in env.records()}, countdown + 60, f"every {name} task once", interval=POLL
        )
        time.sleep(visibility)  # copies restored after the first runs get the time to run too
        forget_store(app)
        return sum(1 for r in env.records() if r["tag"] == "dup")


# -- report -----------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    rows = []
    for kind, res in report["brokers"].items():
        a = res["apply_async"]
        rows.append(
            f"| apply_async(countdown) calls/s, {kind} | {a['median']['plugin']:,.0f} | "
            f"{a['median']['native']:,.0f} | {a['ratio']:.2f} (median of {a.get('pairs', 1)} paired blocks) |"
        )
        c = a.get("cpu_us_per_call")
        if c:
            rows.append(
                f"| apply_async(countdown) CPU µs per call (median per block), {kind} | {c['plugin']} | "
                f"{c['native']} | {c['native'] / c['plugin']:.2f} |"
            )
        late = res.get("lateness")
        for q in ("p50", "p99", "max") if late else ():
            rows.append(
                f"| lateness {q} (start − eta), {kind} | {late['plugin'][q]:g} ms | {late['native'][q]:g} ms | — |"
            )
    rss = report.get("rss", {})
    for size in sorted({int(key.split("_")[1]) for key in rss}):
        cells = [_rss_cell(rss[f"{name}_{size}"]) for name in WAYS]
        rows.append(f"| worker RSS, {size:,} tasks scheduled 3 h ahead | {cells[0]} | {cells[1]} | — |")
    dup = report.get("duplicates")
    if dup:
        rows.append(
            f"| duplicates, {dup['plugin']['tasks']} tasks, countdown {report['dup_countdown']:g} s > "
            f"visibility_timeout {report['dup_visibility']:g} s (restore scan every 1 s) | "
            f"{dup['plugin']['duplicates']} | {dup['native']['duplicates']} | — |"
        )
    head = (
        f"\n## Celery, {report['started']} ({report['mode']}, code {report['code']}, Celery {report['celery']}, "
        f"kombu {report['kombu']})\n\n| figure | plugin | native ETA | ratio |\n|---|---:|---:|---|\n"
    )
    details = "\n".join(
        f"- {kind} apply_async runs (calls/s): plugin {res['apply_async']['runs']['plugin']}, "
        f"native {res['apply_async']['runs']['native']}"
        + (
            f"; lateness plugin {fmt_dist(res['lateness']['plugin'])}, native {fmt_dist(res['lateness']['native'])}"
            if "lateness" in res
            else ""
        )
        for kind, res in report["brokers"].items()
    )
    start, end = report.get("loadavg_start", "?"), report.get("loadavg_end", "?")
    load = f"- load average (1 min) {start} at start, {end} at end\n"
    return head + "\n".join(rows) + "\n\n" + details + "\n" + load


def _rss_cell(value: dict[str, Any]) -> str:
    held = "?" if value["held_by_worker"] is None else f"{value['held_by_worker']:,}"
    return f"{value['before']} → {value['after']} MB ({held} held)"


def run(quick: bool, apply_async_only: bool = False) -> dict[str, Any]:
    import celery
    import kombu

    report: dict[str, Any] = {
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": ("quick" if quick else "full") + (", apply_async only" if apply_async_only else ""),
        "code": code_digest(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "brokers": {},
        "loadavg_start": round(os.getloadavg()[0], 2),
    }
    with EmbeddedServer() as valkey:
        brokers = {"redis": f"{valkey.url.rsplit('/', 1)[0]}/1"}
        problem = amqp_problem(AMQP_URL)
        if problem is None:
            brokers["rabbitmq"] = AMQP_URL
        else:
            log(f"RabbitMQ not reachable ({problem}): Redis broker only")
        for kind, url in brokers.items():
            log(f"{kind}: apply_async throughput")
            res = {"apply_async": apply_async_rates(kind, url, valkey, 1000 if quick else 3000, 3 if quick else 5)}
            log(f"{kind}: {res['apply_async']['median']} ratio {res['apply_async']['ratio']}")
            report["brokers"][kind] = res
            if apply_async_only:
                continue
            res["lateness"] = lateness(kind, url, valkey, 300 if quick else 1000, 4 if quick else 8)
        if apply_async_only:
            report["loadavg_end"] = round(os.getloadavg()[0], 2)
            return report
        report["rss"] = worker_rss(brokers["redis"], valkey, [10_000] if quick else [10_000, 100_000])
        report["dup_countdown"], report["dup_visibility"] = (14, 5) if quick else (25, 10)
        report["duplicates"] = duplicates(
            brokers["redis"], valkey, 100 if quick else 200, report["dup_countdown"], report["dup_visibility"]
        )
    report["loadavg_end"] = round(os.getloadavg()[0], 2)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, about 2 minutes")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument(
        "--apply-async-only", action="store_true", help="only the apply_async calls/s, plugin vs native (~1 min)"
    )
    args = parser.parse_args(argv)
    report = run(args.quick, args.apply_async_only)
    print(json.dumps(report, indent=2))
    if not args.no_results:
        write_results(RESULTS_PATH, markdown(report))
        log(f"appended to {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
