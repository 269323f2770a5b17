"""The hand-off's own encoding of kombu's Redis messages is kombu's, command for command.

:class:`~delayq_backends.celery.redis_handoff.BatchEncoder` builds the JSON kombu's Redis channel
pushes and routes it by one probe per exchange, routing key and priority, instead of running
kombu's ``Producer.publish`` per message. Here Celery protocol 2 messages captured by the real
plugin (headers, priorities, compression, serializers, ``expires``, eta rewrites, and direct,
topic, fanout and ``x-expires`` routes) are encoded both ways under one fixed delivery tag: the
commands must be equal, byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection, Exchange, Queue
from kombu.common import Broadcast, maybe_declare
from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.virtual.exchange import DirectExchange

from delayq_backends.celery import StoredMessage, forget_store, store_for
from delayq_backends.celery.redis_handoff import RedisHandOff
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from tests.test_celery.harness import CeleryEnv, new_env

#: kombu's Redis transport options: its defaults, and a global key prefix with ten priority
#: sub-lists joined by ":" (what Celery's docs suggest for priorities)
OPTIONS = {
    "defaults": {},
    "prefix-priorities": {"global_keyprefix": "gk:", "priority_steps": list(range(10)), "sep": ":"},
}
TAG = "fixed-delivery-tag"

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
#: custom header values; datetimes and bytes are kombu-typed (kombu's JSON hook encodes them)
_values = st.recursive(
    _scalars | st.datetimes(timezones=st.just(timezone.utc)) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@dataclass(frozen=True)
class Case:
    """One task sent with the plugin, and when the store releases it (None: at its eta)."""

    route: str
    options: dict[str, Any]
    released_ms: int | None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    options: dict[str, Any] = {"countdown": draw(st.integers(1, 10**6))}
    options["priority"] = draw(st.none() | st.integers(-2, 12))
    options["headers"] = draw(st.dictionaries(st.from_regex(r"x_[a-z]{1,6}", fullmatch=True), _values, max_size=3))
    options["compression"] = draw(st.sampled_from([None, "zlib", "bzip2"]))
    options["serializer"] = draw(st.sampled_from(["json", "pickle"]))
    expires = draw(st.none() | st.integers(-100, 10**7))
    if expires is not None:  # past ones: no expiration, the worker revokes the task
        options["expires"] = datetime.now(timezone.utc) + timedelta(seconds=expires)
    if draw(st.booleans()):
        options["reply_to"] = draw(st.text(min_size=1, max_size=8))
    released = draw(st.none() | st.integers(0, 2**42))
    return Case(draw(st.sampled_from(["default", "direct", "topic", "expiring", "fanout"])), options, released)


def routes(queue: str) -> dict[str, dict[str, Any]]:
    """``send_task`` routing options: Celery's default, named direct and topic exchanges, a queue
    with ``x-expires`` (kombu adds a PEXPIRE of its lists), and a fanout (PUBLISH). Each its own
    queue: kombu declares a queue name once per connection, whatever its bindings."""
    return {
        "default": {},
        "direct": {"queue": Queue(f"{queue}-d", Exchange(f"{queue}-d"), routing_key=f"{queue}.d")},
        "topic": {
            "queue": Queue(f"{queue}-t", Exchange(f"{queue}-t", type="topic"), routing_key=f"{queue}.#"),
            "routing_key": f"{queue}.a",
        },
        "expiring": {"queue": Queue(f"{queue}-e", Exchange(f"{queue}-e"), f"{queue}-e", expires=600)},
        "fanout": {"queue": Broadcast(f"{queue}-b")},
    }


@pytest.fixture(params=list(OPTIONS.values()), ids=list(OPTIONS))
def setup(valkey_server: EmbeddedServer, request: pytest.FixtureRequest) -> Iterator[tuple[Celery, RedisHandOff]]:
    """An app with the plugin, and a hand-off on its broker (the store's server) under one delivery tag."""
    env: CeleryEnv = new_env("redis", "", valkey_server)
    env.broker = env.store
    env.transport_options = dict(request.param)
    app = env.app()
    if not hasattr(RedisChannel, "create_publish_batch"):  # the version matrix's older kombu lines
        pytest.skip("kombu < 5.7 has no publish hook: the exactly-once hand-off is off, the target publishes")
    with Connection(env.broker, transport_options=request.param) as conn:
        handoff = RedisHandOff.for_channel(conn.channel())
        assert handoff is not None, "kombu's Redis transport with the publish hook"
        handoff.channel._next_delivery_tag = lambda: TAG  # kombu draws one per publish
        yield app, handoff
    forget_store(app)


def replay_kwargs(app: Celery, handoff: RedisHandOff, case: Case, queue: str) -> dict[str, Any]:
    """The publish arguments of the task ``case`` sends, as the store releases it; its queues
    declared (a Broadcast queue too, which Celery does not declare when it publishes)."""
    route = routes(queue)[case.route]
    if "queue" in route:
        maybe_declare(route["queue"], handoff.channel)
    result = app.send_task("dqt.record", args=["x", {"ü": 1}], **case.options, **route)
    item = store_for(app).get(result.id)
    assert item is not None
    store_for(app).cancel(result.id)
    message = StoredMessage.from_envelope(Envelope.decode(item.envelope))
    ready_ms = item.ready_ms if case.released_ms is None else case.released_ms
    kwargs = message.publish_kwargs(ready_ms=ready_ms)
    for entity in kwargs.pop("declare"):
        maybe_declare(entity, handoff.channel)
    return kwargs


def test_the_encoder_sends_what_kombus_publish_sends(setup: tuple[Celery, RedisHandOff]) -> None:
    app, handoff = setup
    queue = str(app.conf.task_default_queue)

    @settings(max_examples=150, deadline=None)
    @given(case=cases())
    def check(case: Case) -> None:
        kwargs = replay_kwargs(app, handoff, case, queue)
        kombus = handoff.commands(kwargs)
        assert kombus, "kombu sends something for every route here"
        assert handoff.encoder().commands(kwargs) == kombus

    check()


def test_a_plain_task_is_encoded_without_kombus_publish(
    setup: tuple[Celery, RedisHandOff], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's usual message (JSON, its own headers, any priority, a custom header) takes the
    encoder's path; a header only kombu's JSON hook encodes (a datetime) does too."""
    app, handoff = setup
    queue = str(app.conf.task_default_queue)
    cases = [
        Case(route, {"countdown": 60, "priority": priority, "headers": headers}, None)
        for route in ("default", "topic", "fanout")
        for priority in (None, 0, 5)
        for headers in ({}, {"x_when": datetime.now(timezone.utc)})
    ]
    kwargs = [replay_kwargs(app, handoff, case, queue) for case in cases]
    expected = [handoff.commands(k) for k in kwargs]

    def no_kombu(publish_kwargs: dict[str, Any]) -> None:
        raise AssertionError("went through kombu's Producer.publish")

    monkeypatch.setattr(handoff, "commands", no_kombu)
    encoder = handoff.encoder()
    assert [encoder.commands(k) for k in kwargs] == expected


def test_what_only_kombu_handles_goes_through_kombu(setup: tuple[Celery, RedisHandOff]) -> None:
    """Properties kombu's channel sets itself, a priority kombu reads with ``int()``, a body to
    serialize, and a channel pushing something other than the message's JSON as it is."""
    app, handoff = setup
    plain = replay_kwargs(app, handoff, Case("default", {"countdown": 60}, None), str(app.conf.task_default_queue))
    unusual = [
        {**plain, "delivery_info": {"x": 1}},
        {**plain, "priority": "7"},
        {**plain, "priority": True},
        {**plain, "body": ["not", "encoded"], "content_type": None, "content_encoding": None},
    ]
    for kwargs in unusual:
        assert handoff.encoder().commands(dict(kwargs)) == handoff.commands(dict(kwargs)), kwargs

    channel = handoff.channel
    put = channel._put

    def wrapped(queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        put(queue, {"wrapped": message}, **kwargs)

    channel._put = wrapped
    try:
        (ours,) = handoff.encoder().commands(dict(plain))
        assert ours == handoff.commands(dict(plain))[0]
        assert '"wrapped"' in ours.args[-1]
    finally:
        del channel._put


def test_an_exchange_of_a_type_of_the_users_own_is_routed_by_kombu(
    setup: tuple[Celery, RedisHandOff], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's own exchange types route by exchange, routing key and priority, so one probe's
    route serves a batch; a type of the user's own may route on anything: each message of it
    goes through kombu's publish."""
    app, handoff = setup
    plain = replay_kwargs(app, handoff, Case("default", {"countdown": 60}, None), str(app.conf.task_default_queue))
    channel = handoff.channel

    class OwnType(DirectExchange):  # type: ignore[misc]
        pass

    monkeypatch.setattr(channel, "typeof", lambda exchange, default="direct": OwnType(channel))
    real, through_kombu = handoff.commands, []

    def recorded(kwargs: dict[str, Any]) -> list[Any]:
        through_kombu.append(kwargs["routing_key"])
        return real(kwargs)

    monkeypatch.setattr(handoff, "commands", recorded)
    encoder = handoff.encoder()
    assert encoder.commands(dict(plain)) == real(dict(plain))
    assert encoder.commands(dict(plain)) == real(dict(plain))
    assert len(through_kombu) == 2, "each message of that exchange through kombu"
