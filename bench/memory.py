#!/usr/bin/env python
"""Memory per waiting item, envelope format 1 (delayq_backends <= s3-start) against format 2.

Run ``python bench/memory.py [--items N] [--url redis://...]``. For each kind (a realistic
Celery task message, an RQ job, a 100-byte list body) and each format it schedules N items into
a fresh prefix of 16 shards, on a Valkey server this script starts (``EmbeddedServer``) or the
server at ``--url`` (only its own keys are written and deleted), and reports per item: the INFO
``used_memory`` delta (meaningful on an otherwise idle server only), the ``MEMORY USAGE`` of the
shards' ``due`` ZSETs and ``items`` HASHes, the envelope's length and the payload's. A second
pass stores 100 items per shard, under the listpack thresholds (128 ZSET entries), to show
what the small encodings would save. Prints a Markdown table and JSON.

"Payload" is what the item must carry anyway: a list item's body; for a Celery task the body
plus its headers and properties as kombu JSON (what the broker receives); for an RQ job nothing
(the job hash stays in RQ's Redis, the store keeps its id and queue).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import redis
from celery import Celery
from kombu.utils.json import dumps as kombu_json_dumps

from delayq_backends import Config, DelayStore, Envelope
from delayq_backends.celery.message import StoredMessage
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.keys import meta_key
from delayq_backends.rq.jobs import job_envelope
from delayq_backends.targets import RedisListTarget
from delayq_backends.timeutil import from_ms

SHARDS = 16
TARGET_OVERHEAD = 100


class _Capture:
    def publish(self, body: object, **kwargs: object) -> None:
        self.body, self.kwargs = body, kwargs


def celery_message(app: Celery, task_id: str) -> StoredMessage:
    """A task message as Celery's sender builds it for ``send_email.apply_async(..., eta=...)``."""
    message = app.amqp.as_task_v2(
        task_id,
        "proj.tasks.send_email",
        args=("user@example.com",),
        kwargs={"template": "welcome", "user_id": 12345},
        eta=from_ms(1_800_000_000_000),
        reply_to=app.thread_oid,
        ignore_result=None,
    )
    capture = _Capture()
    app.amqp.send_task_message(capture, "proj.tasks.send_email", message, **app.amqp.router.route({}, "x"))
    return StoredMessage.capture(capture.body, capture.kwargs)


def format_1(envelope: Envelope, message: StoredMessage | None = None) -> bytes:
    """The envelope as delayq_backends wrote it up to tag s3-start (format 1)."""
    meta = dict(envelope.meta)
    if message is not None:
        details = kombu_json_dumps({"h": message.headers, "p": message.properties, "q": message.declare})
        meta = {
            "task": message.task,
            "ct": message.content_type,
            "ce": message.content_encoding,
            "x": message.exchange,
            "rk": message.routing_key,
            "k": details,
        }
    header = json.dumps(
        {"t": envelope.target, "d": envelope.destination, "m": meta}, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    return struct.pack(">2sBI", b"DQ", 1, len(header)) + header + envelope.body


@dataclass
class Row:
    kind: str
    format: int
    items: int
    per_shard: int
    used_memory: float
    due_zset: float
    items_hash: float
    envelope: float
    payload: float
    overhead: float
    met: bool


def measure(url: str, kind: str, fmt: int, n: int, make: Callable[[str], tuple[bytes, int]]) -> Row:
    client = redis.Redis.from_url(url)
    store = DelayStore(client, Config(prefix=f"bench-memory-{os.getpid()}-{kind}{fmt}", shards=SHARDS))
    store.check_meta()
    ours = [key for shard in range(SHARDS) for key in store.keys(shard).all()]
    ids = [f"{j:08d}-4a0e-4c1d-9d63-{kind:>12}"[:36] for j in range(n)]  # uuid-sized ids
    made = [make(i) for i in ids]
    client.execute_command("MEMORY", "PURGE")
    before = int(client.info("memory")["used_memory"])
    store.schedule_many((i, 3600.0 + 1_800_000_000, data) for i, (data, _) in zip(ids, made))
    used = int(client.info("memory")["used_memory"]) - before
    due = items = 0
    for shard in range(SHARDS):
        keys = store.keys(shard)
        due += int(client.memory_usage(keys.due, samples=0) or 0)
        items += int(client.memory_usage(keys.items, samples=0) or 0)
    envelope = sum(len(d) for d, _ in made) / n
    payload = sum(p for _, p in made) / n
    client.delete(*ours, meta_key(store.config.prefix))
    client.close()
    return Row(kind, fmt, n, n // SHARDS, used / n, due / n, items / n, envelope, payload, used / n - payload,
               used / n - payload <= TARGET_OVERHEAD)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000, help="items per kind and format")
    parser.add_argument("--url", help="measure on this server instead of one started here")
    options = parser.parse_args()
    app = Celery("proj", set_as_current=False)
    app.conf.broker_url = "amqp://guest@127.0.0.1//"

    def celery(fmt: int) -> Callable[[str], tuple[bytes, int]]:
        def make(item_id: str) -> tuple[bytes, int]:
            message = celery_message(app, item_id)
            envelope = message.to_envelope()
            wire = len(message.body) + len(kombu_json_dumps({**message.headers, **message.properties}))
            return (envelope.encode() if fmt == 2 else format_1(envelope, message)), wire

        return make

    def rq(fmt: int) -> Callable[[str], tuple[bytes, int]]:
        envelope = job_envelope("default")
        return lambda _: (envelope.encode() if fmt == 2 else format_1(envelope), 0)

    def listed(fmt: int) -> Callable[[str], tuple[bytes, int]]:
        def make(item_id: str) -> tuple[bytes, int]:
            envelope = RedisListTarget.envelope("jobs:out", (item_id * 3)[:100].encode())
            return (envelope.encode() if fmt == 2 else format_1(envelope)), 100

        return make

    rows = []
    with ExitStack() as stack:
        url = options.url or stack.enter_context(EmbeddedServer()).url
        for n in (options.items, 100 * SHARDS):
            for kind, factory in (("celery", celery), ("rq", rq), ("list", listed)):
                for fmt in (1, 2):
                    rows.append(measure(url, kind, fmt, n, factory(fmt)))
                    print(f"{kind} format {fmt}, {n}: {rows[-1].used_memory:.0f} B/item", file=sys.stderr)
        info = redis.Redis.from_url(url).info("server")
    server = f"Valkey {info['valkey_version']}" if "valkey_version" in info else f"Redis {info['redis_version']}"
    print(f"{server}, {SHARDS} shards, load average {os.getloadavg()[0]:.1f}; bytes per waiting item\n")
    print("| kind | format | items (per shard) | used_memory | due ZSET | items HASH | envelope | payload "
          "| used − payload | ≤ +100 B |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.kind} | {r.format} | {r.items} ({r.per_shard}) | {r.used_memory:.0f} | {r.due_zset:.0f} | "
              f"{r.items_hash:.0f} | {r.envelope:.0f} | {r.payload:.0f} | {r.overhead:.0f} | "
              f"{'yes' if r.met else 'no'} |")  # fmt: skip
    print(json.dumps([asdict(r) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
