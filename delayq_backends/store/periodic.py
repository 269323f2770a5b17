"""The periodic entries' keys as the store reads and writes them: the registry (entry name ->
item id), the code schedule's record, the trusted definitions and each entry's run history.

Writes go through the scripts (``periodic_registry.lua``, ``sync_version.lua``,
``periodic_trust.lua``, ``periodic_run.lua``); the reads here are one round trip each. What
the values mean is :mod:`delayq_backends.periodic`'s business: a hand write of another type is
told apart here, never raised as a Redis error the caller must parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from ..keys import periodic_code_key, periodic_key, periodic_trust_key
from ..scripts.store import PeriodicRegistry, SyncVersion
from .base import StoreCore

__all__ = ["HistoryRead", "PeriodicRecords"]


class HistoryRead(NamedTuple):
    """One entry's history keys as read: its run ids (newest first), its ``missed``, ``late`` and
    ``last_success`` values, and each run id's record (None: missing). A key of another type
    reads as empty."""

    run_ids: list[str]
    counters: list[Any]
    records: list[Any]


class PeriodicRecords(StoreCore):
    """The periodic entries' registry, code schedule record, trusted definitions and run history:
    the forwarder and operator roles write them through their scripts, every role reads them."""

    def registry_type(self) -> str:
        """The registry key's type (``hash``, or ``none`` when no entry is registered)."""
        kind = self.client.type(periodic_key(self.config.prefix))
        return kind.decode() if isinstance(kind, bytes) else str(kind)

    def registry_fields(self, cursor: int, count: int) -> tuple[int, list[bytes]]:
        """One ``HSCAN`` page of the registry's fields and the next cursor (0: none)."""
        cursor, fields = self.client.hscan(periodic_key(self.config.prefix), cursor, count=count)
        return int(cursor), [f if isinstance(f, bytes) else str(f).encode() for f in fields]

    def is_registered(self, name: str) -> bool:
        return bool(self.client.hexists(periodic_key(self.config.prefix), name))

    def registry_size(self) -> int:
        return int(self.client.hlen(periodic_key(self.config.prefix)))

    def register_entry(self, name: str, item_id: str) -> bool:
        """Add entry ``name``'s registry line (a user's write: it waits for the replicas when
        durable); False when the registry is of another type."""
        reply = self.scripts.run(
            PeriodicRegistry.add(periodic_key(self.config.prefix), name, item_id).as_acknowledged()
        )
        return reply != -1

    def unregister_entries(self, names: Sequence[str]) -> list[bool] | None:
        """Remove the registry lines of ``names``: whether each was there; None when the registry is of
        another type (nothing removed)."""
        key, out = periodic_key(self.config.prefix), []
        for start in range(0, len(names), PeriodicRegistry.MAX_REMOVE):
            page = names[start : start + PeriodicRegistry.MAX_REMOVE]
            reply = self.scripts.run(PeriodicRegistry.remove(key, page).as_acknowledged()) if page else []
            if not isinstance(reply, list):
                return None
            out += [bool(r) for r in reply]
        return out

    def history_reads(self, key_pairs: Sequence[tuple[str, str]], limit: int) -> list[HistoryRead]:
        """The history keys ``(history hash, runs ZSET)`` of each entry: its last ``limit`` runs and
        counters, in two pipelined rounds (run ids and counters, then the records).

        Raises:
            RedisError: the store cannot be read.
        """
        with self.client.pipeline(transaction=False) as pipe:
            for hist, order in key_pairs:
                pipe.zrevrange(order, 0, max(0, limit - 1))
                pipe.hmget(hist, ["missed", "late", "last_success"])
            first = _or_none(pipe.execute(raise_on_error=False))
        ids = [[r.decode("utf-8", "replace") for r in listed or []] for listed in first[::2]]
        with self.client.pipeline(transaction=False) as pipe:
            for (hist, _), run_ids in zip(key_pairs, ids):
                if run_ids:
                    pipe.hmget(hist, [f"run:{r}" for r in run_ids])
            records = iter(_or_none(pipe.execute(raise_on_error=False)) if len(pipe) else [])
        return [
            HistoryRead(run_ids, counted or [None] * 3, (next(records) or [None] * len(run_ids)) if run_ids else [])
            for run_ids, counted in zip(ids, first[1::2])
        ]

    def trusted_values(self, names: Sequence[str]) -> list[Any] | None:
        """The trusted definitions of ``names`` (None each: no definition); None when the key is of
        another type."""
        try:
            return list(self.client.hmget(periodic_trust_key(self.config.prefix), list(names)))
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return None

    def code_record_values(self, kind: str) -> list[Any] | None:
        """The code schedule record's fields of entries of ``kind`` (:data:`SyncVersion.FIELDS`);
        None when the record is of another type."""
        try:
            return list(
                self.client.hmget(periodic_code_key(self.config.prefix), [f"{kind}:{f}" for f in SyncVersion.FIELDS])
            )
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return None

    def items_stored(self, item_ids: Sequence[str]) -> list[bool]:
        """Whether each of ``item_ids`` has a store item, in one pipelined round."""
        with self.client.pipeline(transaction=False) as pipe:
            for ident in item_ids:
                pipe.hexists(self.keys(self.shard_of(ident)).items, ident)
            return [bool(r) for r in pipe.execute()] if item_ids else []

    def dead_envelope(self, item_id: str) -> bytes | None:
        """Dead letter ``item_id``'s envelope (None: no such dead letter)."""
        raw = self.client.hget(self.keys(self.shard_of(item_id)).dead_items, item_id)
        return raw if isinstance(raw, bytes) else None


def _or_none(replies: list[Any]) -> list[Any]:
    """Pipelined replies, a WRONGTYPE error (a hand write of another type) as None; others raised."""
    for reply in replies:
        if isinstance(reply, Exception) and not _wrong_type(reply):
            raise reply
    return [None if isinstance(r, Exception) else r for r in replies]


def _wrong_type(reply: Exception) -> bool:
    return isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE")
