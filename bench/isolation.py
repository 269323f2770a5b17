#!/usr/bin/env python
"""Issue 21, findings 3 and 4, measured: what one bad item and one wrong password cost.

Run ``python bench/isolation.py`` (about 1 min; needs ``rabbitmqctl`` and the RabbitMQ at
127.0.0.1:5672). It starts its own Valkey and:

- bad item: schedules 200 RQ jobs and one cron job whose year field has no later match (its last
  weekday made due now), runs one forwarder pass, and counts the jobs moved, retried and dead;
- wrong password: adds a RabbitMQ user, schedules 100 Celery tasks and one periodic entry
  (every second), and forwards for ``--seconds`` with a wrong password in the broker URL: the
  attempts counted on those items and the dead letters. The user is deleted at the end.

JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import redis
from celery import Celery

from delayq_backends import Config, DelayStore
from delayq_backends.celery import CeleryTarget, install
from delayq_backends.celery.periodic import PeriodicTarget, item_id, sync
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget, Scheduler


def bad_item(conn: redis.Redis) -> dict[str, Any]:
    store = DelayStore(conn, Config(prefix="bad", shards=4))
    queue = Queue("bad-q", connection=conn, delay_store=store)
    last_weekday = datetime(2025, 12, 31, 8).timestamp()
    Scheduler(queue.name, connection=conn, delay_store=store, clock=lambda: last_weekday).cron(
        "0 9 * * 1-5 2025", "os.getpid"
    )
    for _ in range(200):
        queue.enqueue_in(timedelta(0), "os.getpid")
    forwarder = Forwarder(store, [RQTarget(conn)], batch=500)
    forwarder.run_once()
    return {
        "jobs": 201,
        "moved": conn.llen(f"rq:queue:{queue.name}"),
        "retried": forwarder.stats.retried,
        "dead_letters": len(store.dead_letters()),
    }


def wrong_password(port: int, seconds: float) -> dict[str, Any]:
    user = f"dq-bench-{uuid.uuid4().hex[:6]}"
    subprocess.run(["rabbitmqctl", "-q", "add_user", user, "right"], check=True)
    try:
        url = f"amqp://{user}:wrong@127.0.0.1:5672//"
        app = Celery("bench", broker=url, set_as_current=False)
        app.conf.update(delayq_url=f"redis://127.0.0.1:{port}/0", delayq_prefix="pw", delayq_shards=4)
        app.conf.beat_schedule = {"tick": {"task": "t.tick", "schedule": 1.0}}
        install(app)
        store = DelayStore(redis.Redis(port=port), Config(prefix="pw", shards=4))
        sync(app, store)
        ids = [app.send_task("t.x", countdown=0.1).id for _ in range(100)]
        target = CeleryTarget.from_url(url)
        forwarder = Forwarder(store, [target, PeriodicTarget(target)])
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            forwarder.run_once()
            time.sleep(0.2)
        items = [store.get(i) for i in [*ids, item_id("tick")]]
        return {
            "seconds": seconds,
            "items": len(items),
            "attempts": sum(i.attempts for i in items if i is not None),
            "dead_letters": len(store.dead_letters()),
            "still_waiting": sum(i is not None for i in items),
        }
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_user", user], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with EmbeddedServer() as server:
        conn = redis.Redis(port=server.port)
        print(json.dumps({"bad_item": bad_item(conn), "wrong_password": wrong_password(server.port, args.seconds)}))


if __name__ == "__main__":
    main()
