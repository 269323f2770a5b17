#!/usr/bin/env python
"""Periodic Celery entries without ``celery beat``: fires per period and duplicates, through kills.

Run ``python bench/periodic.py`` (about 2 min) or ``--quick`` (about 40 s). It starts its own
Valkey (delay store, Redis broker, sink), a ``celery worker`` and N ``celery -A … delayq forward``
processes (no beat) with one entry every ``--every`` seconds (``run_all`` misfires, so each
period must run exactly once), and SIGKILLs a random forwarder K times (restarting it at once).
With ``--broker rabbitmq`` the tasks go through the RabbitMQ at 127.0.0.1:5672 instead.

It reports, per period from the first to the last one fired: how many ran once, twice (or
more), or not at all, and each run's start minus its period's time. JSON goes to stdout,
progress to stderr, and a section is appended to bench/RESULTS.md (unless ``--no-results``).

This file is also the Celery app module the subprocesses load (``celery -A periodic``), built
from ``DQB_*`` variables; it imports no test module.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
from lib.brokers import AMQP_URL
from lib.processes import Processes
from lib.report import RESULTS_PATH, log, write_results


def _app_from_env() -> Any:
    """The subprocesses' app: one entry, ``tick``, recording each run on the sink."""
    from celery import Celery

    from delayq_backends.celery import install

    env = os.environ
    app = Celery("dqb")
    app.conf.update(
        broker_url=env["DQB_BROKER"],
        delayq_url=env["DQB_STORE"],
        delayq_prefix=env["DQB_PREFIX"],
        delayq_shards=4,
        task_default_queue=env["DQB_QUEUE"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "tick": {
                "task": "dqb.tick",
                "schedule": float(env["DQB_EVERY"]),
                "options": {"delayq_misfire": "run_all"},
            }
        },
    )
    install(app)
    sink = redis.Redis.from_url(env["DQB_STORE"])

    @app.task(bind=True, name="dqb.tick")  # type: ignore[untyped-decorator]
    def tick(self: Any) -> None:
        sink.rpush(env["DQB_SINK"], json.dumps({"id": self.request.id, "started_ms": time.time_ns() // 1_000_000}))

    return app


app = _app_from_env() if "DQB_STORE" in os.environ else None


# -- the run ------------------------------------------------------------------------------------


class Run:
    """The processes of one run and their logs."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = env, tmp
        self.processes = Processes(grace=20)

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return self.processes.procs

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "celery", "-A", "periodic", *args]
        return self.processes.start(command, env=self.env, log=self.tmp / f"{name}.log")

    def forwarder(self, name: str, lease: float) -> subprocess.Popen[bytes]:
        return self.start(name, "delayq", "forward", "--poll", "0.2", "--lease", str(lease), "--log-every", "30")

    def stop(self) -> None:
        self.processes.stop()


def _environment(url: str, broker: str, every: float) -> dict[str, str]:
    """The subprocesses' variables (also set here, for this process's app): a fresh prefix,
    queue and sink on the Valkey at ``url``."""
    base = url.rsplit("/", 1)[0]
    tag = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "DQB_BROKER": f"{base}/1" if broker == "redis" else AMQP_URL,
        "DQB_STORE": f"{base}/0",
        "DQB_PREFIX": f"dqb{tag}",
        "DQB_QUEUE": f"dqb-{tag}",
        "DQB_SINK": f"dqb:{tag}:runs",
        "DQB_EVERY": str(every),
    }
    os.environ.update({k: v for k, v in env.items() if k.startswith("DQB_")})
    return env


def measure_beats(broker: str, beats: int, seconds: float, every: float) -> dict[str, Any]:
    """The peer: ``beats`` plain ``celery beat`` processes (what running beat on more than one
    host for availability gives) and a worker, for ``seconds``: runs against periods."""
    from delayq_backends.embedded import EmbeddedServer

    with EmbeddedServer() as valkey:
        env = _environment(valkey.url, broker, every)
        run = Run(env, Path(tempfile.mkdtemp(prefix="dqb-beat-")))
        try:
            run.start("worker", "worker", "-P", "threads", "-c", "4", "-Q", env["DQB_QUEUE"], "--without-gossip")
            for i in range(beats):
                run.start(f"beat-{i}", "beat", "-s", str(run.tmp / f"beat-{i}.db"), "--loglevel", "WARNING")
            time.sleep(seconds)
            for proc in run.procs[1:]:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
            time.sleep(3 * every)
            runs = redis.Redis.from_url(env["DQB_STORE"]).llen(env["DQB_SINK"])
        finally:
            run.stop()
    periods = int(seconds / every)
    return {"beats": beats, "seconds": seconds, "periods": periods, "runs": runs, "load_avg": os.getloadavg()[0]}


def measure(broker: str, forwarders: int, seconds: float, kills: int, every: float, lease: float) -> dict[str, Any]:
    from delayq_backends.celery import store_for
    from delayq_backends.celery.periodic import item_id, statuses
    from delayq_backends.embedded import EmbeddedServer
    from delayq_backends.periodic.schedules import Period, run_task_id

    with EmbeddedServer() as valkey:
        env = _environment(valkey.url, broker, every)
        client = _app_from_env()
        store = store_for(client)
        sink = redis.Redis.from_url(env["DQB_STORE"])
        run = Run(env, Path(tempfile.mkdtemp(prefix="dqb-periodic-")))
        rng = random.Random(7)
        try:
            run.start("worker", "worker", "-P", "threads", "-c", "4", "-Q", env["DQB_QUEUE"], "--without-gossip")
            alive = [run.forwarder(f"forwarder-{i}", lease) for i in range(forwarders)]
            deadline = time.monotonic() + 60
            while store.get(item_id("tick")) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no forwarder synced the entry; logs in {run.tmp}")
                time.sleep(0.1)
            start = time.monotonic()
            hits = 0
            for k in range(kills):
                time.sleep(max(0.0, start + seconds * (k + 1) / (kills + 1) - time.monotonic()))
                # aim at a firing: just after the entry's next period, when a forwarder claims it
                due = store.get(item_id("tick"))
                if due is not None:
                    time.sleep(max(0.0, due.ready_ms / 1000 + rng.uniform(0, 0.02) - time.time()))
                i = rng.randrange(len(alive))
                alive[i].send_signal(signal.SIGKILL)
                alive[i].wait()
                time.sleep(0.3)  # a live forwarder fires in milliseconds: a lease held now is the dead one's
                held = store.get(item_id("tick"))
                hit = held is not None and held.leased_until_ms is not None
                hits += hit
                log(f"SIGKILLed forwarder {i}{' while it held the entry' if hit else ''}; restarting it")
                alive[i] = run.forwarder(f"forwarder-{i}-{k}", lease)
            time.sleep(max(0.0, start + seconds - time.monotonic()))
            for proc in alive:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
            [status] = statuses(store)
            deadline = time.monotonic() + 60
            while sink.llen(env["DQB_SINK"]) < status.runs and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2 * every)  # a duplicate would arrive now too
            current = store.get(item_id("tick"))
            assert current is not None
            step = round(every * 1000)
            slots = {
                run_task_id("tick", Period(str(at), at)): at
                for at in range(current.ready_ms - step * 5000, current.ready_ms, step)
            }
            records = [json.loads(r) for r in sink.lrange(env["DQB_SINK"], 0, -1)]
        finally:
            run.stop()
    per_period: dict[int, list[int]] = {}
    for r in records:
        at = slots[r["id"]]
        per_period.setdefault(at, []).append(int(r["started_ms"]) - at)
    first, last = min(per_period), max(per_period)
    periods = range(first, last + step, step)
    counts = [len(per_period.get(at, [])) for at in periods]
    late = sorted(min(v) for v in per_period.values())
    return {
        "broker": broker,
        "forwarders": forwarders,
        "seconds": seconds,
        "kills": kills,
        "kills_mid_fire": hits,
        "every_s": every,
        "lease_s": lease,
        "periods": len(counts),
        "ran_once": sum(c == 1 for c in counts),
        "duplicates": sum(max(0, c - 1) for c in counts),
        "missing": sum(c == 0 for c in counts),
        "runs_in_store": status.runs,
        "start_after_period_ms": {"p50": late[len(late) // 2], "p99": late[int(len(late) * 0.99)], "max": late[-1]},
        "load_avg": os.getloadavg()[0],
    }


def markdown(report: dict[str, Any], when: str) -> str:
    late = report["start_after_period_ms"]
    return (
        f"## Periodic entries without beat, {when} (`bench/periodic.py`)\n\n"
        f"{report['forwarders']} `celery -A … delayq forward` + 1 worker, no `celery beat`, broker "
        f"{report['broker']}; one entry every {report['every_s']:g} s (run_all), {report['seconds']:g} s, "
        f"{report['kills']} SIGKILLs of a random forwarder just after a period's time (restarted at once; "
        f"{report['kills_mid_fire']} of them while it held the entry), lease {report['lease_s']:g} s; "
        f"load average {report['load_avg']:.1f}.\n\n"
        "| periods | ran once | duplicates | missing | start − period p50 / p99 / max |\n|---:|---:|---:|---:|---|\n"
        f"| {report['periods']} | {report['ran_once']} | {report['duplicates']} | {report['missing']} | "
        f"{late['p50']} / {late['p99']} / {late['max']} ms |\n" + _peer_markdown(report.get("peer"))
    )


def _peer_markdown(peer: dict[str, Any] | None) -> str:
    if not peer:
        return ""
    return (
        f"\nPeer, same run: {peer['beats']} plain `celery beat` processes (beat on two hosts for availability) "
        f"and a worker, {peer['seconds']:g} s, no kills: **{peer['runs']} runs for about {peer['periods']} "
        f"periods** (load average {peer['load_avg']:.1f}).\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 s, 3 kills")
    parser.add_argument("--broker", choices=["redis", "rabbitmq"], default="redis")
    parser.add_argument("--forwarders", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--kills", type=int, default=None)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--beats", type=int, default=2, help="the peer: this many celery beat processes (0: none)")
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    seconds = args.seconds or (30.0 if args.quick else 100.0)
    kills = args.kills if args.kills is not None else (3 if args.quick else 12)
    report = measure(args.broker, args.forwarders, seconds, kills, args.every, args.lease)
    if args.beats:
        log(f"peer: {args.beats} celery beat processes for {seconds:g} s")
        report["peer"] = measure_beats(args.broker, args.beats, seconds, args.every)
    print(json.dumps(report, indent=2))
    if not args.no_results:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        write_results(RESULTS_PATH, markdown(report, when))
    return 0 if report["duplicates"] == 0 and report["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
