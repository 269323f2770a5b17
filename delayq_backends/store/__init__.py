"""The delay store: sharded sorted sets in Redis, changed only through the Lua scripts.

One API per role, as the ACL roles are: :class:`Producer` (schedule, reschedule, cancel),
:class:`Forwarding` (claim under a :class:`Lease`, then ack, release, defer, fail, extend) and
:class:`Reader` (get, list, stats, histogram, dead letters). :class:`DelayStore` is all three.
See ``docs/architecture.md`` for the key layout and the lease protocol.
"""

from __future__ import annotations

from .base import Payload, StoreCore, check_rank
from .lease import Forwarding, Lease
from .producer import SCHEDULE_CHUNK, Producer, ScheduleEntry
from .reader import DEAD_CHUNK, Reader

__all__ = [
    "DEAD_CHUNK",
    "SCHEDULE_CHUNK",
    "DelayStore",
    "Forwarding",
    "Lease",
    "Payload",
    "Producer",
    "Reader",
    "ScheduleEntry",
    "StoreCore",
    "check_rank",
]


class DelayStore(Producer, Forwarding, Reader):
    """Schedule, claim and acknowledge delayed items: every role's API on one client.

    Items are spread over ``shards`` sorted sets by ``crc32(id)``; each call touches one
    shard, so the store runs unchanged on Redis Cluster. The store never starts a server.

    Args:
        client: a ``redis.Redis`` or ``RedisCluster`` created with ``decode_responses=False``.
        config: prefix, shard count and limits; ``config.url`` is not used here.
        clock: "now" for ``timedelta`` ready times; tests may pass a fake one. By default the
            server's clock (read once, advanced with a monotonic clock), the one every claim uses,
            so a producer whose wall clock is off schedules neither early nor late.
    """
