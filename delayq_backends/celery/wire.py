"""AMQP publishes of stored Celery messages without kombu's ``Producer.publish``.

A replayed message is already encoded: its body, content type and headers are what Celery
sent. kombu's publish would still check the serializer, build the properties, and hand
py-amqp a message whose properties py-amqp's generic encoder writes value by value (the
headers table alone is a third of a publish's CPU). :func:`message_properties` builds the
properties kombu would have given the message, defaults included, and :func:`encode_properties`
encodes them byte for byte as py-amqp does, with what repeats (header names, the publish
method's arguments per exchange and routing key) encoded once. A message holding a value
this encoder does not know (a datetime in a custom header, a property of the wrong type)
keeps py-amqp's own encoding, so it reaches the broker, or fails, exactly as before.
:class:`Frames` frames a batch's publishes into one buffer, written in a few system calls.
:func:`publish_properties`, the properties as kombu's publish builds them, serves kombu's Redis
wire message too (:class:`.redis_handoff.BatchEncoder`).
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import Any, NamedTuple

from amqp import Message, spec
from amqp.exceptions import RecoverableConnectionError
from amqp.method_framing import FRAME_OVERHEAD
from amqp.serialization import dumps
from kombu.entity import maybe_delivery_mode

__all__ = [
    "FLUSH_BYTES",
    "Frames",
    "PublishProperties",
    "encode_properties",
    "message_properties",
    "publish",
    "publish_properties",
]

#: kombu's ``Producer.publish`` defaults a message's priority to 0 (an explicit None stays None)
_DEFAULT_PRIORITY = 0


class PublishProperties(NamedTuple):
    """The message properties ``Producer.publish`` builds, and its ``priority`` argument."""

    #: the extra properties in the order given, then ``delivery_mode``, then ``expiration``
    properties: dict[str, Any]
    #: kombu's default 0 when not given; an explicit None stays None
    priority: Any


def publish_properties(kwargs: dict[str, Any]) -> PublishProperties | None:
    """What ``Producer(channel).publish(**kwargs)`` makes of ``kwargs`` before its channel sees
    them, for the arguments of :meth:`StoredMessage.publish_kwargs
    <.message.StoredMessage.publish_kwargs>` (an encoded body with its content type: no
    serializer, no compression). Shared by the AMQP encoder here and kombu's Redis wire message
    (:mod:`.redis_handoff`), whose JSON keeps kombu's order of the properties.

    As kombu builds them: ``delivery_mode`` named or numbered and 2 (persistent) unless given,
    ``expiration`` in whole ms as text. None when ``kwargs`` hold what only kombu's publish handles.
    """
    if _KOMBU_ONLY.intersection(kwargs) or kwargs.get("retry"):
        return None
    if not kwargs["content_type"] or not kwargs["content_encoding"] or type(kwargs["body"]) is not bytes:
        return None  # kombu would encode the body, or name its encoding
    properties = {k: v for k, v in kwargs.items() if k not in _NOT_PROPERTIES}
    priority = properties.pop("priority", _DEFAULT_PRIORITY)
    properties["delivery_mode"] = maybe_delivery_mode(properties.pop("delivery_mode", None))
    expiration = kwargs.get("expiration")
    if expiration is not None:
        properties["expiration"] = str(int(expiration * 1000))
    return PublishProperties(properties, priority)


def message_properties(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The properties of the py-amqp message ``Producer(channel).publish(**kwargs)`` would send
    (:func:`publish_properties`, with ``priority`` and the content type, encoding and headers
    table); None when ``kwargs`` hold what only kombu's publish handles.
    """
    found = publish_properties(kwargs)
    if found is None:
        return None
    properties = found.properties
    properties.update(
        priority=found.priority,
        content_type=kwargs["content_type"],
        content_encoding=kwargs["content_encoding"],
        application_headers=kwargs.get("headers") or {},
    )
    return properties


#: the publish arguments that are not message properties (``retry``: the target's own, False)
_NOT_PROPERTIES = frozenset(
    {"body", "exchange", "routing_key", "headers", "content_type", "content_encoding", "expiration", "retry"}
)
#: ``Producer.publish`` arguments a replay does not pass: left to kombu if one ever is
_KOMBU_ONLY = frozenset(
    {"serializer", "compression", "declare", "retry_policy", "mandatory", "immediate", "timeout", "confirm_timeout"}
)


class _Encoded(Message):  # type: ignore[misc]
    """A message whose properties were encoded already (py-amqp asks for them when framing)."""

    def __init__(self, encoded: bytes, body: bytes, **properties: Any) -> None:
        super().__init__(body, **properties)
        self.encoded = encoded

    def _serialize_properties(self) -> bytes:
        return self.encoded


