#!/usr/bin/env python
"""Celery tasks released into RabbitMQ: ``celery -A … delayq forward`` against kombu itself.

``python bench/target_rabbitmq.py [--quick]`` starts a Valkey (the delay store), captures one
Celery task message with the plugin, and in rounds, each way in turn:

- **kombu, no confirms**: ``Producer.publish`` of N copies of that message, as Celery sends it;
- **kombu, streamed confirms**: the same on a confirm-mode channel, then every confirm read;
- **delayq forward**: the ``celery -A lib.celery_app delayq forward`` process releasing N copies
  that fall due at once (with publisher confirms, as always);

each timed until RabbitMQ's queue holds all N. Then a lateness step: tasks fall due at 5,000/s
and a consumer notes when each arrives against its eta. Prints a markdown table (medians with
min–max, delayq over each native, the load average). RabbitMQ at 127.0.0.1:5672
(``DELAYQ_TEST_AMQP_URL`` overrides it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kombu import Connection, Producer
from lib.brokers import AMQP_URL, amqp_problem
from lib.celery_target import Bench, Rates, eta_ms, sizes, table
from lib.report import log

from delayq_backends import Envelope
from delayq_backends.celery import StoredMessage
from delayq_backends.embedded import EmbeddedServer

LATE_PER_SECOND = 5_000
NATIVE = "kombu, no confirms"
STREAMED = "kombu, streamed confirms"
DELAYQ = "celery -A … delayq forward"


def queue_tools(broker: str, queue: str) -> tuple[Callable[[], int], Callable[[], None]]:
    conn = Connection(broker)
    channel = conn.channel()
    channel.queue_declare(queue=queue, durable=True, auto_delete=False)  # as Celery declares it

    def depth() -> int:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)

    def purge() -> None:
        channel.queue_purge(queue)

    return depth, purge


def publisher(broker: str, envelope: bytes, *, confirms: bool) -> Callable[[int], None]:
    """Publish n copies of the task as Celery does (its queue declared with each publish);
    with ``confirms``, on a confirm-mode channel, reading the broker's acks once all are out."""
    kwargs = StoredMessage.from_envelope(Envelope.decode(envelope)).publish_kwargs(ready_ms=0)
    conn = Connection(broker)
    channel = conn.channel()
    producer = Producer(channel, auto_declare=False)
    acked = [0]
    if confirms:
        channel.confirm_select()
        channel.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, tag))

    def publish(n: int) -> None:
        sent = acked[0]
        for _ in range(n):
            producer.publish(**kwargs)
        while confirms and acked[0] < sent + n:
            conn.drain_events(timeout=10)

    publish(1)  # connected and declared before the clock runs (timed() empties the queue first)
    return publish


def consumer(broker: str, queue: str) -> Callable[[int, float], list[float]]:
    """Read n messages (no ack, pushed by RabbitMQ as they come); each one's read time − eta."""

    def consume(n: int, deadline: float) -> list[float]:
        late: list[float] = []
        with Connection(broker) as conn:
            channel = conn.channel()
            channel.basic_qos(0, 1000, False)

            def take(message: Any) -> None:
                late.append(time.time() * 1000 - eta_ms(message.headers["eta"]))

            channel.basic_consume(queue, no_ack=True, callback=take)
            while len(late) < n and time.time() < deadline:
                try:
                    conn.drain_events(timeout=1)
                except TimeoutError:
                    continue
        return late

    return consume


def main() -> None:
    args = sizes(__doc__.splitlines()[1] if __doc__ else "")
    problem = amqp_problem(AMQP_URL)
    if problem:
        raise SystemExit(f"RabbitMQ at {AMQP_URL} is not reachable ({problem})")
    rates = Rates()
    with EmbeddedServer() as valkey, Bench.on("rabbitmq", AMQP_URL, valkey, args.queue_prefix, queue_tools) as bench:
        ways = {
            NATIVE: publisher(AMQP_URL, bench.envelope, confirms=False),
            STREAMED: publisher(AMQP_URL, bench.envelope, confirms=True),
        }
        bench.start_forwarder(*args.forward_arg)
        for n in range(args.rounds):
            log(f"round {n + 1} of {args.rounds}")
            for way, publish in ways.items():
                rates.add(way, bench.timed(args.items, publish))
            rates.add(DELAYQ, bench.released(args.items))
        log(f"lateness: {LATE_PER_SECOND:,}/s for {args.late_seconds:g} s")
        late = bench.lateness(LATE_PER_SECOND, args.late_seconds, consumer(AMQP_URL, bench.run.queue))
    print(table("Celery tasks into RabbitMQ", args, rates, [(DELAYQ, NATIVE), (DELAYQ, STREAMED)], late))


if __name__ == "__main__":
    main()
