"""Overload is an outage, not a failure: a target at ``maxmemory`` (OOM) or read-only (a
replica after a failover) gets its batch released, with no attempt counted and no dead
letter, and delivered once it accepts writes again. Each target is an embedded server of its
own (never CONFIG SET on the system Redis)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest
import redis
from amqp import exceptions as amqp_errors

from delayq_backends import DelayStore
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.outages import is_transient
from delayq_backends.targets import RedisListTarget
from tests.harness import make_store
from tests.helpers import wait_for

ITEMS = 30


@pytest.fixture
def target_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


def schedule(store: DelayStore, key: str) -> list[str]:
    ids = [f"job-{n}" for n in range(ITEMS)]
    store.schedule_many([(i, 0, RedisListTarget.envelope(key, json.dumps({"id": i}).encode())) for i in ids])
    return ids


def forward_in_thread(forwarder: Forwarder) -> threading.Thread:
    thread = threading.Thread(target=forwarder.run, kwargs={"install_signals": False, "log_every": 3600})
    thread.start()
    return thread


def check_released_not_failed(store: DelayStore, forwarder: Forwarder) -> None:
    """The batch went back to the store as an outage: no retry, no dead letter, no attempt."""
    wait_for(
        lambda: forwarder.stats.released >= ITEMS and forwarder.stats.outages >= 1,
        10,
        lambda: f"released: {forwarder.stats}",
    )
    assert store.dead_letters() == [] and forwarder.stats.dead == 0 and forwarder.stats.retried == 0
    assert all(item.attempts == 0 for item in store.scan()), "an outage counted an attempt"


def check_delivered_once(store: DelayStore, client: redis.Redis, key: str, ids: list[str]) -> None:
    wait_for(lambda: client.llen(key) >= ITEMS, 20, lambda: f"{ITEMS} delivered (have {client.llen(key)})")
    assert sorted(json.loads(b)["id"] for b in client.lrange(key, 0, -1)) == sorted(ids)
    assert store.dead_letters() == []
    # the forwarder acks right after the publish the wait above saw: wait for the ack too
    wait_for(lambda: sum(s.scheduled for s in store.stats()) == 0, 10, "the delivered items acked")


def released_then_delivered(store: DelayStore, client: redis.Redis, heal: Callable[[], object]) -> None:
    """Forward a batch to a list on ``client``, a target refusing for now: it is released as an
    outage; once ``heal`` lets writes in, every item arrives once."""
    key = "out"
    ids = schedule(store, key)
    forwarder = Forwarder(store, [RedisListTarget(client)], poll_interval=0.2, max_outage_backoff=0.3)
    thread = forward_in_thread(forwarder)
    try:
        check_released_not_failed(store, forwarder)
        heal()
        check_delivered_once(store, client, key, ids)
    finally:
        forwarder.stop()
        thread.join(10)
        client.close()


def test_a_target_at_maxmemory_gets_its_batch_released_then_delivered(
    valkey_url: str, prefix: str, target_server: EmbeddedServer
) -> None:
    store = make_store(valkey_url, prefix, shards=2, max_attempts=2)
    client = redis.Redis.from_url(target_server.url)
    client.set("filler", b"x" * 8_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 3_000_000)  # well under the filler: every write refused until it is deleted
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.rpush("probe", b"x")
    released_then_delivered(store, client, heal=lambda: client.delete("filler"))


def test_a_read_only_target_gets_its_batch_released_then_delivered(
    valkey_url: str, prefix: str, target_server: EmbeddedServer
) -> None:
    store = make_store(valkey_url, prefix, shards=2, max_attempts=2)
    with EmbeddedServer() as primary:
        client = redis.Redis.from_url(target_server.url)
        client.replicaof("127.0.0.1", primary.port)  # a replica, as after a failover: READONLY
        released_then_delivered(store, client, heal=lambda: client.replicaof("NO", "ONE"))


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
        redis.exceptions.MasterDownError("Link with MASTER is down"),
        redis.ConnectionError("refused"),
        amqp_errors.ResourceLocked("resource locked"),
        amqp_errors.ResourceError("memory alarm"),
        amqp_errors.ConnectionForced("broker shutting down"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_errors_are_outages(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.exceptions.NoPermissionError("NOPERM"),
        amqp_errors.PreconditionFailed("PRECONDITION_FAILED"),
        ValueError("bad"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_permanent_errors_are_not_outages(exc: BaseException) -> None:
    assert not is_transient(exc)


@pytest.mark.parametrize(
    "alarm",
    [amqp_errors.ResourceError("memory alarm"), amqp_errors.ResourceLocked("locked")],
    ids=lambda e: type(e).__name__,
)
def test_a_celery_broker_refusing_for_now_is_an_outage(
    rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch, alarm: BaseException
) -> None:
    """A broker that refuses a publish for now (a RabbitMQ resource alarm, a locked resource)
    gets the batch released (``unsent``), not failed item by item."""
    from kombu import Connection
    from kombu.messaging import Producer

    from delayq_backends.celery import CeleryTarget, StoredMessage, wire
    from delayq_backends.targets import Delivery

    def refuse(*args: object, **kwargs: object) -> None:
        raise alarm

    monkeypatch.setattr(Producer, "publish", refuse)
    monkeypatch.setattr(wire.Frames, "flush", refuse)  # AMQP's own framing of stored messages
    message = StoredMessage("t.add", b"[]", "application/json", "utf-8", {"id": "a"}, {}, "", "celery")
    target = CeleryTarget(lambda: Connection(rabbitmq_url))
    deliveries = [Delivery(i, message.to_envelope(), 0, 0) for i in ("a", "b")]
    report = target.publish_many(deliveries)
    target.close()
    assert report.unsent == ["a", "b"] and report.failed == [] and report.broker_error is alarm
