"""What a bulk-scheduled row becomes: a Celery task message, an RQ job, or a Redis-list body.

A target is a small frozen description shipped to the executors. There, :meth:`open` makes its
:class:`RowWriter` once per partition, so the costly set-up (a Celery app and its message
template, an RQ queue) happens once per partition and each row only fills in its own values.
Nothing here imports pyspark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..envelope import Envelope, Group, with_groups
from ..errors import DelayqError
from ..store import DelayStore

__all__ = ["CeleryTask", "ListTarget", "RQJob", "RowError", "RowWriter", "RowKind"]

#: One accepted row on its way to the store: id, ready ms, envelope bytes, and what the writer
#: keeps for :meth:`RowWriter.flush` (an RQ job), else None.
Accepted = tuple[str, int, bytes, Any]


class RowError(DelayqError, ValueError):
    """A row value the target cannot use (arguments that are not a list, a body of the wrong type)."""


class RowWriter(Protocol):
    """Turns rows of one partition into envelopes; made by :meth:`RowKind.open` on an executor."""

    def prepare(
        self, item_id: str, ready_ms: int, values: Sequence[Any], groups: tuple[Group, ...]
    ) -> tuple[bytes, Any]:
        """The envelope of one row (``values`` in :attr:`RowKind.columns` order), carrying its
        ``groups`` (none: ``()``) where its worker reads them too, and what :meth:`flush` needs
        of it. Raises a :class:`DelayqError` for a row to reject."""
        ...

    def flush(self, accepted: Sequence[Accepted]) -> None:
        """Write what must exist before the rows' ids reach the store (RQ's job hashes)."""
        ...

    def close(self) -> None: ...


class RowKind(Protocol):
    """A picklable description of where rows go; see :class:`CeleryTask`, :class:`RQJob`, :class:`ListTarget`."""

    @property
    def columns(self) -> list[str | None]:
        """The row columns the writer reads, in order (None: not used)."""
        ...

    def open(self, store: DelayStore) -> RowWriter: ...


def as_args(value: Any, column: str | None) -> list[Any]:
    """Positional arguments from an array column or a JSON text column; null means none."""
    if value is None:
        return []
    if isinstance(value, str):
        value = _json(value, column)
    if isinstance(value, (list, tuple)):
        return list(value)
    raise RowError(f"column {column!r} holds {type(value).__name__} {value!r}: positional arguments must be a list")


def as_kwargs(value: Any, column: str | None) -> dict[str, Any]:
    """Keyword arguments from a struct, a map (Arrow gives key-value pairs) or a JSON text column."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = _json(value, column)
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    raise RowError(f"column {column!r} holds {type(value).__name__} {value!r}: keyword arguments must be an object")


def _json(text: str, column: str | None) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RowError(f"column {column!r} is not valid JSON ({exc}): {text[:80]!r}") from exc


def _pick(values: Sequence[Any], index: int) -> Any:
    return values[index] if index < len(values) else None


def _destination(value: Any, default: str | None, what: str) -> str:
    chosen = value if value is not None else default
    if not isinstance(chosen, str) or not chosen:
        raise RowError(f"no {what} for this row: set the target's {what} or fill its column")
    return chosen


# -- Celery -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CeleryTask:
    """Rows become calls of the Celery task ``name``, stored as ``apply_async(eta=…)`` stores them.

    Args:
        name: the task name, as the workers register it.
        broker_url: the workers' broker (routing and declarations follow it).
        args_col, kwargs_col: columns of positional (array or JSON text) and keyword (struct,
            map or JSON text) arguments.
        queue, queue_col: a fixed queue, or a column naming each row's queue.
        options: further ``apply_async`` options fixed for every row (``priority``,
            ``routing_key``, ``exchange``, ``headers``).
        config: Celery settings of the workers' app that shape messages (``task_routes``,
            ``task_default_queue``, ``task_compression``, ...).
    """

    name: str
    broker_url: str
    args_col: str | None = None
    kwargs_col: str | None = None
    queue: str | None = None
    queue_col: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str | None]:
        return [self.args_col, self.kwargs_col, self.queue_col]

    def open(self, store: DelayStore) -> RowWriter:
        return _CeleryWriter(self)


class _CeleryWriter:
    def __init__(self, spec: CeleryTask) -> None:
        from celery import Celery

        from ..celery.message import StoredMessage
        from ..celery.slots import GROUP_HEADER
        from ..celery.template import TaskTemplate

        self.spec = spec
        self.message_class, self.group_header = StoredMessage, GROUP_HEADER
        self.app = Celery("delayq-bulk", set_as_current=False)
        self.app.conf.update(broker_url=spec.broker_url, **spec.config)
        self.template_class = TaskTemplate  # imported here: Celery is optional for the other targets
        self.templates: dict[str | None, Any] = {}  # one per queue: Celery's sender runs once each

    def prepare(
        self, item_id: str, ready_ms: int, values: Sequence[Any], groups: tuple[Group, ...]
    ) -> tuple[bytes, Any]:
        queue = _pick(values, 2) or self.spec.queue
        template = self.templates.get(queue)
        if template is None:
            options = dict(self.spec.options, **({"queue": queue} if queue else {}))
            template = self.templates[queue] = self.template_class(self.app, self.spec.name, **options)
        args = as_args(_pick(values, 0), self.spec.args_col)
        kwargs = as_kwargs(_pick(values, 1), self.spec.kwargs_col)
        data = template.envelope(item_id, ready_ms, args, kwargs)
        if not groups:
            return data, None
        # in the header the worker holds them by, as the sender writes it (a grouped row pays
        # for the decoding, the others do not)
        message = self.message_class.from_envelope(Envelope.decode(data))
        headers = {**message.headers, self.group_header: [g.to_meta() for g in groups]}
        return with_groups(replace(message, headers=headers).to_envelope(), groups).encode(), None

    def flush(self, accepted: Sequence[Accepted]) -> None:
        """Celery messages need nothing besides the store entry."""

    def close(self) -> None:
        self.app.close()


