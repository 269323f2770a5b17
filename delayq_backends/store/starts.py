"""The worker role's writes: the "started" records of worker-side dedupe (:mod:`..dedupe`).

Each record lives in its item's shard slot (:meth:`~delayq_backends.keys.ShardKeys.started`)
and is written on the connection of the node that holds the shard, so that with
``durable_replicas`` its WAIT confirms it: a record lost in a failover lets a lossless
forwarder publish the run again, and a worker run it twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

import redis

from .base import StoreCore

__all__ = ["Starts", "is_start_record"]

#: What :meth:`~delayq_backends.dedupe.RunGuard.start` writes: ``<host:pid> <epoch ms> <n>``
#: (earlier releases: without ``<n>``).
_START_RECORD = re.compile(rb"\S+ \d+( \d+)?")


def is_start_record(value: bytes) -> bool:
    """Whether ``value`` is a worker's start record (else a hand write: no start at all)."""
    return _START_RECORD.fullmatch(value) is not None


#: What :meth:`Starts.record_start` reports for a key of another type than a string.
NOT_A_STRING = b""


class Starts(StoreCore):
    """The worker role (ACL role ``worker``): start records."""

    def record_start(self, shard: int, key: str, value: str, *, px: int) -> bytes | None:
        """``SET key value NX PX px``, then what ``key`` holds: ``value`` if this call wrote it,
        an earlier start's record, None if that expired in between, :data:`NOT_A_STRING` for a
        key of another type. With ``durable_replicas`` a WAIT rides on the same connection.

        Raises:
            NotDurableError: fewer replicas confirmed the record in time (it is on the primary).
        """
        with self._durable_pipe(shard) as pipe:
            pipe.set(key, value, nx=True, px=px)
            pipe.get(key)
            written, held = self._execute(pipe, shard)
        if isinstance(held, redis.ResponseError):
            if not str(held).startswith("WRONGTYPE"):
                raise held
            return NOT_A_STRING
        if self.config.durable_replicas and not written and held == value.encode():
            # ours from an earlier try (its reply or its WAIT failed): a write on this connection
            # for the WAIT to confirm, as WAIT counts its own connection's writes only
            with self._durable_pipe(shard) as pipe:
                pipe.pexpire(key, px)
                self._execute(pipe, shard)
        return held  # type: ignore[no-any-return]

    def record_starts(self, records: Mapping[str, str], *, px: int) -> None:
        """``SET key value NX PX px`` for each of ``records``, in one round trip: records that
        waited while the store was away (a run already started keeps its record)."""
        with self.client.pipeline(transaction=False) as pipe:
            for key, value in records.items():
                pipe.set(key, value, nx=True, px=px)
            pipe.execute()

    def replace_garbage(self, shard: int, key: str, value: str, *, px: int) -> bool:
        """Replace what ``key`` holds with ``value`` (PX ``px``) if it is still no start record
        (another type, or a string of another form); False if it changed meanwhile (another
        worker replaced it first, or it expired). Either way, record the start again (that write
        waits for the replicas)."""
        client = self._node_client(shard)
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                held = cast("bytes | None", pipe.get(key)) if pipe.type(key) in (b"string", "string") else NOT_A_STRING
                if held is None or (held != NOT_A_STRING and is_start_record(held)):
                    return False  # expired, or a worker's record by now
                pipe.multi()
                pipe.delete(key)
                pipe.set(key, value, px=px)
                pipe.execute()
            except redis.WatchError:
                return False
        return True  # the caller records it again, which confirms it when durable

    def _durable_pipe(self, shard: int) -> Any:
        """A pipeline on the shard's node (WAIT counts its own connection's writes)."""
        return self._node_client(shard).pipeline(transaction=False)

    def _execute(self, pipe: Any, shard: int) -> list[Any]:
        """Run ``pipe`` with a WAIT at its end when durable; its replies, errors as values."""
        return self.scripts.confirm(pipe, self._node_client(shard), "a start record")
