"""The Celery target replays a stored task exactly as Celery would have published it.

No worker here: the tests consume the raw messages from a real broker (RabbitMQ and a Redis
broker) and compare them field by field with Celery's own publish of the same task.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Consumer, Exchange, Queue

from delayq_backends import Envelope
from delayq_backends.celery import CeleryTarget, StoredMessage, forget_store, store_for
from delayq_backends.celery.message import KIND
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from tests.helpers import ms_at_or_after, wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, delete_queue, new_env


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    yield env
    delete_queue(env)


def drain(broker: str, queue: str, count: int) -> list[Any]:
    """The next ``count`` raw messages of ``queue`` (acked), as kombu Message objects."""
    got: list[Any] = []

    def take(_: Any, message: Any) -> None:
        message.ack()
        got.append(message)

    with Connection(broker) as conn, Consumer(conn, queues=[Queue(queue, no_declare=True)], callbacks=[take]):
        while len(got) < count:
            conn.drain_events(timeout=10)
    return got


def make_due(app: Celery, task_id: str) -> None:
    """Move a stored task to just past, so a forwarder pass sends it (its eta header follows).

    Not to now: ready times round up to the next ms, so "now" may not be due yet when the
    forwarder's pass reads the server clock in the same millisecond."""
    assert store_for(app).reschedule(task_id, datetime.now(timezone.utc) - timedelta(seconds=1))


def test_replay_matches_celerys_own_publish(env: CeleryEnv) -> None:
    plugin, native = env.app(), env.native_app()
    eta = datetime.now(timezone.utc) + timedelta(milliseconds=300)
    options: dict[str, Any] = dict(
        args=[1, "ü", {"k": [1.5, None]}],
        kwargs={"z": True},
        eta=eta,
        priority=6,
        headers={"x_custom": "v", "x_when": datetime(2030, 1, 2, tzinfo=timezone.utc)},
        compression="zlib",
        reply_to="replies",  # the default is a per-app id, and this test has two apps
    )
    try:
        native.send_task("dqt.record", task_id="same-id", **options)
        plugin.send_task("dqt.record", task_id="same-id", **options)
        stored = store_for(plugin).get("same-id")
        assert stored is not None and stored.ready_ms == ms_at_or_after(eta)
        forwarder = Forwarder(store_for(plugin), [CeleryTarget.from_url(env.broker)])
        assert forwarder.run_once() == 0, "not due yet"
        wait_for(lambda: forwarder.run_once() == 1, 5, "the task to fall due and be forwarded")
        native_msg, replayed = drain(env.broker, env.queue, 2)
    finally:
        forget_store(plugin)
    assert replayed.body == native_msg.body, "the body is replayed byte for byte"
    assert replayed.content_type == native_msg.content_type == "application/json"
    assert replayed.content_encoding == native_msg.content_encoding
    assert replayed.headers == native_msg.headers, "every header, eta and compression included"
    for name in ("correlation_id", "reply_to", "priority", "delivery_mode"):
        assert replayed.properties.get(name) == native_msg.properties.get(name), name
    assert replayed.delivery_info["routing_key"] == native_msg.delivery_info["routing_key"] == env.queue
    assert replayed.decode() == native_msg.decode()


def test_expiration_is_recomputed_from_expires(env: CeleryEnv) -> None:
    app = env.app()
    try:
        fresh = app.send_task("dqt.record", args=["x"], countdown=3600, expires=7200).id
        stale = app.send_task("dqt.record", args=["y"], countdown=3600, expires=datetime.now(timezone.utc)).id
        make_due(app, fresh)
        make_due(app, stale)
        Forwarder(store_for(app), [CeleryTarget.from_url(env.broker)]).run_once()
        messages = {m.headers["id"]: m for m in drain(env.broker, env.queue, 2)}
    finally:
        forget_store(app)
    if env.kind == "rabbitmq":  # the Redis transport has no per-message TTL
        left_ms = int(messages[fresh].properties["expiration"])
        assert 7_100_000 < left_ms <= 7_200_000, "about 2 h left, not the 3 h the publish-time value said"
    assert "expiration" not in messages[stale].properties, "the worker gets it and revokes it as expired"
    assert messages[stale].headers["expires"] is not None


def test_corrupt_message_is_dead_lettered_and_the_rest_delivered(env: CeleryEnv) -> None:
    app = env.app()
    try:
        store = store_for(app)
        good = app.send_task("dqt.record", args=["ok"], countdown=3600).id
        make_due(app, good)
        store.schedule("broken", 0, Envelope(KIND, env.queue, b"{}", {"ct": "application/json"}))
        stored = store.get(good)
        assert stored is not None
        message = StoredMessage.from_envelope(Envelope.decode(stored.envelope))
        bad_eta = replace(message, headers={**message.headers, "id": "bad-eta", "eta": "not a time"})
        store.schedule("bad-eta", 0, bad_eta.to_envelope())
        forwarder = Forwarder(store, [CeleryTarget.from_url(env.broker)])
        forwarder.run_once()
        dead = {d.id: d.error for d in store.dead_letters()}
        assert "not a delayq Celery message" in dead["broken"]
        assert "cannot replay" in dead["bad-eta"] and set(dead) == {"broken", "bad-eta"}
        assert [m.headers["id"] for m in drain(env.broker, env.queue, 1)] == [good]
        assert forwarder.stats.forwarded == 1, "the good one is published once, not retried with the bad"
    finally:
        forget_store(app)