# -- RQ -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RQJob:
    """Rows become RQ jobs of ``func``, saved and stored as ``delayq_backends.rq.Queue.enqueue_at`` does.

    Args:
        func: the job function's import path (``app.tasks.send_reminder``); not imported here.
        redis_url: RQ's Redis, where the job hashes live (may be the store's).
        queue, queue_col: a fixed queue name, or a column naming each row's queue.
        args_col, kwargs_col: as for :class:`CeleryTask`.
        job_options: ``Queue.create_job`` options for every job (``timeout``, ``result_ttl``,
            ``ttl``, ``failure_ttl``, ``description``, ``meta``).
    """

    func: str
    redis_url: str
    queue: str = "default"
    queue_col: str | None = None
    args_col: str | None = None
    kwargs_col: str | None = None
    job_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str | None]:
        return [self.args_col, self.kwargs_col, self.queue_col]

    def open(self, store: DelayStore) -> RowWriter:
        return _RQWriter(self, store)


class _RQWriter:
    def __init__(self, spec: RQJob, store: DelayStore) -> None:
        import redis
        from rq.job import JobStatus

        from ..rq import Queue
        from ..rq.queue import GROUP_META

        self.spec = spec
        self.group_meta = GROUP_META
        self.store = store
        self.connection = redis.Redis.from_url(spec.redis_url)
        self.queue_class = Queue
        self.scheduled = JobStatus.SCHEDULED
        self.queues: dict[str, tuple[Any, bytes]] = {}  # name -> (queue, its encoded envelope)

    def _queue(self, name: str) -> tuple[Any, bytes]:
        known = self.queues.get(name)
        if known is None:
            queue = self.queue_class(name, connection=self.connection, delay_store=self.store)
            known = self.queues[name] = (queue, queue.envelope().encode())
        return known

    def prepare(
        self, item_id: str, ready_ms: int, values: Sequence[Any], groups: tuple[Group, ...]
    ) -> tuple[bytes, Any]:
        queue, envelope = self._queue(_destination(_pick(values, 2), self.spec.queue, "queue"))
        options = dict(self.spec.job_options)
        if groups:  # in the job's meta too: the worker holds them by it
            options["meta"] = {**(options.get("meta") or {}), self.group_meta: [g.to_meta() for g in groups]}
            envelope = with_groups(Envelope.decode(envelope), groups).encode()
        job = queue.create_job(
            self.spec.func,
            args=tuple(as_args(_pick(values, 0), self.spec.args_col)),  # as enqueue_at(f, *args) passes them
            kwargs=as_kwargs(_pick(values, 1), self.spec.kwargs_col),
            job_id=item_id,
            status=self.scheduled,
            **options,
        )
        return envelope, (queue, job)

    def flush(self, accepted: Sequence[Accepted]) -> None:
        """Save the job hashes first: an id due at once must not reach a forwarder before its job."""
        from ..timeutil import from_ms

        with self.connection.pipeline() as pipe:
            for _, ready_ms, _, (queue, job) in accepted:
                queue.save_scheduled(job, from_ms(ready_ms), pipe)
            pipe.execute()

    def close(self) -> None:
        self.connection.close()


# -- a Redis list -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListTarget:
    """Rows become bodies pushed onto a Redis list at their time (``RedisListTarget``).

    Args:
        body_col: the body: text (UTF-8), binary, or a struct/array (JSON-encoded).
        list_key, list_col: a fixed list key, or a column naming each row's list.
    """

    body_col: str
    list_key: str | None = None
    list_col: str | None = None

    @property
    def columns(self) -> list[str | None]:
        return [self.body_col, self.list_col]

    def open(self, store: DelayStore) -> RowWriter:
        return _ListWriter(self)


class _ListWriter:
    def __init__(self, spec: ListTarget) -> None:
        from ..targets import RedisListTarget

        self.spec = spec
        self.envelope = RedisListTarget.envelope

    def prepare(
        self, item_id: str, ready_ms: int, values: Sequence[Any], groups: tuple[Group, ...]
    ) -> tuple[bytes, Any]:
        key = _destination(_pick(values, 1), self.spec.list_key, "list key")
        envelope = self.envelope(key, _body(values[0], self.spec.body_col))
        return (with_groups(envelope, groups) if groups else envelope).encode(), None

    def flush(self, accepted: Sequence[Accepted]) -> None:
        """A list body needs nothing besides the store entry."""

    def close(self) -> None:
        """Nothing to release."""


def _body(value: Any, column: str) -> bytes:
    if isinstance(value, (dict, list)):
        value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise RowError(f"column {column!r} holds {type(value).__name__} {value!r}: a body is text, binary or JSON")
