"""The audit log: one record per item forwarded, and per task or job started by a worker.

Forwarders (``delayq forward --audit-dir/--audit-stream``) and worker helpers
(:func:`delayq_backends.celery.audit.record_executions`, ``delayq_backends.rq.audit.AuditWorker``)
write :class:`AuditRecord` s to rotating JSON-lines files or to a Redis stream of bounded length;
``delayq spark audit`` reads them back to measure lateness and find lost, doubled and early jobs.

Auditing must never slow or break the work it watches: records go through a bounded in-memory
queue to a background thread, which drops (and counts) what it cannot keep up with, and every
write error is logged, never raised.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from .connection import connect
from .errors import ConfigError

__all__ = [
    "AuditLog",
    "AuditRecord",
    "AuditSink",
    "JsonLinesAudit",
    "RedisStreamAudit",
    "audit_from_env",
    "open_audit",
    "read_stream",
    "stream_record",
]

log = logging.getLogger("delayq.audit")

#: Events of the log: an item left the store for its broker / a worker started it.
FORWARDED, EXECUTED = "forwarded", "executed"


@dataclass(frozen=True)
class AuditRecord:
    """One event of one item.

    Attributes:
        event: ``forwarded`` or ``executed``.
        id: the item (task/job) id.
        target: ``celery``, ``rq`` or ``list``.
        queue: the queue (or list) it went to.
        ready_ms: when it was due, in epoch ms (None where a worker cannot know it).
        at_ms: when it was forwarded or started, in epoch ms.
        attempt: the store's delivery attempt (forwarded); for ``executed``, a number that differs
            between retries of one task or job (Celery's ``retries``, RQ's retries left), so a
            retry is not mistaken for a duplicate run.
        by: the forwarder or worker that did it.
    """

    event: str
    id: str
    target: str
    queue: str
    ready_ms: int | None
    at_ms: int
    attempt: int
    by: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)


class AuditSink(Protocol):
    """What a :class:`~delayq_backends.forwarder.Forwarder` writes its records to."""

    def record(self, records: Sequence[AuditRecord]) -> None: ...

    def close(self) -> None: ...


class AuditLog:
    """Where records go: the base of :class:`JsonLinesAudit` and :class:`RedisStreamAudit`.

    :meth:`record` never blocks and never raises. With ``background=True`` (the default) a thread
    writes; a process that exits right after its work (an RQ work horse) passes False to write at
    once. After a fork the child starts its own thread.

    Args:
        max_pending: records held in memory before new ones are dropped (and counted).
    """

    def __init__(self, *, background: bool = True, max_pending: int = 100_000) -> None:
        self.background = background
        self.max_pending = max_pending
        self.dropped = 0
        self.failed = 0
        self._pid = -1
        self._queue: queue.Queue[Sequence[AuditRecord] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def record(self, records: Sequence[AuditRecord]) -> None:
        """Log ``records``; a full queue drops them (counted in :attr:`dropped`)."""
        if not records:
            return
        if not self.background:
            self._write_safely(records)
            return
        self._ensure_thread()
        if self._queue.qsize() >= self.max_pending:
            self.dropped += len(records)
            return
        self._queue.put_nowait(list(records))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything recorded so far is written; False if that took over ``timeout``."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._queue.unfinished_tasks

    def close(self) -> None:
        """Write what is pending (up to 10 s), stop the thread, release files or connections."""
        if self._thread is not None and self._pid == os.getpid():
            self._queue.put(None)
            self._thread.join(timeout=10)
        self._thread = None
        self.release()

    # -- for subclasses -------------------------------------------------------------------------

    def write(self, records: Sequence[AuditRecord]) -> None:
        """Write one batch; may raise (the caller logs it)."""
        raise NotImplementedError

    def release(self) -> None:
        """Close files or connections (after the writer thread has stopped)."""

    def forked(self) -> None:
        """Drop what was inherited from the parent process (open files, connections)."""

    # -- internals ----------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._pid != -1:  # a forked child: the parent's thread and queue are not ours
                self._queue = queue.Queue()
                self.forked()
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._drain, name="delayq-audit", daemon=True)
            self._thread.start()
            atexit.register(self.flush, 2.0)  # a process that exits normally writes what it recorded

    def _drain(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                self._write_safely(batch)
            finally:
                self._queue.task_done()

    def _write_safely(self, records: Sequence[AuditRecord]) -> None:
        try:
            self.write(records)
        except Exception as exc:  # auditing must never break the work it watches
            self.failed += len(records)
            log.warning("audit log %r lost %d records: %s: %s", self, len(records), type(exc).__name__, exc)


class JsonLinesAudit(AuditLog):
    """JSON lines in ``directory``, one file per process at a time, rotated at ``max_bytes``.

    Files are named ``<stem>-<host>-<pid>-<start ms>.jsonl``, so many forwarders and worker
    processes can share one directory (a network share, or one later gathered) without
    interleaving lines. Rotated files are kept: removing old ones is the reader's decision.
    """

    def __init__(self, directory: str | Path, *, stem: str = "audit", max_bytes: int = 64 * 1024 * 1024, **kw: Any):
        super().__init__(**kw)
        self.directory = Path(directory)
        self.stem = stem
        self.max_bytes = max_bytes
        self._file: TextIO | None = None
        self._size = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"audit directory {self.directory} cannot be made ({exc}): pass a writable one") from exc

    def write(self, records: Sequence[AuditRecord]) -> None:
        text = "".join(r.to_json() + "\n" for r in records)
        if self._file is None or self._size >= self.max_bytes:
            self.release()
            name = f"{self.stem}-{socket.gethostname()}-{os.getpid()}-{time.time_ns() // 1_000_000}.jsonl"
            self._file = (self.directory / name).open("a", encoding="utf-8")
            self._size = 0
        self._file.write(text)
        self._file.flush()  # readers (and a crash) see whole batches
        self._size += len(text)

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def forked(self) -> None:
        self._file = None  # the parent's file: the child writes its own

    def __repr__(self) -> str:
        return f"JsonLinesAudit({str(self.directory)!r})"


class RedisStreamAudit(AuditLog):
    """Entries of a Redis stream, trimmed to about ``maxlen`` (``XADD MAXLEN ~``).

    Each entry holds the record's fields as strings (``ready_ms`` is empty when unknown).
    """

    def __init__(self, url: str, stream: str, *, maxlen: int = 1_000_000, **kw: Any) -> None:
        super().__init__(**kw)
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self._client: Any = None

    def write(self, records: Sequence[AuditRecord]) -> None:
        if self._client is None:
            self._client = connect(self.url)
        with self._client.pipeline(transaction=False) as pipe:
            for r in records:
                fields = {k: "" if v is None else str(v) for k, v in asdict(r).items()}
                pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)
            pipe.execute()

    def release(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def forked(self) -> None:
        self._client = None

    def __repr__(self) -> str:
        return f"RedisStreamAudit(stream={self.stream!r})"


def read_stream(client: Any, stream: str, *, batch: int = 10_000) -> Iterator[AuditRecord]:
    """The records of a :class:`RedisStreamAudit` stream, oldest first (to export them as JSON lines)."""
    start = "-"
    while entries := client.xrange(stream, min=start, count=batch):
        for _, raw in entries:
            yield stream_record(raw)
        start = "(" + entries[-1][0].decode()


def stream_record(raw: dict[bytes, bytes]) -> AuditRecord:
    """The record of one :class:`RedisStreamAudit` entry's fields."""
    values = {k.decode(): v.decode() for k, v in raw.items()}
    return AuditRecord(
        event=values["event"],
        id=values["id"],
        target=values["target"],
        queue=values["queue"],
        ready_ms=int(values["ready_ms"]) if values["ready_ms"] else None,
        at_ms=int(values["at_ms"]),
        attempt=int(values["attempt"]),
        by=values["by"],
    )


