#!/usr/bin/env python
"""Celery tasks released into a Redis broker: ``celery -A … delayq forward`` against kombu itself.

``python bench/target_celery_redis.py [--quick]`` starts a Valkey (delay store and broker),
captures one Celery task message with the plugin, and in rounds, each way in turn:

- **kombu Producer.batch**: N copies of that message published as Celery sends them, in kombu's
  pipelined batches of 200;
- **delayq forward, hand-off**: the ``celery -A lib.celery_app delayq forward`` process with the
  broker in the store's own database, so each batch is published and acked in one MULTI/EXEC
  (exactly once);
- **delayq forward, other db**: the same with the broker in another database (kombu's batch
  publish, then the ack);

each timed until the broker's list holds all N. Then a lateness step: tasks fall due at
20,000/s (hand-off) and a consumer popping the list notes when each arrives against its eta.
Prints a markdown table (medians with min–max, delayq over the native, the load average).
It replaces the in-process ``bench/celery_handoff.py`` of earlier waves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack

import redis
from kombu import Connection, Producer
from lib.celery_target import Bench, Rates, eta_ms, sizes, table
from lib.report import log

from delayq_backends import Envelope
from delayq_backends.celery import StoredMessage
from delayq_backends.embedded import EmbeddedServer

LATE_PER_SECOND = 20_000
NATIVE = "kombu Producer.batch"
HANDOFF = "celery -A … delayq forward, hand-off"
OTHER_DB = "celery -A … delayq forward, other db"
BATCH = 200


def queue_tools(broker: str, queue: str) -> tuple[Callable[[], int], Callable[[], None]]:
    client = redis.Redis.from_url(broker)
    return lambda: int(client.llen(queue)), lambda: None if client.delete(queue) else None


def publisher(broker: str, envelope: bytes) -> Callable[[int], None]:
    """Publish n copies of the task as Celery does, ``BATCH`` to a kombu pipelined batch."""
    kwargs = StoredMessage.from_envelope(Envelope.decode(envelope)).publish_kwargs(ready_ms=0)
    producer = Producer(Connection(broker).channel(), auto_declare=False)

    def publish(n: int) -> None:
        for start in range(0, n, BATCH):
            with producer.batch(max_size=BATCH):
                for _ in range(min(BATCH, n - start)):
                    producer.publish(**kwargs)

    publish(1)  # connected and declared before the clock runs (timed() empties the queue first)
    return publish


def consumer(broker: str, queue: str) -> Callable[[int, float], list[float]]:
    """Pop n messages off kombu's list (oldest first, up to 500 a call); each read time − eta."""
    client = redis.Redis.from_url(broker)

    def consume(n: int, deadline: float) -> list[float]:
        late: list[float] = []
        while len(late) < n and time.time() < deadline:
            popped = client.rpop(queue, 500)
            if not popped:
                time.sleep(0.001)
                continue
            now = time.time() * 1000
            late += [now - eta_ms(json.loads(raw)["headers"]["eta"]) for raw in popped]
        return late

    return consume


def main() -> None:
    args = sizes(__doc__.splitlines()[1] if __doc__ else "")
    rates = Rates()
    with EmbeddedServer() as valkey, ExitStack() as stack:
        base = valkey.url.rsplit("/", 1)[0]
        benches = {
            HANDOFF: stack.enter_context(Bench.on("redis", f"{base}/0", valkey, args.queue_prefix, queue_tools)),
            OTHER_DB: stack.enter_context(Bench.on("redis", f"{base}/1", valkey, args.queue_prefix, queue_tools)),
        }
        native = benches[OTHER_DB]
        publish = publisher(native.run.broker, native.envelope)
        for bench in benches.values():
            bench.start_forwarder(*args.forward_arg)
        for n in range(args.rounds):
            log(f"round {n + 1} of {args.rounds}")
            rates.add(NATIVE, native.timed(args.items, publish))
            for way, bench in benches.items():
                rates.add(way, bench.released(args.items))
        log(f"lateness: {LATE_PER_SECOND:,}/s for {args.late_seconds:g} s")
        handoff = benches[HANDOFF]
        late = handoff.lateness(LATE_PER_SECOND, args.late_seconds, consumer(handoff.run.broker, handoff.run.queue))
    print(table("Celery tasks into a Redis broker", args, rates, [(HANDOFF, NATIVE), (OTHER_DB, NATIVE)], late))


if __name__ == "__main__":
    main()
