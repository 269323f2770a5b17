"""Envelope format 2 and the stored format 1 envelopes it must keep reading.

The ``*_V1`` constants are envelopes written by delayq_backends at tag ``s3-start`` (format 1):
a Celery task message (zlib-compressed, with a priority and a custom datetime header), an RQ
Scheduler job with a non-default queue class, and a list item with a binary body.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Queue
from kombu.utils.json import dumps

from delayq_backends import DelayStore, Envelope, EnvelopeError
from delayq_backends.celery import CeleryTarget, StoredMessage
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq.jobs import job_envelope
from delayq_backends.targets import Delivery, RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import make_store

CELERY_V1 = (
    b'DQ\x01\x00\x00\x06:{"t":"celery","d":"mail","m":{"task":"proj.tasks.send_email","c'
    b't":"application/json","ce":"utf-8","x":"","rk":"mail","k":"{\\"h\\": {\\"'
    b'lang\\": \\"py\\", \\"task\\": \\"proj.tasks.send_email\\", \\"id\\": \\"0b6f7c5'
    b'2-4a0e-4c1d-9d63-2f1b7d0c9e11\\", \\"shadow\\": null, \\"eta\\": \\"2027-01-'
    b'15T08:00:00+00:00\\", \\"expires\\": null, \\"group\\": null, \\"group_index'
    b'\\": null, \\"retries\\": 0, \\"timelimit\\": [null, null], \\"root_id\\": \\"'
    b'0b6f7c52-4a0e-4c1d-9d63-2f1b7d0c9e11\\", \\"parent_id\\": null, \\"argsrep'
    b'r\\": \\"(\'user@example.com\',)\\", \\"kwargsrepr\\": \\"{\'template\': \'welcom'
    b'e\', \'user_id\': 12345}\\", \\"origin\\": \\"gen42@web-1\\", \\"ignore_result\\'
    b'": null, \\"replaced_task_nesting\\": 0, \\"stamped_headers\\": null, \\"st'
    b'amps\\": {}, \\"x_when\\": {\\"__type__\\": \\"datetime\\", \\"__value__\\": \\"'
    b'2030-01-02T00:00:00+00:00\\"}, \\"compression\\": \\"application/x-gzip\\"}'
    b', \\"p\\": {\\"delivery_mode\\": 2, \\"correlation_id\\": \\"0b6f7c52-4a0e-4c'
    b'1d-9d63-2f1b7d0c9e11\\", \\"reply_to\\": \\"4cf2beda-93c2-3093-b24b-013e16'
    b'60b748\\", \\"priority\\": 6}, \\"q\\": [{\\"name\\": \\"mail\\", \\"exchange\\":'
    b' {\\"name\\": \\"mail\\", \\"type\\": \\"direct\\", \\"arguments\\": null, \\"dur'
    b'able\\": true, \\"passive\\": false, \\"auto_delete\\": false, \\"delivery_m'
    b'ode\\": null, \\"no_declare\\": false}, \\"routing_key\\": \\"mail\\", \\"queu'
    b'e_arguments\\": null, \\"binding_arguments\\": null, \\"consumer_arguments'
    b'\\": null, \\"durable\\": true, \\"exclusive\\": false, \\"auto_delete\\": fa'
    b'lse, \\"no_ack\\": false, \\"alias\\": null, \\"bindings\\": [], \\"no_declar'
    b'e\\": null, \\"expires\\": null, \\"message_ttl\\": null, \\"max_length\\": n'
    b'ull, \\"max_length_bytes\\": null, \\"max_priority\\": null}]}"}}x\x9c\x8b\x8eV*-N-'
    b"rH\xadH\xcc-\xc8I\xd5K\xce\xcfU\x8a\xd5Q\xa8V*I\x05\xf2\x13KR\x95\xac\x14\x94\xcaSs\x80\xe2\xa9J:\n`\xc5\xf1\x99)@QC#c\x13\xd3Z\x90\xd2\xe4\xc4\x9c\x9c\xa4\xc4\xe4\xecb\xa0h^iN\x0ePY"
    b"jQ\x11\x9aHrFbf\x1e27\xbf(\x05\xca\xad\x8d\x05\x00\xae\x0e+\xdb"
)
RQ_V1 = (
    b'DQ\x01\x00\x00\x00\x86{"t":"rq","d":"reports","m":{"queue_class":"delayq_backends.rq.'
    b'queue.Queue","scheduler":true,"schedule":{"interval":3600,"repeat":2}}'
    b"}"
)
LIST_V1 = b'DQ\x01\x00\x00\x00"{"t":"list","d":"jobs:out","m":{}}\x00\xffhello \xe2\x9c\x93'
TASK_ID = "0b6f7c52-4a0e-4c1d-9d63-2f1b7d0c9e11"
ETA_MS = 1_800_000_000_000


def test_format_1_envelopes_read_as_before() -> None:
    lst, rq = Envelope.decode(LIST_V1), Envelope.decode(RQ_V1)
    assert lst == RedisListTarget.envelope("jobs:out", b"\x00\xffhello \xe2\x9c\x93")
    assert rq.target == "rq" and rq.destination == "reports" and rq.body == b"" and rq.details == b""
    assert rq.meta == {
        "queue_class": "delayq_backends.rq.queue.Queue",
        "scheduler": True,
        "schedule": {"interval": 3600, "repeat": 2},
    }
    message = StoredMessage.from_envelope(Envelope.decode(CELERY_V1))
    assert message.task_id == TASK_ID and message.routing_key == "mail"
    assert message.headers["root_id"] == TASK_ID and message.properties["correlation_id"] == TASK_ID
    assert message.properties["priority"] == 6 and message.headers["compression"] == "application/x-gzip"


@pytest.mark.parametrize("old", [LIST_V1, RQ_V1, CELERY_V1], ids=["list", "rq", "celery"])
def test_format_2_keeps_everything_format_1_held_in_fewer_bytes(old: bytes) -> None:
    envelope = Envelope.decode(old)
    if envelope.target == "celery":
        message = StoredMessage.from_envelope(envelope)
        new = message.to_envelope().encode()
        _same(StoredMessage.from_envelope(Envelope.decode(new)), message)
        assert message.publish_kwargs(ready_ms=ETA_MS) == StoredMessage.from_envelope(
            Envelope.decode(new)
        ).publish_kwargs(ready_ms=ETA_MS)
    else:
        new = envelope.encode()
        assert Envelope.decode(new) == envelope
    assert new[:3] == b"DQ\x02" and len(new) < len(old)


def test_a_celery_envelope_costs_no_more_than_the_message_on_the_wire() -> None:
    message = StoredMessage.from_envelope(Envelope.decode(CELERY_V1))
    new = message.to_envelope()
    assert TASK_ID.encode() in new.details and new.details.count(TASK_ID.encode()) == 1, "the id once"
    assert b'\\"' not in new.details, "kombu's JSON is stored as it is, not escaped in another JSON"
    assert new.meta == {} and b"proj.tasks.send_email" in new.details and new.details.count(b"send_email") == 1
    # what kombu sends besides the body: its headers and properties as JSON
    wire = len(dumps({**message.headers, **message.properties}, separators=(",", ":")))
    assert len(new.encode()) <= len(message.body) + wire, (len(new.encode()), len(message.body), wire)


@pytest.mark.parametrize(
    "envelope",
    [
        Envelope("list", "q", b""),
        Envelope("list", "ü" * 200, b"\x00" * 300, meta={"k": [1, "é"]}, details=b"\xff" * 130),
        job_envelope("default"),
    ],
)
def test_round_trip(envelope: Envelope) -> None:
    assert Envelope.decode(envelope.encode()) == envelope


def _same(restored: StoredMessage, original: StoredMessage) -> None:
    """Equal, and the headers and properties in the same order (kombu sends them in dict order)."""
    assert restored == original
    assert list(restored.headers) == list(original.headers)
    assert list(restored.properties) == list(original.properties)


def _round_trip(message: StoredMessage) -> StoredMessage:
    return StoredMessage.from_envelope(Envelope.decode(message.to_envelope().encode()))


def test_message_without_id_copies_round_trips() -> None:
    message = StoredMessage.from_envelope(Envelope.decode(CELERY_V1))
    child = replace(
        message,
        headers={**message.headers, "root_id": "other", "parent_id": "p"},
        properties={**message.properties, "correlation_id": "corr"},
        task="renamed",
        declare=[],
    )
    _same(_round_trip(child), child)


@pytest.mark.parametrize("shape", ["older celery", "reordered", "defaults changed", "no headers"])
def test_headers_of_any_shape_come_back_in_their_order(shape: str) -> None:
    message = StoredMessage.from_envelope(Envelope.decode(CELERY_V1))
    keys = list(message.headers)
    if shape == "older celery":  # Celery 5.3 writes no stamps, nesting or ignore_result
        headers = {k: message.headers[k] for k in keys[:15]} | {"x": 1}
    elif shape == "reordered":
        headers = {k: message.headers[k] for k in [keys[3], *keys[:3], *keys[4:]]}
    elif shape == "defaults changed":
        headers = {**message.headers, "retries": 3, "lang": "js", "timelimit": [1, None], "stamps": {"a": [1]}}
        headers["shadow"], headers["ignore_result"], headers["replaced_task_nesting"] = "s", False, 0.0
    else:
        headers = {}
    changed = replace(message, headers=headers)
    _same(_round_trip(changed), changed)


def test_queue_declarations_keep_what_differs_from_celerys_default_route() -> None:
    message = StoredMessage.from_envelope(Envelope.decode(CELERY_V1))
    assert b'"q"' not in message.to_envelope().details, "queue 'mail' on exchange 'mail' by key 'mail': implied"
    routed = Queue("mail", Exchange("events", "topic", durable=False), "mail.#", max_priority=10, no_declare=True)
    for declare in ([], [routed.as_dict(recurse=True)], [message.declare[0], routed.as_dict(recurse=True)]):
        changed = replace(message, declare=declare)
        _same(_round_trip(changed), changed)


# -- garbage --------------------------------------------------------------------------------


def test_every_truncation_of_a_format_2_envelope_says_so() -> None:
    data = Envelope("list", "out", b"", meta={"a": 1}, details=b"xyz").encode()
    for cut in range(3, len(data) - 1):  # the last byte(s) may be details or the (empty) body
        if cut >= len(data) - 3:
            break
        with pytest.raises(EnvelopeError, match="truncated|corrupt"):
            Envelope.decode(data[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_after_the_format_2_marker_is_an_envelope_error(tail: bytes) -> None:
    try:
        envelope = Envelope.decode(b"DQ\x02" + tail)
    except EnvelopeError:
        return
    with contextlib.suppress(EnvelopeError):
        StoredMessage.from_envelope(envelope)


@pytest.mark.parametrize(
    "details, reason",
    [
        (b"{not json", "not a delayq Celery message"),
        (b'{"h":[],"p":{},"q":[],"ct":"a","ce":"b","x":"","rk":"q"}', "not a delayq Celery message"),
        (b'{"h":{},"p":{},"q":[],"ct":"a","ce":"b","x":"","rk":"q","i":1}', "no id header"),
        (b'{"h":{},"p":{"c":null},"q":[],"ct":"a","ce":"b","x":"","rk":"q","i":2}', "no id header"),
    ],
)
def test_corrupt_celery_details_are_envelope_errors(details: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeError, match=reason):
        StoredMessage.from_envelope(Envelope("celery", "q", b"{}", details=details))


@pytest.fixture
def store(valkey_server: EmbeddedServer, prefix: str) -> Iterator[DelayStore]:
    store = make_store(valkey_server.url, prefix, shards=2)
    yield store
    store.client.close()


def test_a_forwarder_delivers_old_and_new_envelopes_alike_and_buries_garbage_with_a_reason(store: DelayStore) -> None:
    store.schedule("old", 1, LIST_V1)
    store.schedule("new", 1, Envelope.decode(LIST_V1).encode())
    store.schedule("truncated", 1, b"DQ\x02\x04list\x03out\x00\x09ab")
    store.schedule("bad-meta", 1, b"DQ\x02\x04list\x03out\x03[1]\x00")
    inbox = CollectingTarget("list")
    forwarder = Forwarder(store, [inbox])
    forwarder.run_once()
    assert sorted(inbox.ids) == ["new", "old"]
    assert {d.envelope.body for d in inbox.delivered} == {b"\x00\xffhello \xe2\x9c\x93"}
    dead = {d.id: d.error for d in store.dead_letters()}
    assert set(dead) == {"truncated", "bad-meta"}
    assert "truncated" in dead["truncated"] and "corrupt" in dead["bad-meta"]


def _drain(broker: str, queue: str, count: int) -> list[Any]:
    got: list[Any] = []

    def take(_: Any, message: Any) -> None:
        message.ack()
        got.append(message)

    with Connection(broker) as conn, Consumer(conn, queues=[Queue(queue, no_declare=True)], callbacks=[take]):
        while len(got) < count:
            conn.drain_events(timeout=10)
    return got


def test_an_old_celery_envelope_is_published_exactly_as_its_format_2_copy(valkey_server: EmbeddedServer) -> None:
    broker = f"{valkey_server.url.rsplit('/', 1)[0]}/3"
    old = Envelope.decode(CELERY_V1)
    new = Envelope.decode(StoredMessage.from_envelope(old).to_envelope().encode())
    target = CeleryTarget.from_url(broker)
    try:
        report = target.publish_many([Delivery("old", old, 0, ETA_MS), Delivery("new", new, 0, ETA_MS)])
        assert sorted(report.published) == ["new", "old"] and not report.failed
        first, second = _drain(broker, "mail", 2)
    finally:
        target.close()
    assert first.body == second.body and first.headers == second.headers
    assert first.headers["id"] == first.headers["root_id"] == TASK_ID
    for name in ("correlation_id", "reply_to", "priority", "delivery_mode"):
        assert first.properties.get(name) == second.properties.get(name), name
    assert first.properties["correlation_id"] == TASK_ID
    assert first.decode() == second.decode()
