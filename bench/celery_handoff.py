#!/usr/bin/env python
"""Forwarding rate into a Celery Redis broker: the exactly-once hand-off against publish-then-ack.

``python bench/celery_handoff.py`` starts one Valkey, captures one Celery task message with the
plugin, and then, round after round, stores ``--items`` copies of it due now and drains them with
one in-process ``Forwarder`` at ``--batch``: once with the broker on the store's own database
(publish and ack in one MULTI/EXEC), once with the broker in another database of the same server
(kombu's pipelined batch publish, then the ack: the path every other broker takes). Same server,
same process, alternating rounds, so load from elsewhere falls on both alike. No worker runs:
this is the forwarder's rate into the broker. Prints the median items/s of each mode with its
spread, their ratio and the load average, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from celery import Celery  # noqa: E402

from delayq_backends import Config, DelayStore  # noqa: E402
from delayq_backends.celery import CeleryTarget, forget_store, install, store_for  # noqa: E402
from delayq_backends.connection import connect  # noqa: E402
from delayq_backends.embedded import EmbeddedServer  # noqa: E402
from delayq_backends.forwarder import Forwarder  # noqa: E402


def template(store_url: str, prefix: str, queue: str) -> bytes:
    """One stored Celery task message (its envelope), captured by the plugin as in production."""
    app = Celery("bench", broker=store_url)
    app.conf.update(delayq_url=store_url, delayq_prefix=prefix, task_default_queue=queue)
    install(app)
    result = app.send_task("bench.noop", args=[1, "x" * 100], countdown=3600)
    item = store_for(app).get(result.id)
    assert item is not None
    store_for(app).cancel(result.id)
    forget_store(app)
    return item.envelope


def rate(store_url: str, broker_url: str, envelope: bytes, queue: str, items: int, batch: int) -> tuple[float, float]:
    """Items/s for one drain of ``items`` copies of ``envelope`` into ``queue`` on ``broker_url``,
    and the forwarder's CPU µs per item (steadier than the rate on a loaded machine)."""
    prefix = "hb" + uuid.uuid4().hex[:10]
    store = DelayStore(connect(store_url), Config(prefix=prefix, shards=16))
    store.schedule_many((f"i{n}", 0, envelope) for n in range(items))
    target = CeleryTarget.from_url(broker_url)
    forwarder = Forwarder(store, [target], batch=batch)
    acked_after = 0  # by the forwarder after the publish, not inside the hand-off's EXEC
    real_ack = store.ack

    def ack(claim: Any, ids: Any = None) -> int:
        nonlocal acked_after
        acked_after += len(ids or [])
        return real_ack(claim, ids)

    store.ack = ack  # type: ignore[method-assign]
    started, cpu, moved = time.perf_counter(), time.process_time(), 0
    while moved < items:
        moved += forwarder.run_once()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    broker = redis.Redis.from_url(broker_url)
    landed = broker.llen(queue)
    broker.delete(queue)
    target.close()
    assert landed == items, f"{landed} of {items} in the broker"
    expected = 0 if broker_url == store_url else items
    assert acked_after == expected, f"{acked_after} acked after the publish, expected {expected}"
    return items / elapsed, cpu / items * 1e6


def summary(rates: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(rates)), "min": round(min(rates)), "max": round(max(rates))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with EmbeddedServer() as server:
        base = server.url.rsplit("/", 1)[0]
        same, other = f"{base}/0", f"{base}/1"
        queue = "bench-" + uuid.uuid4().hex[:6]
        envelope = template(same, "tpl" + uuid.uuid4().hex[:6], queue)
        load_before = os.getloadavg()
        runs: dict[str, list[float]] = {"handoff": [], "publish_then_ack": []}
        cpu: dict[str, list[float]] = {"handoff": [], "publish_then_ack": []}
        for _ in range(args.rounds):
            for mode, broker in (("handoff", same), ("publish_then_ack", other)):
                items_s, cpu_us = rate(same, broker, envelope, queue, args.items, args.batch)
                runs[mode].append(items_s)
                cpu[mode].append(cpu_us)
        load_after = os.getloadavg()
    result = {
        "items": args.items,
        "batch": args.batch,
        "rounds": args.rounds,
        **{mode: summary(r) for mode, r in runs.items()},
        "cpu_us_per_item": {mode: summary(c) for mode, c in cpu.items()},
        "ratio": round(statistics.median(runs["handoff"]) / statistics.median(runs["publish_then_ack"]), 2),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
