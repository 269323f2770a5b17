"""The store's metadata (``<prefix>:meta``) read as untrusted input.

The hash records the shard count and key layout every client derives key names from; it is a
plain Redis key, so anything that can write the store can write it. A wrong ``layout`` makes
every client look for the shards under other keys: items stay in Redis, unseen ("forwarded 0").
So the recorded values are checked, and against what the shards hold: the layout whose shard
keys exist is the one in use, whatever the hash says.
"""

from __future__ import annotations

import redis

from ..connection import Client
from ..errors import StoreMetaError
from ..keys import BALANCED_MAX_SHARDS, LAYOUT, ShardKeys, meta_key, shard_tags

__all__ = ["LAYOUTS", "check_recorded", "check_shards", "layout_in_use", "read_meta", "recorded_layout"]

#: The layouts this release knows (keys.shard_tags).
LAYOUTS = (1, 2)


def _fix(prefix: str, field: str, value: object) -> str:
    return (
        f"restore it with `HSET {meta_key(prefix)} {field} {value}`; only delayq writes this key "
        "(give producers the `delayq acl` producer role)"
    )


def read_meta(client: Client, prefix: str) -> tuple[bytes | None, bytes | None]:
    """The ``layout`` and ``shards`` fields of the prefix's meta hash.

    Raises:
        StoreMetaError: the key is not a hash.
    """
    key = meta_key(prefix)
    try:
        layout, shards = client.hmget(key, "layout", "shards")  # bytes: the store's clients never decode
    except redis.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        raise StoreMetaError(
            f"{key} is not a hash: delete it (`DEL {key}`) and start a forwarder, which records it again from "
            "the shard keys; only delayq writes this key (give producers the `delayq acl` producer role)"
        ) from exc
    return layout, shards  # type: ignore[return-value]


def recorded_layout(prefix: str, layout: bytes | None, shards: bytes | None, configured: int) -> int | None:
    """The layout the meta hash records (its ``layout`` and ``shards`` fields): None for a new
    prefix (no shards yet), 1 for a prefix made before layouts were recorded (shards, no layout).
    ``configured`` is this client's shard count, offered in the fix for a garbage count.

    Raises:
        StoreMetaError: ``layout`` or ``shards`` is not a value this release wrote.
    """
    key = meta_key(prefix)
    if shards is not None and not (shards.isdigit() and int(shards) > 0):
        raise StoreMetaError(
            f"{key} field shards is {shards[:40]!r}, not a shard count: if its items were scheduled with "
            f"{configured} shards (this client's setting), {_fix(prefix, 'shards', configured)}"
        )
    if layout is None:
        return None if shards is None else 1
    if layout not in {str(n).encode() for n in LAYOUTS}:
        raise StoreMetaError(
            f"{key} field layout is {layout[:40]!r}, not one of {LAYOUTS}: {_fix(prefix, 'layout', LAYOUT)} "
            "(or the layout `delayq forward` names when started)"
        )
    return int(layout)


def layout_in_use(client: Client, prefix: str, shards: int) -> int | None:
    """The one layout whose shard keys exist in Redis; None when neither or both do (an empty
    store, or more shards than layout 2 balances, where both layouts name the same keys).

    Only the shards whose tags differ between the layouts tell them apart (layout 2 keeps a
    plain tag whose slot already lies where it should).
    """
    if shards > BALANCED_MAX_SHARDS:
        return None
    tags = {layout: shard_tags(prefix, shards, layout) for layout in LAYOUTS}
    telling = [
        (layout, ShardKeys(prefix, n, tags[layout][n]))
        for n in range(shards)
        for layout in LAYOUTS
        if tags[1][n] != tags[2][n]
    ]
    with client.pipeline(transaction=False) as pipe:
        for _, k in telling:
            pipe.exists(k.due, k.items, k.dead)
        found = {layout for (layout, _), n in zip(telling, pipe.execute()) if n}
    return found.pop() if len(found) == 1 else None


def check_recorded(client: Client, prefix: str, shards: int, recorded: int) -> None:
    """Refuse a recorded layout whose shard keys are absent while the other layout's exist.

    Raises:
        StoreMetaError: names the meta key, both layouts and the command that restores it.
    """
    in_use = layout_in_use(client, prefix, shards)
    if in_use is not None and in_use != recorded:
        raise StoreMetaError(
            f"{meta_key(prefix)} records layout {recorded} but the shard keys in Redis use layout {in_use}: "
            f"items would be stranded unseen; {_fix(prefix, 'layout', in_use)}"
        )


def check_shards(client: Client, prefix: str, configured: int, recorded: int) -> None:
    """Refuse a recorded shard count none of whose shard keys exist while the configured
    count's do. Only the tags one count has and the other lacks tell them apart: shard k is
    ``{prefix:k}`` in layout 1 for every count, and often in layout 2 too.

    Raises:
        StoreMetaError: names the meta key and the command that restores it.
    """
    ours, theirs = _count_tags(prefix, recorded), _count_tags(prefix, configured)
    if not _any_shard_keys(client, prefix, ours - theirs) and _any_shard_keys(client, prefix, theirs - ours):
        raise StoreMetaError(
            f"{meta_key(prefix)} records {recorded} shards but the shard keys in Redis are those of {configured}: "
            f"{_fix(prefix, 'shards', configured)}"
        )


def _count_tags(prefix: str, shards: int) -> set[tuple[int, str]]:
    """(shard, tag) of each shard of a ``shards`` count, in either layout."""
    return {(n, tag) for layout in LAYOUTS for n, tag in enumerate(shard_tags(prefix, shards, layout))}


def _any_shard_keys(client: Client, prefix: str, tags: set[tuple[int, str]]) -> bool:
    """Whether a due, items or dead key of any of ``tags`` exists."""
    if not tags:
        return False
    with client.pipeline(transaction=False) as pipe:
        for n, tag in tags:
            k = ShardKeys(prefix, n, tag)
            pipe.exists(k.due, k.items, k.dead)
        return any(pipe.execute())
