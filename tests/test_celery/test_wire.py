"""The Celery target's own AMQP publish sends what kombu's ``Producer.publish`` sends.

The properties are encoded byte for byte as py-amqp encodes them (compared with py-amqp's
own encoder, values of every kind a table holds), and a real RabbitMQ queue holds the same
message, properties and headers included, whether a stored task went out through
:class:`delayq_backends.celery.wire.Frames` or through kombu's publish.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from amqp import Message, spec
from amqp.exceptions import RecoverableConnectionError
from amqp.method_framing import frame_writer
from amqp.serialization import dumps
from kombu import Connection, Producer
from kombu.common import maybe_declare

from delayq_backends import Envelope
from delayq_backends.celery import CeleryTarget, StoredMessage, forget_store, store_for, wire
from delayq_backends.embedded import EmbeddedServer
from tests.test_celery.harness import CeleryEnv, delete_queue, new_env

HEADERS: dict[str, Any] = {
    "lang": "py", "task": "dqt.record", "id": "5f0c-ü", "shadow": None, "eta": "2030-01-02T03:04:05.000006+00:00",
    "expires": None, "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
    "root_id": "5f0c-ü", "parent_id": None, "argsrepr": "(1, 'ü')", "kwargsrepr": "{}", "origin": "gen1@host",
    "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
}  # fmt: skip


@pytest.mark.parametrize(
    "properties",
    [
        {"content_type": "application/json", "content_encoding": "utf-8", "application_headers": HEADERS,
         "delivery_mode": 2, "priority": 0, "correlation_id": "5f0c-ü", "reply_to": "r"},
        {"content_type": "application/x-python-serialize", "content_encoding": "binary", "application_headers": {},
         "delivery_mode": 1, "priority": None, "expiration": "7200000", "message_id": "m", "timestamp": 1_700_000_000,
         "type": "t", "user_id": "guest", "app_id": "a", "cluster_id": ""},
        {"content_type": "x", "application_headers": {
            "ints": [0, 1, -1, 2147483647, -2147483647, 2147483648, -2147483648, 2**62], "bool": True,
            "float": 1.5, "bytes": b"\x00\xff", "nested": {"a": {"b": [1, "c", None, (2, 3)]}}, "empty": "",
        }},
    ],
    ids=["celery", "every-property", "table-values"],
)  # fmt: skip
def test_properties_are_encoded_as_py_amqp_encodes_them(properties: dict[str, Any]) -> None:
    assert wire.encode_properties(properties) == Message(b"", **properties)._serialize_properties()


class _Transport:
    """A socket's writes, as bytes."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.writes = 0

    def write(self, data: Any) -> None:
        self.written += data
        self.writes += 1


class _Connection:
    def __init__(self) -> None:
        self.frame_max = 131072
        self.transport = _Transport()
        self.bytes_sent = 0
        self.frame_writer = frame_writer(self, self.transport)


class _Channel:
    def __init__(self) -> None:
        self.channel_id = 3
        self.connection = _Connection()


def _publish_kwargs(body: bytes, routing_key: str = "q", **headers: Any) -> dict[str, Any]:
    return {"body": body, "exchange": "", "routing_key": routing_key, "content_type": "application/json",
            "content_encoding": "utf-8", "headers": {**HEADERS, **headers}, "priority": 3}  # fmt: skip


def test_a_batch_is_framed_as_py_amqp_frames_each_publish_and_written_at_once() -> None:
    """The bytes a batch writes are py-amqp's frames of each publish, in the order added: a
    small message framed by :class:`wire.Frames`, an empty body (no body frame), a body over
    one frame and a header py-amqp encodes itself (both through py-amqp's writer, after the
    frames before them); the small ones go out in one write, and py-amqp's count of writes
    (its heartbeat's "sent anything") grows by one a publish."""
    batch = [
        _publish_kwargs(b"[[1], {}, {}]"),
        _publish_kwargs(b""),
        _publish_kwargs(b"x" * 300_000, routing_key="big"),
        _publish_kwargs(b"[]", when=datetime(2030, 1, 2, tzinfo=timezone.utc)),
        _publish_kwargs('[["ü"], {}, {}]'.encode(), routing_key="other"),
    ]
    expected = _Channel()
    for kwargs in batch:
        properties = wire.message_properties(kwargs)
        assert properties is not None
        method = dumps("Bssbb", (0, kwargs["exchange"], kwargs["routing_key"], False, False))
        expected.connection.frame_writer(1, 3, spec.Basic.Publish, method, Message(kwargs["body"], **properties))
    channel = _Channel()
    frames = wire.Frames(channel)
    assert all(frames.add(kwargs) for kwargs in batch[:2])
    assert channel.connection.transport.writes == 0, "nothing written before the batch ends"
    assert all(frames.add(kwargs) for kwargs in batch[2:])
    frames.flush()
    assert bytes(channel.connection.transport.written) == bytes(expected.connection.transport.written)
    assert channel.connection.bytes_sent == len(batch)
    assert channel.connection.transport.writes < expected.connection.transport.writes


