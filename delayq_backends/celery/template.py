"""Stored Celery task messages for many ids at once, from one message Celery built.

Bulk loaders schedule millions of calls of one task: running Celery's whole task sender per row
costs about 125 µs. :class:`TaskTemplate` runs it once, with placeholders for what varies per
call (the id, the eta, the arguments and their reprs), and captures that publish exactly as the
plugin captures an ``apply_async`` (:meth:`StoredMessage.capture`). Each row then only fills the
placeholders into the encoded envelope and serializes its arguments: a worker cannot tell the
result from the message ``apply_async(eta=…)`` would have stored.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from celery import Celery
from celery.utils.saferepr import saferepr
from kombu.compression import compress
from kombu.serialization import dumps as serialize

from ..envelope import frame, head
from ..errors import ConfigError
from ..timeutil import from_ms
from .message import StoredMessage

__all__ = ["Capture", "TaskTemplate"]

#: Protocol 2's third body element for a call with no callbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class Capture:
    """A producer that keeps the task message Celery's sender publishes, instead of sending it.

    Only the first publish is the task: a ``task-sent`` event (``task_send_sent_event``) follows
    on the same producer and is dropped.
    """

    def __init__(self) -> None:
        self.body: Any = None
        self.kwargs: dict[str, Any] = {}
        self._taken = False

    def publish(self, body: Any, **kwargs: Any) -> None:
        if not self._taken:
            self.body, self.kwargs, self._taken = body, kwargs, True


def _literal(value: str) -> str:
    """``value`` as it appears in the envelope's details: inside a JSON string (kombu's, ASCII-escaped)."""
    return encode_basestring_ascii(value)[1:-1]


def _plain(value: Any) -> bool:
    return (
        value is None
        or type(value) in (int, bool)
        or (type(value) is str and value.isascii() and value.isprintable() and "\\" not in value and "'" not in value)
    )


def _flat_repr(value: Any, limit: int) -> str | None:
    """``repr(value)`` where it provably equals Celery's ``saferepr`` (a short flat list, tuple or
    dict of ints, bools, None and plain ASCII text), else None. saferepr costs ~7 µs a call."""
    if type(value) in (list, tuple):
        flat = all(_plain(v) for v in value)
    elif type(value) is dict:
        flat = all(type(k) is str and _plain(k) and _plain(v) for k, v in value.items())
    else:
        return None
    text = repr(value) if flat else None
    return text if text is not None and len(text) <= limit // 2 else None


class TaskTemplate:
    """Envelopes of one task, sent with fixed options, for any id, eta and arguments.

    Args:
        app: a Celery app configured as the workers' (broker, routes, serializer); no task code
            is needed, the task is named.
        task: the task name.
        options: ``apply_async`` routing and delivery options fixed for every call (``queue``,
            ``routing_key``, ``exchange``, ``priority``, ``headers``, ``serializer``, ...). Routes
            (``task_routes``) apply as for ``apply_async``, by task name.

    Raises:
        ConfigError: a serializer other than JSON (rows are serialized without Celery's sender).
    """

    def __init__(self, app: Celery, task: str, **options: Any) -> None:
        self.task = task
        marks = {f"dqph{uuid.uuid4().hex}": name for name in ("id", "eta", "argsrepr", "kwargsrepr")}
        mark = {name: m for m, name in marks.items()}
        # as send_task(name, ...) builds it: reply_to is the app's thread oid, ignore_result unset
        message = app.amqp.as_task_v2(
            mark["id"], task, args=(), kwargs={}, eta=mark["eta"], reply_to=app.thread_oid, ignore_result=None
        )
        message.headers.update(argsrepr=mark["argsrepr"], kwargsrepr=mark["kwargsrepr"])
        capture = Capture()
        app.amqp.send_task_message(capture, task, message, **app.amqp.router.route(dict(options), task))
        serializer = capture.kwargs.get("serializer") or "json"
        if serializer != "json":
            raise ConfigError(
                f"task {task!r} is serialized with {serializer!r}: bulk scheduling builds JSON bodies; "
                "set task_serializer='json' (or the serializer='json' option) for these calls"
            )
        self.compression: str | None = capture.kwargs.get("compression")
        maxlevels = app.conf.get("task_repr_maxlevels")  # Celery >= 5.6 passes it to saferepr
        self._repr_args: dict[str, Any] = {} if maxlevels is None else {"maxlevels": maxlevels}
        self._repr_sizes = app.amqp.argsrepr_maxsize, app.amqp.kwargsrepr_maxsize
        # the body is filled per call: capture an empty one, already "serialized" as JSON
        stored = StoredMessage.capture(
            b"", {**capture.kwargs, "content_type": "application/json", "content_encoding": "utf-8"}
        )
        plain = stored.to_envelope()
        self._head = head(plain.target, plain.destination, plain.meta)
        pieces = re.split(f"({'|'.join(marks)})", plain.details.decode("utf-8"))
        self._fixed = pieces[0::2]
        self._slots = [marks[m] for m in pieces[1::2]]

    def body(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
        """The message body as Celery's sender serializes (and compresses) it: protocol 2's
        ``(args, kwargs, embed)``."""
        _, _, data = serialize((args, kwargs, _EMBED), serializer="json")
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return compress(raw, self.compression)[0] if self.compression else raw

    def _repr(self, value: Any, limit: int) -> str:
        """``argsrepr``/``kwargsrepr`` as ``as_task_v2`` writes them."""
        fast = _flat_repr(value, limit)
        return fast if fast is not None else str(saferepr(value, limit, **self._repr_args))

    def envelope(self, task_id: str, ready_ms: int, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
        """The encoded envelope of one call with id ``task_id``, due at ``ready_ms`` (its ``eta``)."""
        args, kwargs = args or (), kwargs or {}  # as as_task_v2 does
        values = {
            "id": task_id,
            "eta": from_ms(ready_ms).isoformat(),
            "argsrepr": self._repr(args, self._repr_sizes[0]),
            "kwargsrepr": self._repr(kwargs, self._repr_sizes[1]),
        }
        literals = {slot: _literal(value) for slot, value in values.items()}
        out = [self._fixed[0]]
        for slot, fixed in zip(self._slots, self._fixed[1:]):
            out += (literals[slot], fixed)
        return frame(self._head, "".join(out).encode("utf-8"), self.body(args, kwargs))
