"""A Celery task message as the delay store keeps it: captured at publish, replayed at its time.

The body is kept as the exact bytes kombu would have sent (serialized and, if configured,
compressed), so a worker cannot tell a replayed message from the original. Headers, properties
and queue declarations go through kombu's JSON, which round-trips datetimes, UUIDs and bytes
that users put in custom headers.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from copy import copy
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, NamedTuple

from celery.utils.time import maybe_make_aware
from dateutil.parser import isoparse
from kombu.compression import compress, decompress
from kombu.entity import Exchange, Queue, binding
from kombu.serialization import dumps as serialize
from kombu.utils.json import dumps as kombu_json_dumps
from kombu.utils.json import loads as kombu_json_loads

from ..envelope import Envelope
from ..errors import EnvelopeError
from ..timeutil import from_ms

__all__ = ["KIND", "StoredMessage", "TaskView", "parse_time", "priority_rank"]

#: ``Envelope.target`` of Celery messages; the forwarder's Celery target has this kind.
KIND = "celery"

#: ``Producer.publish`` arguments that are not message properties. ``expiration`` is left out
#: on purpose: it is relative to the publish, so it is recomputed from ``expires`` at replay.
_PUBLISH_ARGS = frozenset(
    {
        "exchange",
        "routing_key",
        "serializer",
        "compression",
        "retry",
        "retry_policy",
        "declare",
        "headers",
        "timeout",
        "confirm_timeout",
        "content_type",
        "content_encoding",
        "expiration",
        "mandatory",
        "immediate",
    }
)


#: kombu's Redis transport serves priority 0 first and clamps to 0..9 (``Channel.min_priority``/
#: ``max_priority``, ``PRIORITY_STEPS``): the reverse of AMQP, where 255 is the highest.
_REDIS_LOWEST_PRIORITY = 9
_AMQP_HIGHEST_PRIORITY = 255


def priority_rank(priority: Any, driver_type: str) -> int:
    """The delay store rank of a task message's ``priority`` on a broker of kombu's ``driver_type``.

    RabbitMQ (``amqp``) delivers higher priorities first: the rank is the priority (0..255).
    kombu's Redis transport delivers *lower* numbers first (0..9): the rank is ``9 - priority``.
    No priority is rank 0 on every broker, so the usual task costs the store nothing extra
    (on Redis kombu reads a missing priority as 0, its highest; see docs/priority.md). Other
    transports have no priority order of their own to follow: rank 0.
    """
    if priority is None or isinstance(priority, bool):
        return 0
    try:
        value = int(priority)
    except (TypeError, ValueError):
        return 0
    if driver_type == "amqp":
        return min(max(value, 0), _AMQP_HIGHEST_PRIORITY)
    if driver_type == "redis":
        return _REDIS_LOWEST_PRIORITY - min(max(value, 0), _REDIS_LOWEST_PRIORITY)
    return 0


def parse_time(value: Any) -> datetime | None:
    """An aware datetime from a Celery ``eta``/``expires`` header (ISO text or datetime).

    A naive value is read as UTC, as Celery's worker reads it (``maybe_make_aware``).
    """
    if value is None or value == "":
        return None
    when = _isoparse(value) if isinstance(value, str) else value
    if not isinstance(when, datetime):
        raise ValueError(f"not a time: {value!r}")
    aware: datetime = maybe_make_aware(when)
    return aware


def _isoparse(text: str) -> datetime:
    """``datetime.fromisoformat`` (C, ~40x faster: every delayed publish parses its eta) for
    what Celery writes, dateutil's ISO parser for the rest of ISO 8601."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        when: datetime = isoparse(text)
        return when


#: ``Queue.as_dict(recurse=True)`` of the queues Celery declares, by queue object (identity, not
#: kombu's equality, which ignores some arguments): the same few app queues are declared on every
#: publish, and walking them costs more than the rest of the capture.
_declarations: dict[int, tuple[weakref.ref[Queue], dict[str, Any]]] = {}


