"""The store's metadata (``<prefix>:meta``) read as untrusted input.

The hash records the shard count and key layout every client derives key names from; it is a
plain Redis key, so anything that can write the store can write it. A wrong ``layout`` makes
every client look for the shards under other keys: items stay in Redis, unseen ("forwarded 0").
So the recorded values are checked, and against what the shards hold: the layout whose shard
keys exist is the one in use, whatever the hash says.
"""

from __future__ import annotations

from ..connection import Client
from ..errors import StoreMetaError
from ..keys import BALANCED_MAX_SHARDS, LAYOUT, ShardKeys, meta_key, shard_tags

__all__ = ["LAYOUTS", "check_recorded", "layout_in_use", "recorded_layout"]

#: The layouts this release knows (keys.shard_tags).
LAYOUTS = (1, 2)


def _fix(prefix: str, field: str, value: object) -> str:
    return (
        f"restore it with `HSET {meta_key(prefix)} {field} {value}`; only delayq writes this key "
        "(give producers the `delayq acl` producer role)"
    )


def recorded_layout(prefix: str, layout: bytes | None, shards: bytes | None) -> int | None:
    """The layout the meta hash records (its ``layout`` and ``shards`` fields): None for a new
    prefix (no shards yet), 1 for a prefix made before layouts were recorded (shards, no layout).

    Raises:
        StoreMetaError: ``layout`` or ``shards`` is not a value this release wrote.
    """
    key = meta_key(prefix)
    if shards is not None and not (shards.isdigit() and int(shards) > 0):
        raise StoreMetaError(f"{key} field shards is {shards[:40]!r}, not a shard count: {_fix(prefix, 'shards', 'N')}")
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
    store, or more shards than layout 2 balances, where both layouts name the same keys)."""
    if shards > BALANCED_MAX_SHARDS:
        return None
    found = []
    for layout in LAYOUTS:
        shard_keys = [ShardKeys(prefix, n, tag) for n, tag in enumerate(shard_tags(prefix, shards, layout))]
        with client.pipeline(transaction=False) as pipe:
            for k in shard_keys:
                pipe.exists(k.due, k.items, k.dead)
            if any(pipe.execute()):
                found.append(layout)
    return found[0] if len(found) == 1 else None


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
