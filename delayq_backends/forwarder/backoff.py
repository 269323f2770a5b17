"""Back-off: of one shard whose handling failed, and of the whole forwarder during an outage."""

from __future__ import annotations

import logging
import random
import threading

from ..models import Claim
from ..timeutil import Clock
from .stats import ForwarderStats

__all__ = ["OutageBackoff", "ShardBackoff"]

log = logging.getLogger("delayq.forwarder")


class ShardBackoff:
    """Shards set aside after an error that retrying at once will not fix: a Redis error (a key
    of ours holding another type, the server at maxmemory, a missing ACL permission) or anything
    else raised while handling their data (a value that cannot be decoded, a target's bug).

    The other shards keep flowing; a shard set aside is tried again after a back-off that doubles
    up to ``max_ms`` (a failing store, like an unreachable one, is worth retrying soon: a cluster
    mid-failover answers CLUSTERDOWN or MOVED for a few seconds). Its items stay where they are:
    leases taken before the error expire and the items are claimed again, each claim counting an
    attempt, so an item that keeps failing this way ends in the dead letters.
    """

    def __init__(self, max_ms: int, clock: Clock, stats: ForwarderStats) -> None:
        self.max_ms = max_ms
        self.clock = clock
        self.stats = stats
        #: shard -> (server ms it is set aside until, its back-off ms)
        self.until: dict[int, tuple[int, int]] = {}
        self._rng = random.Random()

    def due(self, heads: list[int | None]) -> list[int]:
        """The shards due now and not set aside, from a random one on, so no shard goes first always."""
        now = self.clock()
        due = [s for s, head in enumerate(heads) if head is not None and head <= now and not self.aside(s, now)]
        start = self._rng.randrange(len(heads))
        due.sort(key=lambda s: (s - start) % len(heads))
        return due

    def aside(self, shard: int, now: int) -> bool:
        return self.until.get(shard, (0, 0))[0] > now

    def set_aside(self, shard: int, exc: Exception, claim: Claim | None) -> None:
        """Set ``shard`` aside after ``exc``: one log line, with the claim's ids when there was one."""
        _, previous = self.until.get(shard, (0, 0))
        cap = self.max_ms
        backoff = min(cap, max(min(cap, 1000), previous * 2))
        self.until[shard] = (self.clock() + backoff, backoff)
        self.stats.errors += 1
        ids = [item.id for item in claim.items] if claim is not None else []
        log.error(
            "shard %d: %s: %s%s; trying it again in %.0f s",
            shard,
            type(exc).__name__,
            exc,
            f" (items {', '.join(map(repr, ids[:5]))}{', ...' if len(ids) > 5 else ''})" if ids else "",
            backoff / 1000,
        )

    def cleared(self, shard: int) -> None:
        """``shard`` was handled without error: its back-off starts over."""
        self.until.pop(shard, None)

    def ends_after(self, now: int) -> list[int]:
        """When the back-offs not yet over end (those over wake nobody)."""
        return [until for until, _ in self.until.values() if until > now]


class OutageBackoff:
    """The pause after a broker or the store was found unreachable: doubling from 0.2 s up to
    ``max_s``, jittered, cut short by ``stop``; it starts over once a pass meets no outage."""

    def __init__(self, max_s: float, stop: threading.Event) -> None:
        self.max_s = max_s
        self.stop = stop
        self._backoff = 0.0
        self._rng = random.Random()

    def pause(self, why: str) -> None:
        self._backoff = min(self.max_s, max(0.2, self._backoff * 2))
        pause = self._backoff * (0.5 + self._rng.random() / 2)
        log.warning("%s; retrying in %.1f s", why, pause)
        self.stop.wait(pause)

    def reset(self) -> None:
        self._backoff = 0.0
