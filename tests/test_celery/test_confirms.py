"""Streamed publisher confirms on a real RabbitMQ: a batch goes out without waiting, and each
message counts as published only when its own confirm came back.

Each test asserts what streaming must still guarantee per message: a message the broker
refused (or never confirmed) is never reported published, and every message reported
published is in the queue. Counting a whole batch as published once it was written, or
once one confirm arrived, fails them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from kombu import Connection, Consumer, Queue

from bench.lib.proxy import TcpProxy
from delayq_backends.celery import CeleryTarget, StoredMessage, wire
from delayq_backends.targets import Delivery, PublishReport
from tests.test_celery.harness import via


@pytest.fixture
def queue(rabbitmq_url: str) -> Iterator[str]:
    """A fresh queue name, deleted after the test (with any queue declared as ``<name>-…``)."""
    name = f"hcelery-confirms-{uuid.uuid4().hex[:8]}"
    yield name
    with Connection(rabbitmq_url) as conn:
        conn.default_channel.queue_delete(name)


def declare(url: str, queue: str, **arguments: Any) -> None:
    with Connection(url) as conn:
        conn.default_channel.queue_declare(queue, durable=False, auto_delete=False, arguments=arguments or None)


def delivery(
    item_id: str, queue: str, *, exchange: str = "", properties: dict[str, Any] | None = None, **headers: Any
) -> Delivery:
    """A Celery message for ``queue`` on the default exchange, declaring nothing (the test did)."""
    message = StoredMessage(
        "t.add", b"[[], {}, {}]", "application/json", "utf-8", {"id": item_id, **headers}, properties or {},
        exchange, queue,
    )  # fmt: skip
    return Delivery(item_id, message.to_envelope(), 0, 0)


def in_queue(url: str, queue: str) -> Counter[str]:
    """How many times each task id sits in ``queue`` (drained and acked)."""
    got: Counter[str] = Counter()

    def take(_: Any, message: Any) -> None:
        got[message.headers["id"]] += 1
        message.ack()

    with Connection(url) as conn, Consumer(conn, queues=[Queue(queue, no_declare=True)], callbacks=[take]):
        try:
            while True:
                conn.drain_events(timeout=1)
        except TimeoutError:
            return got


def publish(url: str, deliveries: list[Delivery]) -> PublishReport:
    target = CeleryTarget.from_url(url)
    try:
        return target.publish_many(deliveries)
    finally:
        target.close()


def test_a_refused_message_fails_alone_and_the_rest_are_published_once(rabbitmq_url: str, queue: str) -> None:
    """One message cannot be encoded (a header past 64 bits), one goes to an exchange that does
    not exist (found missing before the stream: a publish to it would close the channel under
    the messages behind it): both fail, every other one is confirmed and in the queue once."""
    declare(rabbitmq_url, queue)
    good = [f"ok{n}" for n in range(40)]
    batch = [delivery(i, queue) for i in good[:10]]
    batch.append(delivery("huge-header", queue, big=2**70))
    batch += [delivery(i, queue) for i in good[10:20]]
    batch.append(delivery("no-exchange", queue, exchange=f"{queue}-missing"))
    batch += [delivery(i, queue) for i in good[20:]]
    report = publish(rabbitmq_url, batch)
    failed = {f.id: f.error for f in report.failed}
    assert set(failed) == {"huge-header", "no-exchange"}, failed
    assert "NOT_FOUND" in failed["no-exchange"] and "missing" in failed["no-exchange"]
    assert sorted(report.published) == sorted(good) and report.unsent == []
    assert in_queue(rabbitmq_url, queue) == Counter(good), "each good message once, none lost"


def test_a_declaration_refused_after_another_was_accepted_fails_its_message_alone(
    rabbitmq_url: str, queue: str
) -> None:
    """The batch's queues are declared in turn; the last one's declaration is refused (it exists
    with other arguments) and the broker closes the channel. The messages for the queue declared
    before it are published on a new channel, not released as if the broker were down (the
    stream once used the closed channel). A pass publishing several shards in one call meets this."""
    clash = f"{queue}-clash"
    declare(rabbitmq_url, clash, **{"x-max-priority": 3})
    declared = [{"name": name, "exchange": {"name": ""}, "routing_key": name} for name in (queue, clash)]

    def to(item_id: str, n: int) -> Delivery:
        message = StoredMessage(
            "t.add", b"[]", "application/json", "utf-8", {"id": item_id}, {}, "", declared[n]["name"],
            [{**declared[n], "queue_arguments": {"x-max-priority": 10} if n else None}],
        )  # fmt: skip
        return Delivery(item_id, message.to_envelope(), 0, 0)

    good = [f"ok{n}" for n in range(3)]
    try:
        report = publish(rabbitmq_url, [to(i, 0) for i in good] + [to("clash", 1)])
    finally:
        with Connection(rabbitmq_url) as conn:
            conn.default_channel.queue_delete(clash)
    assert [f.id for f in report.failed] == ["clash"] and "PRECONDITION_FAILED" in report.failed[0].error
    assert report.published == good and report.unsent == [] and report.broker_error is None
    assert in_queue(rabbitmq_url, queue) == Counter(good)


def test_a_refusal_that_closes_the_channel_midstream_fails_that_message_alone(rabbitmq_url: str, queue: str) -> None:
    """A ``user_id`` that is not the connection's user: RabbitMQ closes the channel when it
    reaches that publish, dropping the ones written behind it, and names no message. That one
    fails; every other one is confirmed and in the queue (one the broker had taken but not
    confirmed when the channel closed may be there twice)."""
    declare(rabbitmq_url, queue)
    good = [f"ok{n}" for n in range(60)]
    batch = [delivery(i, queue) for i in good[:30]]
    batch.append(delivery("impostor", queue, properties={"user_id": "not-guest"}))
    batch += [delivery(i, queue) for i in good[30:]]
    report = publish(rabbitmq_url, batch)
    assert [f.id for f in report.failed] == ["impostor"]
    assert "PRECONDITION_FAILED" in report.failed[0].error
    assert sorted(report.published) == sorted(good) and report.unsent == []
    landed = in_queue(rabbitmq_url, queue)
    assert set(landed) == set(good), "every good message arrives, the refused one does not"


def test_nacks_fail_only_the_nacked_messages(rabbitmq_url: str, queue: str) -> None:
    """A queue full at 3 with ``x-overflow=reject-publish``: RabbitMQ nacks the messages past
    the third. Those fail (to be retried); the three it took are published."""
    declare(rabbitmq_url, queue, **{"x-max-length": 3, "x-overflow": "reject-publish"})
    ids = [f"m{n}" for n in range(8)]
    report = publish(rabbitmq_url, [delivery(i, queue) for i in ids])
    assert report.published == ids[:3]
    assert [f.id for f in report.failed] == ids[3:]
    assert all("nacked" in f.error and not f.permanent for f in report.failed)
    assert in_queue(rabbitmq_url, queue) == Counter(ids[:3])


def test_a_connection_lost_mid_batch_leaves_the_unconfirmed_unsent_and_loses_none(
    rabbitmq_url: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link to the broker (a slow one: a proxy holding each chunk 20 ms) is cut after 1,500
    of 2,000 publishes were written, with some still on their way: what was confirmed is
    published and in the queue, everything else is unsent (released, sent again later),
    nothing is failed."""
    declare(rabbitmq_url, queue)
    upstream = urlsplit(rabbitmq_url)
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5672)
    real_add, written = wire.Frames.add, 0

    def add_then_cut(frames: wire.Frames, kwargs: dict[str, Any]) -> bool:
        nonlocal written
        written += 1
        if written == 1500:
            proxy.cut()
        return real_add(frames, kwargs)

    ids = [f"m{n}" for n in range(2000)]
    try:
        target = CeleryTarget.from_url(via(proxy, rabbitmq_url))
        target.check()  # connected before the link turns slow
        proxy.delay = 0.02
        monkeypatch.setattr(wire.Frames, "add", add_then_cut)
        report = target.publish_many([delivery(i, queue) for i in ids])
        target.close()
    finally:
        proxy.close()
    assert report.unsent, "the link was cut before every confirm arrived"
    assert report.failed == [] and report.broker_error is not None
    assert sorted(report.published + report.unsent) == sorted(ids), "each id either published or released"
    landed = in_queue(rabbitmq_url, queue)
    assert set(report.published) <= set(landed), "a message reported published is in the queue"
    assert all(landed[i] == 1 for i in report.published)


