#!/usr/bin/env python
"""Cost of lossless mode (issue 15 item 3) to a forwarder: Celery tasks forwarded per second
with and without ``--lossless``.

Run ``python bench/lossless.py`` (about 1 min) or ``--quick``. It starts its own Valkey (the
delay store in db 0, kombu's Redis transport in db 1, so the forwarder publishes then settles,
as on any broker that is not the store's own database) and, per round and mode:

- schedules N Celery tasks through the plugin, waits until they are due, and times one
  ``Forwarder.run_until_idle()``: claim, publish, then ack (off) or keep (on: ``keep.lua``);
- on: marks every run started (``RunGuard.start``, as a worker with dedupe does at task start),
  waits out the window and times the second pass: claim, one pipelined ``EXISTS`` per item,
  delete. Its cost counts too: lossless mode touches every item twice.

Rounds alternate which mode goes first. JSON to stdout, a dated section appended to
bench/RESULTS.md with the load average at start and end (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import redis
from lib.celery_run import make_app
from lib.report import RESULTS_PATH, code_digest, log, write_results
from lib.waiting import wait_for

from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.target import CeleryTarget
from delayq_backends.dedupe import RunGuard
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder

#: Longer than one pass over the tasks, so no kept task comes due again within its own pass.
WINDOW_S = 10.0


def one_round(server: EmbeddedServer, n: int, lossless: bool) -> dict[str, float]:
    """Seconds of the forwarder's passes over ``n`` due tasks (``publish``; with lossless also
    ``confirm``, the pass that finds them started and deletes them)."""
    base, tag = server.url.rsplit("/", 1)[0], uuid.uuid4().hex[:8]
    app = make_app(
        broker=f"{base}/1",
        store=f"{base}/0",
        prefix=f"bl{tag}",
        queue=f"bl-{tag}",
        sink=f"bl:{tag}:sink",
        backend=f"{base}/2",
        records=f"{base}/0",
        transport_options={},
        dedupe=True,
    )
    store = store_for(app)
    ids = [app.send_task("dqb.record", args=["b", i], countdown=0.5).id for i in range(n)]
    wait_for(lambda: all(h is None or h <= store.server_time_ms() for h in store.heads()), 30, "due", interval=0.1)
    target = CeleryTarget.from_url(f"{base}/1")
    forwarder = Forwarder(store, [target], batch=200, lossless_window=WINDOW_S if lossless else None)
    out: dict[str, float] = {}
    try:
        start = time.perf_counter()
        stats = forwarder.run_until_idle()
        out["publish"] = time.perf_counter() - start
        assert stats.forwarded == n, stats
        if lossless:
            guard = RunGuard(store, ttl_ms=600_000)
            for task_id in ids:
                guard.start(task_id, 0)
            due = store.server_time_ms() + int(WINDOW_S * 1000)
            wait_for(lambda: store.server_time_ms() > due, WINDOW_S + 5, "the window to pass", interval=0.1)
            start = time.perf_counter()
            stats = forwarder.run_until_idle()
            out["confirm"] = time.perf_counter() - start
            assert stats.confirmed == n and stats.forwarded == 0, stats
        assert sum(s.scheduled for s in store.stats()) == 0
    finally:
        target.close()
        redis.Redis.from_url(f"{base}/1").flushdb()
        forget_store(app)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    n, rounds = (1000, 1) if args.quick else (4000, 3)
    report: dict[str, Any] = {"load_start": os.getloadavg(), "code": code_digest(), "quick": args.quick, "n": n}
    began = time.monotonic()
    off: list[float] = []
    on: list[dict[str, float]] = []
    with EmbeddedServer() as server:
        for r in range(rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                log(f"round {r + 1}: lossless {mode}")
                got = one_round(server, n, mode == "on")
                if mode == "on":
                    on.append(got)
                else:
                    off.append(got["publish"])
    report["off_s"] = off
    report["on_s"] = on
    report["load_end"] = os.getloadavg()
    report["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(report, indent=2))
    if not args.no_results:
        write_results(RESULTS_PATH, section(report))


def section(report: dict[str, Any]) -> str:
    n = report["n"]
    off = statistics.median(report["off_s"])
    publish = statistics.median(r["publish"] for r in report["on_s"])
    confirm = statistics.median(r["confirm"] for r in report["on_s"])
    load = [", ".join(f"{x:.2f}" for x in report[k]) for k in ("load_start", "load_end")]
    rates = lambda xs: ", ".join(f"{n / x:,.0f}" for x in xs)  # noqa: E731
    return (
        f"\n## Lossless mode: forwarder cost, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
        f"({'quick' if report['quick'] else 'full'}, code {report['code']}, {report['seconds']} s, "
        "`bench/lossless.py`)\n\n"
        f"Load average [{load[0]}] at start, [{load[1]}] at end (2 shared cores: other jobs ran too). One "
        f"forwarder (batch 200), {n:,} due Celery tasks, kombu's Redis transport in another database of the "
        "store's Valkey; tasks/s: median (rounds).\n\n"
        "| pass | lossless off | lossless on |\n|---|---:|---:|\n"
        f"| claim, publish, ack / keep | {n / off:,.0f} ({rates(report['off_s'])}) | {n / publish:,.0f} "
        f"({rates([r['publish'] for r in report['on_s']])}) |\n"
        f"| after the window: claim, EXISTS, delete | n/a | {n / confirm:,.0f} "
        f"({rates([r['confirm'] for r in report['on_s']])}) |\n"
        f"| forwarder time per task | {off / n * 1e6:.0f} µs | {(publish + confirm) / n * 1e6:.0f} µs "
        f"({((publish + confirm) / off - 1) * 100:+.0f} %) |\n\n"
        'Workers pay dedupe\'s record on top (one SET NX PX per task start: see "Worker-side dedupe"); '
        "memory: each task waits one window more in the store, about its envelope's size.\n"
    )


if __name__ == "__main__":
    main()