def test_a_full_buffer_is_written_before_the_batch_ends() -> None:
    channel = _Channel()
    frames = wire.Frames(channel)
    body = b"y" * 1000
    for _ in range(wire.FLUSH_BYTES // len(body) + 10):
        assert frames.add(_publish_kwargs(body))
    assert channel.connection.transport.writes == 1
    assert len(channel.connection.transport.written) >= wire.FLUSH_BYTES


def test_a_closed_connection_is_an_outage_and_nothing_is_added() -> None:
    channel = _Channel()
    channel.connection.transport = None  # type: ignore[assignment]
    with pytest.raises(RecoverableConnectionError):
        wire.Frames(channel).add(_publish_kwargs(b"[]"))


@pytest.mark.parametrize(
    "properties",
    [
        {"application_headers": {"when": datetime(2030, 1, 2, tzinfo=timezone.utc)}},
        {"application_headers": {"amount": Decimal("1.25")}},
        {"application_headers": {b"bytes-name": 1}},
        {"priority": 256},
        {"priority": "5"},
        {"correlation_id": 7},
        {"reply_to": "x" * 256},
    ],
    ids=["datetime", "decimal", "bytes-name", "priority-256", "priority-str", "int-id", "long-shortstr"],
)
def test_values_it_does_not_know_are_left_to_py_amqp(properties: dict[str, Any]) -> None:
    """None: py-amqp then encodes the message itself (or raises its own error, as before)."""
    assert wire.encode_properties(properties) is None


@pytest.fixture
def env(rabbitmq_url: str, valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    env = new_env("rabbitmq", rabbitmq_url, valkey_server)
    yield env
    delete_queue(env)


def stored_task(env: CeleryEnv, **options: Any) -> StoredMessage:
    """A task message as the plugin captured it from Celery's own sender."""
    app = env.app()
    try:
        task_id = app.send_task("dqt.record", countdown=3600, **options).id
        item = store_for(app).get(task_id)
        assert item is not None
        store_for(app).cancel(task_id)
        return StoredMessage.from_envelope(Envelope.decode(item.envelope))
    finally:
        forget_store(app)


def basic_get(channel: Any, queue: str) -> Any:
    message = channel.basic_get(queue, no_ack=True)
    assert message is not None, f"a message in {queue}"
    return message


@pytest.mark.parametrize(
    "options",
    [
        dict(args=[1, "ü", {"k": [1.5, None]}], kwargs={"z": True}, priority=6, reply_to="replies",
             headers={"x_custom": "v", "x_n": 2**40, "x_nested": {"a": [1, None]}}, compression="zlib",
             expires=7200),
        dict(args=["x" * 300_000], headers={"x_when": datetime(2030, 1, 2, tzinfo=timezone.utc)},
             serializer="pickle"),
        dict(args=[], priority=None, delivery_mode="transient"),
    ],
    ids=["rich", "large-body-pickle-datetime-header", "transient-no-priority"],
)  # fmt: skip
def test_rabbitmq_holds_the_same_message_as_after_kombus_publish(env: CeleryEnv, options: dict[str, Any]) -> None:
    """The same stored task, sent by kombu's publish and by the target's own, then read with
    ``basic_get``: body, every property and header, exchange and routing key are equal."""
    stored = stored_task(env, **options)
    now = datetime.now(timezone.utc)
    kwargs = stored.publish_kwargs(ready_ms=int(now.timestamp() * 1000), now=now)
    with Connection(env.broker) as conn:
        channel = conn.channel()
        for queue in kwargs.pop("declare"):  # as the target declares them, once per batch
            maybe_declare(queue, channel)
        Producer(channel, auto_declare=False).publish(**kwargs)
        frames = wire.Frames(channel)
        assert frames.add(kwargs), "the target's own publish applies"
        frames.flush()
        native, replayed = basic_get(channel, env.queue), basic_get(channel, env.queue)
    assert replayed.body == native.body
    assert replayed.properties == native.properties, "every property, the headers table included"
    for name in ("exchange", "routing_key", "redelivered"):
        assert replayed.delivery_info[name] == native.delivery_info[name], name
    if "expires" in options:
        assert replayed.properties["expiration"] == native.properties["expiration"]


def test_what_only_kombu_handles_is_left_to_kombu() -> None:
    kwargs = {"body": b"[]", "exchange": "", "routing_key": "q", "content_type": "application/json",
              "content_encoding": "utf-8", "headers": {}}  # fmt: skip
    assert wire.message_properties(kwargs) is not None
    for extra in ({"compression": "zlib"}, {"serializer": "json"}, {"retry": True}, {"content_type": ""}):
        assert wire.message_properties({**kwargs, **extra}) is None, extra
    assert wire.message_properties({**kwargs, "body": "text"}) is None


@pytest.mark.parametrize(
    ("url", "takes"), [("amqp://guest:guest@127.0.0.1:1//", False), ("redis://127.0.0.1:1/0", True)]
)
def test_the_target_takes_no_lease_on_amqp_known_without_connecting(url: str, takes: bool) -> None:
    """On AMQP the lease is of no use (no hand-off): the forwarder publishes a pass in one call."""
    target = CeleryTarget.from_url(url)
    assert target.takes_leases is takes
    target.close()
