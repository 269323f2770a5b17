"""The items the benches schedule: ~200-byte JSON bodies that carry their ready time, in
envelopes for the Redis-list target, and untimed bulk loads of them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from delayq_backends import DelayStore, Envelope
from delayq_backends.targets import RedisListTarget

__all__ = ["BODY_BYTES", "NEWER_FORMAT", "OUT_LIST", "body", "entries", "envelope", "in_an_hour", "load", "plant_newer"]

#: the list the forwarding benches fill
OUT_LIST = "bench:out"
BODY_BYTES = 200


def body(item_id: str, ready_ms: int) -> bytes:
    """A ~200-byte JSON message that carries its ready time, so a consumer can time it."""
    head = json.dumps({"id": item_id, "ready_ms": ready_ms, "pad": ""}, separators=(",", ":"))
    return head[:-2].encode() + b"x" * max(0, BODY_BYTES - len(head)) + b'"}'


def envelope(item_id: str, ready_ms: int, list_key: str = OUT_LIST) -> Envelope:
    """A realistic envelope for the Redis-list target."""
    return RedisListTarget.envelope(list_key, body(item_id, ready_ms))


def entries(
    prefix: str, n: int, ready_ms: Callable[[int], int], *, encoded: bool = False
) -> list[tuple[str, float, Any]]:
    """``n`` schedule entries (id, epoch seconds, envelope); ``encoded`` pre-encodes them."""
    out: list[tuple[str, float, Any]] = []
    for i in range(n):
        item_id, ready = f"{prefix}-{i:08d}", ready_ms(i)
        env = envelope(item_id, ready)
        out.append((item_id, ready / 1000, env.encode() if encoded else env))
    return out


def in_an_hour(now_ms: int) -> Callable[[int], int]:
    """Ready times for a backlog that stays in the future for the whole run, 1 ms apart."""
    return lambda i: now_ms + 3_600_000 + i


def load(
    store: DelayStore,
    prefix: str,
    n: int,
    ready_ms: Callable[[int], int],
    chunk: int = 50_000,
    data: bytes | None = None,
) -> None:
    """Untimed setup: schedule ``n`` items sharing one encoded envelope (``data``, default: a
    list target's for :data:`OUT_LIST`), in chunks.

    Sharing the bytes keeps a 1M load fast and small on the client; the server still stores
    one copy per item, so the backlog it holds is as big as a real one.
    """
    data = envelope(prefix, 0).encode() if data is None else data
    for start in range(0, n, chunk):
        rows = range(start, min(n, start + chunk))
        store.schedule_many([(f"{prefix}-{i:08d}", ready_ms(i) / 1000, data) for i in rows])


#: The envelope format version of :func:`plant_newer`'s items: one no release reads yet.
NEWER_FORMAT = 99


def plant_newer(store: DelayStore, prefix: str, n: int, ready_ms: int, chunk: int = 20_000) -> list[str]:
    """Untimed setup: write ``n`` items of envelope format :data:`NEWER_FORMAT` due at ``ready_ms``
    straight into the shards (HSET and ZADD in pipelines, as a newer producer or a hand write
    would), fast; their ids. No forwarder of this release can release them."""
    data = bytearray(envelope(prefix, 0).encode())
    data[2] = NEWER_FORMAT
    ids = [f"{prefix}-{i:08d}" for i in range(n)]
    for start in range(0, n, chunk):
        with store.client.pipeline(transaction=False) as pipe:
            for item_id in ids[start : start + chunk]:
                k = store.keys(store.shard_of(item_id))
                pipe.hset(k.items, item_id, bytes(data))
                pipe.zadd(k.due, {item_id: ready_ms})
            pipe.execute()
    return ids