def open_audit(
    *, directory: str | None = None, stream: str | None = None, url: str | None = None, stem: str = "audit"
) -> AuditLog | None:
    """The audit log the options name: a directory of JSON lines, a stream on ``url``, or None.

    Raises:
        ConfigError: both or a stream without a URL.
    """
    if directory and stream:
        raise ConfigError("audit to a directory or to a stream, not both: pass one of --audit-dir/--audit-stream")
    if directory:
        return JsonLinesAudit(directory, stem=stem)
    if stream:
        if not url:
            raise ConfigError(f"audit stream {stream!r} needs a Redis URL (DELAYQ_AUDIT_URL or the store's)")
        return RedisStreamAudit(url, stream)
    return None


def audit_from_env(*, stem: str, background: bool = True) -> AuditLog | None:
    """The audit log of ``DELAYQ_AUDIT_DIR`` or ``DELAYQ_AUDIT_STREAM`` (on ``DELAYQ_AUDIT_URL``,
    else ``DELAYQ_URL``): how worker processes, which take no delayq options, are configured."""
    env = os.environ
    audit = open_audit(
        directory=env.get("DELAYQ_AUDIT_DIR") or None,
        stream=env.get("DELAYQ_AUDIT_STREAM") or None,
        url=env.get("DELAYQ_AUDIT_URL") or env.get("DELAYQ_URL") or None,
        stem=stem,
    )
    if audit is not None:
        audit.background = background
    return audit