def test_refused_declaration_fails_that_item_only(rabbitmq_url: str, valkey_server: EmbeddedServer) -> None:
    """PRECONDITION_FAILED, an AMQP channel error: that message is retried later, the rest go."""
    env = new_env("rabbitmq", rabbitmq_url, valkey_server)
    app = env.app()
    clash = f"{env.queue}-clash"
    with Connection(env.broker) as conn:  # the queue exists with other arguments
        Queue(clash, Exchange(clash), clash, queue_arguments={"x-max-priority": 3})(conn.default_channel).declare()
    try:
        store = store_for(app)
        bad = app.send_task("dqt.record", args=["bad"], countdown=3600, queue=clash).id
        ok = [app.send_task("dqt.record", args=["ok", i], countdown=3600).id for i in range(3)]
        for task_id in [bad, *ok]:
            make_due(app, task_id)
        forwarder = Forwarder(store, [CeleryTarget.from_url(env.broker)], retry_delay=60)
        forwarder.run_once()
        assert sorted(m.headers["id"] for m in drain(env.broker, env.queue, 3)) == sorted(ok)
        item = store.get(bad)
        assert item is not None and item.attempts == 1, "retried later with back-off, not dead at once"
        assert forwarder.stats.retried == 1 and forwarder.stats.dead == 0
    finally:
        forget_store(app)
        with Connection(env.broker) as conn:
            conn.default_channel.queue_delete(clash)
        delete_queue(env)


def test_unknown_exchange_ends_as_a_dead_letter_with_the_brokers_reason(
    rabbitmq_url: str, valkey_server: EmbeddedServer
) -> None:
    env = new_env("rabbitmq", rabbitmq_url, valkey_server)
    app = env.app()
    try:
        store = store_for(app)
        lost = app.send_task("dqt.record", args=["lost"], countdown=3600).id
        fine = app.send_task("dqt.record", args=["fine"], countdown=3600).id
        stored = store.get(lost)
        assert stored is not None
        message = StoredMessage.from_envelope(Envelope.decode(stored.envelope))
        nowhere = replace(message, exchange=f"{env.queue}-no-such-exchange", declare=[])
        store.schedule(lost, 0, nowhere.to_envelope())
        make_due(app, fine)
        forwarder = Forwarder(store, [CeleryTarget.from_url(env.broker)], retry_delay=0.01)
        wait_for(lambda: forwarder.run_once() == 0 and bool(store.dead_letters()), 10, "the retries to run out")
        (dead,) = store.dead_letters()
        assert dead.id == lost and "NOT_FOUND" in dead.error and "no-such-exchange" in dead.error
        assert [m.headers["id"] for m in drain(env.broker, env.queue, 1)] == [fine]
    finally:
        forget_store(app)
        delete_queue(env)


@pytest.mark.parametrize("priority", [{}, {"priority": None}, {"priority": 3}], ids=["unset", "none", "3"])
def test_replay_gains_no_property_the_native_publish_lacks(env: CeleryEnv, priority: dict[str, Any]) -> None:
    """An explicit queue and no priority: the replay must not come back with ``priority=0``."""
    plugin, native = env.app(), env.native_app()
    options: dict[str, Any] = dict(args=["p"], countdown=3600, queue=env.queue, reply_to="replies", **priority)
    try:
        native.send_task("dqt.record", task_id="prop-id", **options)
        plugin.send_task("dqt.record", task_id="prop-id", **options)
        make_due(plugin, "prop-id")
        forwarder = Forwarder(store_for(plugin), [CeleryTarget.from_url(env.broker)])
        wait_for(lambda: forwarder.run_once() == 1, 5, "the task to be forwarded")
        native_msg, replayed = drain(env.broker, env.queue, 2)
    finally:
        forget_store(plugin)
    native_props, replayed_props = dict(native_msg.properties), dict(replayed.properties)
    # per delivery, set by the transport; the headers (eta moved by make_due) are compared below
    for volatile in ("delivery_tag", "body_encoding", "delivery_info", "application_headers"):
        native_props.pop(volatile, None)
        replayed_props.pop(volatile, None)
    assert sorted(replayed_props) == sorted(native_props), "the same property names"
    for name, value in native_props.items():
        assert replayed_props[name] == value, name
    eta_free = {k: v for k, v in replayed.headers.items() if k != "eta"}
    assert eta_free == {k: v for k, v in native_msg.headers.items() if k != "eta"}
    for name in ("exchange", "routing_key", "priority"):
        assert replayed.delivery_info.get(name) == native_msg.delivery_info.get(name), name