def test_confirms_later_than_confirm_timeout_leave_the_batch_unsent(rabbitmq_url: str, queue: str) -> None:
    """A link holding each chunk 1 s and ``confirm_timeout=0.3``: no confirm comes in time, so
    nothing counts as published and nothing as failed; the batch is released, the broker error
    says why, and the next batch starts on a fresh connection."""
    declare(rabbitmq_url, queue)
    upstream = urlsplit(rabbitmq_url)
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5672)
    ids = [f"m{n}" for n in range(20)]
    try:
        target = CeleryTarget.from_url(via(proxy, rabbitmq_url), confirm_timeout=0.3)
        target.check()
        proxy.delay = 1.0
        report = target.publish_many([delivery(i, queue) for i in ids])
        proxy.delay = 0.0
        again = target.publish_many([delivery("after", queue)])
        target.close()
    finally:
        proxy.close()
    assert report.published == [] and report.failed == [] and sorted(report.unsent) == sorted(ids)
    assert "not confirmed within 0.3 s" in str(report.broker_error)
    assert again.published == ["after"]


def test_a_connection_with_confirm_publish_streams_too(rabbitmq_url: str, queue: str) -> None:
    """A connection made with ``confirm_publish=True`` (a user's own ``connect``) would have
    py-amqp wait for each confirm itself and swallow the frames the stream counts on."""
    declare(rabbitmq_url, queue)
    target = CeleryTarget(lambda: Connection(rabbitmq_url, transport_options={"confirm_publish": True}))
    ids = [f"m{n}" for n in range(50)]
    try:
        report = target.publish_many([delivery(i, queue) for i in ids])
    finally:
        target.close()
    assert report.published == ids and report.unsent == [] and report.failed == []
    assert in_queue(rabbitmq_url, queue) == Counter(ids)