def publish(channel: Any, kwargs: dict[str, Any]) -> bool:
    """Publish one message now (a :class:`Frames` of one, written at once); False, nothing sent,
    when ``kwargs`` hold what only kombu's publish handles."""
    frames = Frames(channel)
    if not frames.add(kwargs):
        return False
    frames.flush()
    return True


class Frames:
    """Publishes on the py-amqp ``channel`` of the messages ``Producer(channel).publish(**kwargs)``
    would send, framed into one buffer and written in a few system calls.

    py-amqp writes each publish with a ``sendall`` of its own (and ``basic_publish`` first reads
    any frame waiting, another system call), so a batch of 200 cost 400 system calls, more than
    the framing itself. Here the method, header and body frames are the bytes py-amqp's frame
    writer makes, with the ``basic.publish`` arguments encoded once per exchange and routing key
    and the properties by :func:`encode_properties`; :meth:`flush` writes what was added, and
    :meth:`add` does once the buffer holds :data:`FLUSH_BYTES`. A body too big for one frame
    goes through py-amqp's writer, after the buffer: the broker numbers a confirm-mode channel's
    publishes in the order it reads them, so the order of :meth:`add` calls is kept. The target
    reads the confirms, and a channel the broker closed, when it collects the batch's confirms
    (:class:`.confirms.Confirms`).
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._buffer = bytearray()
        self._publishes = 0

    def add(self, kwargs: dict[str, Any]) -> bool:
        """Frame the message ``kwargs`` describe; False (nothing added) when they hold what only
        kombu's publish handles (a serializer, compression, a body to encode).

        Raises:
            What framing raises for a value AMQP cannot carry (``struct.error``): nothing of
            this message was added. What writing raises (the connection is lost) once a full
            buffer is written.
        """
        properties = message_properties(kwargs)
        if properties is None:
            return False
        encoded = encode_properties(properties)
        body = kwargs["body"]
        method = _method(kwargs["exchange"], kwargs["routing_key"])
        connection = self._connection()
        if encoded is None or len(method) + len(encoded) + len(body) + FRAME_OVERHEAD > connection.frame_max - 8:
            # a value py-amqp encodes itself, or a body split over frames: py-amqp frames it
            self.flush()
            message = Message(body, **properties) if encoded is None else _Encoded(encoded, body, **properties)
            try:
                connection.frame_writer(1, self.channel.channel_id, spec.Basic.Publish, method, message)
            except StopIteration:  # as py-amqp's send_method says it
                raise RecoverableConnectionError("connection already closed") from None
            return True
        channel_id = self.channel.channel_id
        header = _HEADER(_BASIC, 0, len(body)) + encoded
        self._buffer += b"".join(
            (
                _FRAME(1, channel_id, len(method) + 4), _PUBLISH, method, _FRAME_END,
                _FRAME(2, channel_id, len(header)), header, _FRAME_END,
            )
        )  # fmt: skip
        if body:
            self._buffer += b"".join((_FRAME(3, channel_id, len(body)), body, _FRAME_END))
        self._publishes += 1
        if len(self._buffer) >= FLUSH_BYTES:
            self.flush()
        return True

    def flush(self) -> None:
        """Write the frames added so far."""
        if not self._buffer:
            return
        connection = self._connection()
        data, self._buffer = self._buffer, bytearray()
        connection.transport.write(data)
        connection.bytes_sent += self._publishes  # py-amqp counts its writes, for its heartbeats
        self._publishes = 0

    def _connection(self) -> Any:
        connection = self.channel.connection
        if not connection or connection.transport is None:
            raise RecoverableConnectionError("basic_publish: connection closed")
        return connection


#: a batch's frames are written once they are this many bytes (and when the batch ends)
FLUSH_BYTES = 256 * 1024

_FRAME = Struct(">BHI").pack  # type, channel, payload size
_FRAME_END = b"\xce"
_HEADER = Struct(">HHQ").pack  # class, weight, body size
_BASIC = spec.Basic.Publish[0]
_PUBLISH = Struct(">HH").pack(*spec.Basic.Publish)


def _method(exchange: str, routing_key: str) -> bytes:
    """The ``basic.publish`` arguments (ticket, exchange, routing key, mandatory, immediate),
    encoded once per exchange and routing key."""
    key = (exchange, routing_key)
    method = _methods.get(key)
    if method is None:
        if len(_methods) > 1000:  # routing keys made per task: no cache to grow
            _methods.clear()
        method = _methods[key] = dumps("Bssbb", (0, *key, False, False))
    return method


#: :func:`_method` by exchange and routing key
_methods: dict[tuple[str, str], bytes] = {}


# -- the properties, as py-amqp's GenericContent._serialize_properties writes them --------------

_FLAGS = Struct(">H").pack
_OCTET = Struct("B").pack
_LONG = Struct(">I").pack
_LONGLONG = Struct(">Q").pack
_STRING = Struct(">cI").pack
_BOOL = Struct(">cB").pack
_DOUBLE = Struct(">cd").pack
_INT = Struct(">ci").pack
_BIG_INT = Struct(">cq").pack
_INT_MAX = 2147483647  # py-amqp writes a signed 32-bit 'I' within ±this, else a 64-bit 'L'


class _Unknown(Exception):
    """A value this encoder leaves to py-amqp."""


def encode_properties(properties: dict[str, Any]) -> bytes | None:
    """``Message(**properties)._serialize_properties()``, or None when a value is one this
    encoder leaves to py-amqp (it then encodes the message itself, or raises its own error)."""
    flags = 0
    parts = [b""]
    for bit, (key, kind) in _PROPERTIES:
        value = properties.get(key)
        if value is None:
            continue
        flags |= bit
        try:
            parts.append(_PROPERTY_WRITERS[kind](value))
        except (_Unknown, KeyError, StructError):  # KeyError: an item of a type not in _ITEM_WRITERS
            return None
    parts[0] = _FLAGS(flags)
    return b"".join(parts)


def _short_string(value: Any) -> bytes:
    if type(value) is str:
        encoded = value.encode("utf-8", "surrogatepass")
    elif type(value) is bytes:
        encoded = value
    else:
        raise _Unknown
    return _OCTET(len(encoded)) + encoded


def _octet(value: Any) -> bytes:
    if type(value) is not int:
        raise _Unknown
    return _OCTET(value)


def _long_long(value: Any) -> bytes:
    if type(value) is not int:
        raise _Unknown
    return _LONGLONG(value)


def _table(table: Any) -> bytes:
    if type(table) is not dict:
        raise _Unknown
    names, string, writers = _NAMES, _STRING, _ITEM_WRITERS
    parts: list[bytes] = []
    for key, value in table.items():
        name = names.get(key)
        if name is None:
            name = _name(key)
        kind = type(value)
        if kind is str:  # most of a Celery message's headers, inline: a call less each
            encoded = value.encode("utf-8", "surrogatepass")
            parts += (name, string(b"S", len(encoded)), encoded)
        elif value is None:
            parts += (name, b"V")
        else:
            parts += (name, writers[kind](value))
    data = b"".join(parts)
    return _LONG(len(data)) + data


def _array(items: Any) -> bytes:
    data = b"".join([_ITEM_WRITERS[type(v)](v) for v in items])
    return _LONG(len(data)) + data


#: header names as a table writes them (a length octet, then UTF-8): the same few on every message
_NAMES: dict[str, bytes] = {}


def _name(key: Any) -> bytes:
    if type(key) is not str:
        raise _Unknown
    encoded = key.encode("utf-8", "surrogatepass")
    name = _OCTET(len(encoded)) + encoded
    if len(_NAMES) < 1000:
        _NAMES[key] = name
    return name


def _str_item(value: str) -> bytes:
    encoded = value.encode("utf-8", "surrogatepass")
    return _STRING(b"S", len(encoded)) + encoded


def _int_item(value: int) -> bytes:
    return _INT(b"I", value) if -_INT_MAX <= value <= _INT_MAX else _BIG_INT(b"L", value)


_ITEM_WRITERS: dict[type, Callable[[Any], bytes]] = {
    str: _str_item,
    bytes: lambda v: _STRING(b"S", len(v)) + v,
    type(None): lambda _: b"V",
    bool: lambda v: _BOOL(b"t", int(v)),
    int: _int_item,
    float: lambda v: _DOUBLE(b"d", v),
    dict: lambda v: b"F" + _table(v),
    list: lambda v: b"A" + _array(v),
    tuple: lambda v: b"A" + _array(v),
}  # any other type (a datetime, a Decimal, a subclass): KeyError, left to py-amqp

_PROPERTY_WRITERS: dict[str, Callable[[Any], bytes]] = {"s": _short_string, "o": _octet, "L": _long_long, "F": _table}

#: Message.PROPERTIES with each one's flag bit; py-amqp has 14, in one flag word of 15 bits
_PROPERTIES = [(1 << (15 - n), prop) for n, prop in enumerate(Message.PROPERTIES)]
assert len(_PROPERTIES) <= 15, "py-amqp's properties need a second flag word: extend encode_properties"