def _declaration(queue: Queue) -> dict[str, Any]:
    cached = _declarations.get(id(queue))
    if cached is not None and cached[0]() is queue:
        return cached[1]
    found: dict[str, Any] = queue.as_dict(recurse=True)
    if len(_declarations) > 1000:  # queues made per call (a dict route): no cache to grow
        _declarations.clear()
    _declarations[id(queue)] = (weakref.ref(queue), found)
    return found


@dataclass(frozen=True)
class StoredMessage:
    """Everything ``Producer.publish`` needs to send the task message again, byte for byte.

    Attributes:
        task: the task name (shown by ``delayq list`` and kept for audits).
        body: the serialized (and possibly compressed) body.
        headers: the protocol-2 headers, ``eta`` and ``expires`` included.
        properties: message properties (correlation_id, reply_to, priority, delivery_mode, ...).
        exchange: the exchange the message was routed to ('' for the default exchange).
        routing_key: the routing key Celery chose.
        declare: kombu Queue declarations (``Queue.as_dict(recurse=True)``) to declare first.
    """

    task: str
    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    exchange: str
    routing_key: str
    declare: list[dict[str, Any]] = field(default_factory=list)

    # -- capture ----------------------------------------------------------------------------

    @classmethod
    def capture(cls, body: Any, publish_kwargs: Mapping[str, Any]) -> StoredMessage:
        """Build from the arguments Celery's task sender passes to ``Producer.publish``.

        Serializes and compresses exactly as kombu's ``Producer._prepare`` does.
        """
        headers = dict(publish_kwargs.get("headers") or {})
        content_type = publish_kwargs.get("content_type")
        content_encoding = publish_kwargs.get("content_encoding")
        if content_type:  # already serialized by the caller
            data = body.encode(content_encoding or "utf-8") if isinstance(body, str) else bytes(body)
            content_encoding = content_encoding or ("utf-8" if isinstance(body, str) else "binary")
        else:
            content_type, content_encoding, data = serialize(body, serializer=publish_kwargs.get("serializer"))
        compression = publish_kwargs.get("compression")
        if compression:
            data, headers["compression"] = compress(data, compression)
        exchange = publish_kwargs.get("exchange") or ""
        # None values are left out, except an explicit priority=None: kombu's publish would
        # otherwise default it to 0, a property the native message does not have on AMQP
        properties = {
            k: v for k, v in publish_kwargs.items() if k not in _PUBLISH_ARGS and (v is not None or k == "priority")
        }
        return cls(
            task=str(headers.get("task", "")),
            body=data if isinstance(data, bytes) else str(data).encode(content_encoding or "utf-8"),
            content_type=str(content_type),
            content_encoding=str(content_encoding),
            headers=headers,
            properties=properties,
            exchange=exchange.name if isinstance(exchange, Exchange) else str(exchange),
            routing_key=str(publish_kwargs.get("routing_key") or ""),
            declare=[_declaration(q) for q in publish_kwargs.get("declare") or () if isinstance(q, Queue)],
        )

    @property
    def task_id(self) -> str:
        return str(self.headers["id"])

    @property
    def eta(self) -> datetime | None:
        return parse_time(self.headers.get("eta"))

    @property
    def expires(self) -> datetime | None:
        return parse_time(self.headers.get("expires"))

    # -- the envelope -----------------------------------------------------------------------

    def to_envelope(self) -> Envelope:
        """The envelope to store; raises :class:`EnvelopeError` for headers kombu cannot encode.

        Everything but the body goes into the envelope's ``details`` as one kombu JSON document
        (kombu's, so datetimes, UUIDs and bytes in custom headers round-trip), compacted so it
        costs less than the headers on the wire: copies of the task id (``root_id``,
        ``correlation_id``) are written as null and flagged, protocol 2 headers and queue
        declarations leave out their default values, and the task name is kept once, in its
        header (docs/envelope.md).
        """
        task_id = self.headers.get("id")
        headers, root_copy = _id_copy_nulled(self.headers, "root_id", task_id)
        properties, correlation_copy = _id_copy_nulled(self.properties, "correlation_id", task_id)
        destination = self.routing_key or self.exchange
        details: dict[str, Any] = {
            "ct": self.content_type,
            "ce": self.content_encoding,
            "x": self.exchange,
            "rk": self.routing_key,
            "s": _shaped(headers),
            "h": headers,
            "p": properties,
            "q": [_compact_declaration(d) for d in self.declare],
            "i": root_copy * _ROOT_ID_COPY | correlation_copy * _CORRELATION_ID_COPY,
        }
        details["h"] = _compact_headers(headers, details["s"])
        if self.task != str(self.headers.get("task", "")):
            details["task"] = self.task
        details = _strip(details, _detail_defaults(destination))
        try:
            encoded = kombu_json_dumps(details, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise EnvelopeError(
                f"task {task_id!r}: headers or properties cannot be stored ({exc}); "
                "pass JSON-serializable values (str, numbers, lists, dicts, datetimes)"
            ) from exc
        return Envelope(target=KIND, destination=destination, body=self.body, details=encoded)

    @classmethod
    def from_envelope(cls, envelope: Envelope) -> StoredMessage:
        """Parse a stored envelope (either format); raises :class:`EnvelopeError` saying what is missing."""
        try:
            if not envelope.details:  # format 1: kombu's JSON as a string in the envelope's meta
                return cls._from_v1(envelope)
            stored = _json_loads(envelope.details)
            details = {**_detail_defaults(envelope.destination), **stored}
            copies, properties = int(details["i"]), _object(details, "p")
            headers = _full_headers(_object(details, "h"), int(details["s"]))
            if copies & _ROOT_ID_COPY:
                headers["root_id"] = _copied_id(headers, "root_id")
            if copies & _CORRELATION_ID_COPY:
                properties["correlation_id"] = _copied_id(headers, "correlation_id")
            return cls(
                task=str(details.get("task", headers.get("task", ""))),
                body=envelope.body,
                content_type=str(details["ct"]),
                content_encoding=str(details["ce"]),
                headers=headers,
                properties=properties,
                exchange=str(details["x"]),
                routing_key=str(details["rk"]),
                declare=[_read_declaration(d) for d in details["q"]],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EnvelopeError(f"not a delayq Celery message: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_v1(cls, envelope: Envelope) -> StoredMessage:
        meta = envelope.meta
        details = kombu_json_loads(meta["k"])
        return cls(
            task=str(meta.get("task", "")),
            body=envelope.body,
            content_type=str(meta["ct"]),
            content_encoding=str(meta["ce"]),
            headers=dict(details["h"]),
            properties=dict(details["p"]),
            exchange=str(meta["x"]),
            routing_key=str(meta["rk"]),
            declare=list(details["q"]),
        )

    # -- what a person reads ---------------------------------------------------------------

    def view(self) -> TaskView:
        """The task as ``delayq list|get`` and the dashboard show it.

        Arguments are decoded only from a JSON body (its own content type says so): any other
        serializer is named and left as bytes, never unpickled; Celery's ``argsrepr`` and
        ``kwargsrepr`` headers (written by the sender for every serializer) are shown instead.
        """
        args: Any = None
        kwargs: Any = None
        note = None
        if self.content_type == "application/json":
            try:
                raw = self.body
                if self.headers.get("compression"):
                    raw = decompress(raw, self.headers["compression"])
                decoded = kombu_json_loads(raw.decode(self.content_encoding or "utf-8"))
                args, kwargs = decoded[0], decoded[1]
            except Exception as exc:  # shown, not fatal: the listing goes on
                note = f"the JSON body cannot be decoded: {type(exc).__name__}: {exc}"
        else:
            note = f"{self.content_type} body, not decoded (only JSON is): argsrepr/kwargsrepr shown"
        queues = [str(d["name"]) for d in self.declare if d.get("name")]
        return TaskView(
            id=str(self.headers.get("id", "")),
            task=self.task,
            args=args,
            kwargs=kwargs,
            argsrepr=_text(self.headers.get("argsrepr")),
            kwargsrepr=_text(self.headers.get("kwargsrepr")),
            eta=_text(self.headers.get("eta")),
            expires=_text(self.headers.get("expires")),
            queue=queues[0] if queues else self.routing_key or self.exchange,
            priority=self.properties.get("priority"),
            retries=int(self.headers.get("retries") or 0),
            content_type=self.content_type,
            note=note,
        )

    # -- replay -----------------------------------------------------------------------------

    def publish_kwargs(self, *, ready_ms: int, now: datetime | None = None) -> dict[str, Any]:
        """Arguments of ``Producer.publish(**kwargs)`` to send this message at ``ready_ms``.

        - ``eta`` is set to the time the store released it (``ready_ms``) when that differs from
          the header by more than a millisecond: after a reschedule to an earlier time the worker
          must not hold the task until the old eta.
        - ``expiration`` is recomputed from ``expires``. When ``expires`` has passed none is set,
          so the worker receives the task and marks it REVOKED (expired) instead of the broker
          silently dropping it.
        """
        headers = dict(self.headers)
        eta = self.eta
        if eta is not None and abs(eta.timestamp() * 1000 - ready_ms) > 1:
            headers["eta"] = from_ms(ready_ms).isoformat()
        kwargs: dict[str, Any] = dict(self.properties)
        expires = self.expires
        if expires is not None:
            left = (expires - (now or datetime.now(timezone.utc))).total_seconds()
            if left > 0:
                kwargs["expiration"] = left
        kwargs.update(
            body=self.body,
            exchange=self.exchange,
            routing_key=self.routing_key,
            headers=headers,
            content_type=self.content_type,
            content_encoding=self.content_encoding,
            declare=[_queue(d) for d in self.declare],
            retry=False,  # the forwarder handles outages: release, back off, try again
        )
        return kwargs


def _json_loads(data: bytes) -> Any:
    """kombu's JSON decoding; plain ``json.loads`` (no Python hook per object: a third of a
    replay's cost) when no kombu-typed value (``"__type__"``: a datetime, a UUID, bytes) is in it."""
    return kombu_json_loads(data) if b'"__type__"' in data else json.loads(data)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


@dataclass(frozen=True)
class TaskView:
    """A stored Celery task as a person reads it (``args``/``kwargs`` None unless the body is JSON).

    ``periodic`` names the ``beat_schedule`` entry when the item is a periodic entry (its next run).
    """

    id: str
    task: str
    args: Any
    kwargs: Any
    argsrepr: str | None
    kwargsrepr: str | None
    eta: str | None
    expires: str | None
    queue: str
    priority: int | None
    retries: int
    content_type: str
    note: str | None
    periodic: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: What ``Queue.as_dict(recurse=True)`` holds when a queue (and its exchange) sets nothing but
#: its names: stored declarations leave these values out, and reading puts them back. Part of
#: envelope format 2: changing a value here would change how stored envelopes read.
_QUEUE_DEFAULTS: dict[str, Any] = {
    "queue_arguments": None, "binding_arguments": None, "consumer_arguments": None, "durable": True,
    "exclusive": False, "auto_delete": False, "no_ack": False, "alias": None, "bindings": [], "no_declare": None,
    "expires": None, "message_ttl": None, "max_length": None, "max_length_bytes": None, "max_priority": None,
}  # fmt: skip
#: Details left out when they have these values (see also :func:`_detail_defaults`), and the
#: ``i`` flags saying which headers were copies of the task id. Part of format 2.
_DETAIL_DEFAULTS: dict[str, Any] = {"ct": "application/json", "ce": "utf-8", "x": "", "i": 0, "s": 0}
_ROOT_ID_COPY, _CORRELATION_ID_COPY = 1, 2
_EXCHANGE_DEFAULTS: dict[str, Any] = {
    "type": "direct", "arguments": None, "durable": True, "passive": False, "auto_delete": False,
    "delivery_mode": None, "no_declare": False,
}  # fmt: skip


#: Celery's protocol 2 headers in the order ``as_task_v2`` writes them (5.5 and later; earlier
#: versions write a prefix of it), with the value a plain call gives each (``_NO_DEFAULT`` for
#: those that vary). When a message's first ``s`` headers are the first ``s`` of these, stored
#: details leave out the default values, and reading puts them back in this order. Part of format 2.
_NO_DEFAULT = object()
_HEADER_DEFAULTS: dict[str, Any] = {
    "lang": "py", "task": _NO_DEFAULT, "id": _NO_DEFAULT, "shadow": None, "eta": _NO_DEFAULT, "expires": None,
    "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": _NO_DEFAULT,
    "parent_id": None, "argsrepr": _NO_DEFAULT, "kwargsrepr": _NO_DEFAULT, "origin": _NO_DEFAULT,
    "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
}  # fmt: skip
_HEADER_ORDER = tuple(_HEADER_DEFAULTS)
#: the defaults a reader gets a copy of (see :func:`_fresh`)
_HEADER_CONTAINERS = frozenset(k for k, v in _HEADER_DEFAULTS.items() if isinstance(v, (list, dict)))
_QUEUE_CONTAINERS = frozenset(k for k, v in _QUEUE_DEFAULTS.items() if isinstance(v, (list, dict)))


def _shaped(headers: dict[str, Any]) -> int:
    """How many of the first headers are, in order, the first of :data:`_HEADER_ORDER`."""
    count = 0
    for key, expected in zip(headers, _HEADER_ORDER):
        if key != expected:
            break
        count += 1
    return count


def _compact_headers(headers: dict[str, Any], shaped: int) -> dict[str, Any]:
    """``headers`` without the default values of its first ``shaped`` (see :data:`_HEADER_DEFAULTS`)."""
    compact = dict(headers)
    for key in _HEADER_ORDER[:shaped]:
        default = _HEADER_DEFAULTS[key]
        if default is not _NO_DEFAULT and _is_default(compact[key], default):
            del compact[key]  # the others keep their order
    return compact


class _Leading(NamedTuple):
    """What reading puts back for the first ``n`` protocol 2 headers (see :data:`_HEADER_DEFAULTS`)."""

    #: those headers in order, each its default (``_NO_DEFAULT`` where it has none)
    defaults: dict[str, Any]
    #: those without a default: a message must hold them
    required: tuple[str, ...]
    #: those whose default is a list or dict, copied for each reader
    containers: tuple[str, ...]


def _leading(keys: tuple[str, ...]) -> _Leading:
    return _Leading(
        {k: _HEADER_DEFAULTS[k] for k in keys},
        tuple(k for k in keys if _HEADER_DEFAULTS[k] is _NO_DEFAULT),
        tuple(k for k in keys if k in _HEADER_CONTAINERS),
    )


#: by how many of the first headers are shaped (worked out once: every replay reads headers)
_LEADING = [_leading(_HEADER_ORDER[:n]) for n in range(len(_HEADER_ORDER) + 1)]


def _full_headers(compact: dict[str, Any], shaped: int) -> dict[str, Any]:
    leading = _LEADING[len(_HEADER_ORDER[:shaped])]
    headers = leading.defaults.copy()
    headers.update(compact)  # a leading header keeps its place, the others follow in their order
    for key in leading.required:
        if headers[key] is _NO_DEFAULT:
            raise KeyError(f"header {key!r} is missing")
    for key in leading.containers:
        if key not in compact:
            headers[key] = headers[key].copy()  # a list or dict default: each reader gets its own
    return headers


@lru_cache(maxsize=1024)
def _detail_defaults(destination: str) -> dict[str, Any]:
    """:data:`_DETAIL_DEFAULTS`, and what Celery's routing gives a queue by default: the routing key
    is the envelope's destination, and the one queue declared is named so, bound by that key to a
    direct exchange of that name (``task_default_queue``, ``queue=`` options). One dict per
    destination (every replay reads it), so it is only read."""
    plain = {"name": destination, "exchange": {"name": destination}, "routing_key": destination}
    return {**_DETAIL_DEFAULTS, "rk": destination, "q": [plain]}


def _is_default(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default  # True is not 1: both must match


def _strip(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not (k in defaults and _is_default(v, defaults[k]))}


def _compact_declaration(declaration: dict[str, Any]) -> dict[str, Any]:
    """A queue declaration without the values :func:`_full_declaration` puts back."""
    compact = _strip(declaration, _QUEUE_DEFAULTS)
    if isinstance(compact.get("exchange"), dict):
        compact["exchange"] = _strip(compact["exchange"], _EXCHANGE_DEFAULTS)
    return compact


def _full_declaration(compact: dict[str, Any]) -> dict[str, Any]:
    full = {**_QUEUE_DEFAULTS, **compact}
    for key in _QUEUE_CONTAINERS.difference(compact):
        full[key] = _fresh(full[key])
    if isinstance(full.get("exchange"), dict):
        full["exchange"] = {**_EXCHANGE_DEFAULTS, **full["exchange"]}  # no containers among these
    return full


def _fresh(default: Any) -> Any:
    """A copy of a default list or dict (none nests another), so a reader may change what it gets."""
    return copy(default) if isinstance(default, (list, dict)) else default


def _id_copy_nulled(values: dict[str, Any], key: str, task_id: Any) -> tuple[dict[str, Any], bool]:
    """``values`` with ``values[key]`` nulled if it is a copy of the task id (the key keeps its
    place, so the message is rebuilt header for header), and whether it was."""
    if not isinstance(task_id, str) or type(values.get(key)) is not str or values[key] != task_id:
        return values, False
    return {**values, key: None}, True


def _object(details: dict[str, Any], key: str) -> dict[str, Any]:
    value = details[key]
    if not isinstance(value, dict):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not an object")
    return dict(value)


def _copied_id(headers: dict[str, Any], key: str) -> str:
    task_id = headers.get("id")
    if not isinstance(task_id, str):
        raise ValueError(f"{key} is stored as a copy of the task id, but there is no id header")
    return task_id


#: Full declarations by the ``repr`` of the stored (compact) one; kombu Queues by their
#: declaration's ``repr``, and by the identity of a declaration read here (kept in
#: ``_read_declarations``, so its id is its own): a replayed batch declares the same few queues
#: over and over, and building a Queue and its Exchange (or the ``repr`` of a full declaration)
#: costs more than the rest of a replay. Shared as Celery shares its app's Queue objects
#: between publishes, so a message's declarations are only read.
_read_declarations: dict[str, dict[str, Any]] = {}
_queues_read: dict[int, Queue | None] = {}
_queues: dict[str, Queue] = {}


def _read_declaration(compact: dict[str, Any]) -> dict[str, Any]:
    """:func:`_full_declaration` of a stored declaration, one dict for equal ones."""
    key = repr(compact)
    found = _read_declarations.get(key)
    if found is None:
        if len(_read_declarations) > 1000:  # queues named per task: no cache to grow
            _read_declarations.clear()
            _queues_read.clear()
        found = _read_declarations[key] = _full_declaration(compact)
        _queues_read[id(found)] = None
    return found


def _queue(declaration: dict[str, Any]) -> Queue:
    """A kombu Queue from ``Queue.as_dict(recurse=True)``."""
    found = _queues_read.get(id(declaration))
    if found is not None:
        return found
    key = repr(declaration)
    found = _queues.get(key)
    if found is None:
        if len(_queues) > 1000:
            _queues.clear()
        found = _queues[key] = _new_queue(declaration)
    if id(declaration) in _queues_read:
        _queues_read[id(declaration)] = found
    return found


def _new_queue(declaration: dict[str, Any]) -> Queue:
    d = dict(declaration)
    exchange = d.pop("exchange", None)
    bindings = d.pop("bindings", None) or []
    return Queue(
        exchange=Exchange(**exchange) if isinstance(exchange, dict) else exchange,
        bindings=[_binding(b) for b in bindings] or None,
        **d,
    )


def _binding(b: dict[str, Any]) -> binding:
    exchange = b.get("exchange")
    return binding(
        Exchange(**exchange) if isinstance(exchange, dict) else exchange,
        routing_key=b.get("routing_key") or "",
        arguments=b.get("arguments"),
        unbind_arguments=b.get("unbind_arguments"),
    )
