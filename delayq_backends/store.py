"""The delay store: sharded sorted sets in Redis, changed only through the Lua scripts.

See ``docs/architecture.md`` for the key layout and the lease protocol.
"""

from __future__ import annotations

import heapq
import json
import secrets
from collections import defaultdict
from itertools import islice
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .config import Config
from .connection import Client, connect, is_cluster
from .envelope import FORMAT_VERSION, MAGIC, Envelope
from .errors import ConfigError, EnvelopeError, PayloadTooLargeError, ShardMismatchError
from .keys import ShardKeys, meta_key, normalize_id, shard_of, wake_channel
from .models import Claim, ClaimedItem, DeadLetter, ScheduleCounts, ScheduledItem, ShardStats
from .scripts import Scripts
from .timeutil import Clock, When, now_ms, to_ms

__all__ = ["DelayStore", "Payload", "ScheduleEntry"]

Payload = Union[Envelope, bytes]
ScheduleEntry = Tuple[Union[str, bytes], When, Payload]

#: Items per schedule script call: big enough to amortize the round trip, small enough not
#: to block Redis for long (a call of 500 runs in about a millisecond).
SCHEDULE_CHUNK = 500


class DelayStore:
    """Schedule, claim and acknowledge delayed items.

    Items are spread over ``shards`` sorted sets by ``crc32(id)``; each call touches one
    shard, so the store runs unchanged on Redis Cluster. The store never starts a server.

    Args:
        client: a ``redis.Redis`` or ``RedisCluster`` created with ``decode_responses=False``.
        config: prefix, shard count and limits; ``config.url`` is not used here.
        clock: "now" for ``timedelta`` ready times; tests may pass a fake one.
    """

    def __init__(self, client: Client, config: Optional[Config] = None, *, clock: Clock = now_ms) -> None:
        self.client = client
        self.config = config or Config()
        self.clock = clock
        self.scripts = Scripts.register(client)
        self.cluster = is_cluster(client)
        self._keys = [ShardKeys(self.config.prefix, k) for k in range(self.config.shards)]
        self._wake = wake_channel(self.config.prefix)
        self._meta_checked = False

    @classmethod
    def from_url(cls, url: str, **settings: Any) -> DelayStore:
        """Connect to ``url`` and build a store with ``settings`` as :class:`Config` fields."""
        config = Config.from_mapping({"url": url, **settings})
        return cls(connect(url), config)

    # -- layout -----------------------------------------------------------------------------

    @property
    def shards(self) -> int:
        return self.config.shards

    @property
    def wake_channel(self) -> str:
        return self._wake

    def shard_of(self, item_id: Union[str, bytes]) -> int:
        """The shard holding ``item_id``."""
        return shard_of(normalize_id(item_id), self.config.shards)

    def keys(self, shard: int) -> ShardKeys:
        return self._keys[shard]

    def check_meta(self, *, record: bool = True) -> None:
        """Refuse a shard count that differs from the one recorded in Redis.

        Writers (``record=True``) record the count on first use; readers only compare, so a
        mistyped count in a read-only tool never fixes the layout of an empty prefix.

        Raises:
            ShardMismatchError: another shard count was recorded for this prefix.
        """
        if self._meta_checked:
            return
        key = meta_key(self.config.prefix)
        if record:
            self.client.hsetnx(key, "shards", self.config.shards)
            self.client.hsetnx(key, "format", FORMAT_VERSION)
        stored = self.client.hget(key, "shards")
        if stored is None:
            return
        recorded = int(stored)
        if recorded != self.config.shards:
            raise ShardMismatchError(
                f"prefix {self.config.prefix!r} holds {recorded} shards in Redis but this client is "
                f"configured with {self.config.shards}: set shards={recorded} (DELAYQ_SHARDS / "
                f"--shards / delayq_shards), or use a new prefix for a different layout"
            )
        self._meta_checked = True

    def _run(self, script: Any, shard: int, args: Sequence[Any], client: Any = None) -> Any:
        self.check_meta()
        return script(keys=self._keys[shard].all(), args=list(args), client=client or self.client)

    # -- scheduling -------------------------------------------------------------------------

    def schedule(self, item_id: Union[str, bytes], when: When, envelope: Payload, *, mode: str = "replace") -> str:
        """Schedule one item; returns ``"added"``, ``"replaced"`` or ``"kept"``.

        Args:
            item_id: unique id (a task or job id); scheduling an existing id again replaces it
                (``mode="replace"``) or leaves it (``mode="keep"``).
            when: aware ``datetime``, ``timedelta`` from now, or epoch seconds.
            envelope: what to deliver, as an :class:`Envelope` or its encoded bytes.

        Raises:
            InvalidTimeError, InvalidIdError, PayloadTooLargeError, EnvelopeError: bad input;
            nothing was stored.
        """
        counts = self.schedule_many([(item_id, when, envelope)], mode=mode)
        return "added" if counts.added else "replaced" if counts.replaced else "kept"

    def schedule_many(self, entries: Iterable[ScheduleEntry], *, mode: str = "replace") -> ScheduleCounts:
        """Schedule many items with one script call per shard and chunk, pipelined.

        Every entry is validated before anything is sent, so bad input stores nothing.
        """
        if mode not in ("replace", "keep"):
            raise ConfigError(f"mode={mode!r}: use 'replace' or 'keep'")
        by_shard: dict[int, List[Any]] = defaultdict(list)
        for item_id, when, envelope in entries:
            item_id = normalize_id(item_id)
            ready = to_ms(when, clock=self.clock)
            by_shard[shard_of(item_id, self.config.shards)] += (item_id, ready, self._payload(item_id, envelope))
        calls = [
            (shard, [mode, self._wake, *args[i : i + 3 * SCHEDULE_CHUNK]])
            for shard, args in by_shard.items()
            for i in range(0, len(args), 3 * SCHEDULE_CHUNK)
        ]
        counts = ScheduleCounts()
        for added, replaced, kept in self._run_calls(self.scripts.schedule, calls):
            counts += ScheduleCounts(added, replaced, kept)
        return counts

    def _payload(self, item_id: str, envelope: Payload) -> bytes:
        data = envelope.encode() if isinstance(envelope, Envelope) else envelope
        if not isinstance(data, (bytes, bytearray)) or not data.startswith(MAGIC):
            raise EnvelopeError(
                f"envelope for {item_id!r} must be an Envelope or its encoded bytes, got "
                f"{type(data).__name__} {bytes(data[:16]) if isinstance(data, (bytes, bytearray)) else ''!r}: "
                "build one with Envelope(target, destination, body).encode()"
            )
        if len(data) > self.config.max_payload_bytes:
            raise PayloadTooLargeError(
                f"item {item_id!r} is {len(data)} bytes, over max_payload_bytes="
                f"{self.config.max_payload_bytes}: store large data elsewhere and schedule a reference "
                "to it, or raise the limit"
            )
        return bytes(data)

    def _run_calls(self, script: Any, calls: List[tuple[int, List[Any]]]) -> Iterator[Any]:
        """Run ``script`` once per (shard, args), pipelined where the client allows it."""
        if not calls:
            return
        self.check_meta()
        # One call needs no pipeline (a pipeline with a script costs a SCRIPT EXISTS round trip),
        # and redis-py cannot pipeline scripts across cluster slots.
        if self.cluster or len(calls) == 1:
            for shard, args in calls:
                yield self._run(script, shard, args)
            return
        it = iter(calls)
        while batch := list(islice(it, 64)):
            with self.client.pipeline(transaction=False) as pipe:
                for shard, args in batch:
                    self._run(script, shard, args, client=pipe)
                yield from pipe.execute()

    def reschedule(self, item_id: Union[str, bytes], when: When) -> bool:
        """Move an existing item to ``when``; False if no such item is scheduled.

        Like a fresh schedule, this starts the item's attempts again and drops any lease on it
        (a forwarder holding it will not delete it with a late ack).
        """
        item_id = normalize_id(item_id)
        ready = to_ms(when, clock=self.clock)
        return bool(self._run(self.scripts.reschedule, self.shard_of(item_id), [item_id, ready, self._wake]))

    def cancel(self, item_id: Union[str, bytes]) -> bool:
        """Remove a scheduled item (O(log N)); False if it was not there."""
        item_id = normalize_id(item_id)
        return bool(self._run(self.scripts.cancel, self.shard_of(item_id), [item_id]))

    # -- the lease protocol -----------------------------------------------------------------

    def claim(
        self, shard: int, *, limit: int = 200, lease_ms: Optional[int] = None, now: Optional[int] = None
    ) -> Claim:
        """Lease up to ``limit`` due items of ``shard``, earliest first.

        ``now`` overrides the server clock (tests and the in-process testing store only).
        """
        lease = self.config.lease_ms if lease_ms is None else lease_ms
        token = secrets.token_hex(8)
        reply = self._run(self.scripts.claim, shard, [limit, lease, self.config.max_attempts, now or 0, token])
        items = [
            ClaimedItem(
                id=reply[i].decode(),
                envelope=reply[i + 1],
                attempts=int(reply[i + 2]),
                ready_ms=int(float(reply[i + 3])),
            )
            for i in range(1, len(reply), 4)
        ]
        return Claim(shard=shard, deadline_ms=int(reply[0]), token=token, items=items)

    def ack(self, claim: Claim, ids: Optional[Iterable[str]] = None) -> int:
        """Delete delivered items of ``claim`` (all by default) still under its lease."""
        ids = [item.id for item in claim.items] if ids is None else list(ids)
        if not ids:
            return 0
        return int(self._run(self.scripts.ack, claim.shard, [claim.lease, *ids]))

    def release(self, claim: Claim, ids: Optional[Iterable[str]] = None) -> int:
        """Put unpublished items of ``claim`` back at their ready time, attempt not counted."""
        ids = [item.id for item in claim.items] if ids is None else list(ids)
        if not ids:
            return 0
        return int(self._run(self.scripts.release, claim.shard, [claim.lease, self._wake, *ids]))

    def fail(
        self, claim: Claim, failures: Iterable[Tuple[str, Optional[int], str]], *, now: Optional[int] = None
    ) -> Tuple[int, int]:
        """Record failed deliveries as ``(id, retry_at_ms or None if permanent, error)``.

        Returns (retried, buried): out of attempts or permanent means dead letter.
        """
        args: List[Any] = [claim.lease, self.config.max_attempts, now or 0]
        for item_id, retry_at, error in failures:
            args += (item_id, "" if retry_at is None else retry_at, error)
        if len(args) == 3:
            return (0, 0)
        retried, buried = self._run(self.scripts.fail, claim.shard, args)
        return int(retried), int(buried)

    # -- reading ----------------------------------------------------------------------------

    def get(self, item_id: Union[str, bytes]) -> Optional[ScheduledItem]:
        """The scheduled item ``item_id``, or None."""
        self.check_meta(record=False)
        item_id = normalize_id(item_id)
        shard = self.shard_of(item_id)
        k = self._keys[shard]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zscore(k.due, item_id)
            pipe.hget(k.items, item_id)
            pipe.hget(k.tries, item_id)
            pipe.hget(k.leased, item_id)
            score, envelope, tries, lease = pipe.execute()
        if score is None or envelope is None:
            return None
        deadline, ready = _parse_lease(lease, score)
        return ScheduledItem(item_id, shard, ready, envelope, int(tries or 0), deadline)

    def exists(self, item_id: Union[str, bytes]) -> bool:
        item_id = normalize_id(item_id)
        self.check_meta(record=False)
        return bool(self.client.hexists(self._keys[self.shard_of(item_id)].items, item_id))

    def heads(self) -> List[Optional[int]]:
        """Each shard's earliest score (ready time, or lease deadline), None when empty."""
        self.check_meta(record=False)
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zrange(k.due, 0, 0, withscores=True)
            return [int(r[0][1]) if r else None for r in pipe.execute()]

    def server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def stats(self) -> List[ShardStats]:
        """Counts per shard, as of the server's clock."""
        self.check_meta(record=False)
        now = self.server_time_ms()
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zcard(k.due)
                pipe.zcount(k.due, "-inf", now)
                pipe.hlen(k.leased)
                pipe.zcard(k.dead)
                pipe.zrange(k.due, 0, 0, withscores=True)
            replies = pipe.execute()
        out = []
        for shard in range(self.config.shards):
            scheduled, due, leased, dead, head = replies[5 * shard : 5 * shard + 5]
            out.append(ShardStats(shard, scheduled, due, leased, dead, int(head[0][1]) if head else None, now))
        return out

    def list(
        self,
        *,
        shard: Optional[int] = None,
        start: Optional[When] = None,
        end: Optional[When] = None,
        offset: int = 0,
        count: int = 50,
    ) -> List[ScheduledItem]:
        """Scheduled items in score order, optionally one shard's or within [start, end].

        The score of a leased item is its lease deadline, so it is listed (and filtered) at
        that time; its ``ready_ms`` still shows the original ready time.
        """
        self.check_meta(record=False)
        low = "-inf" if start is None else to_ms(start, clock=self.clock)
        high = "+inf" if end is None else to_ms(end, clock=self.clock)
        shards = self._select(shard)
        with self.client.pipeline(transaction=False) as pipe:
            for s in shards:
                pipe.zrangebyscore(self._keys[s].due, low, high, start=0, num=offset + count, withscores=True)
            per_shard = pipe.execute()
        merged = heapq.merge(
            *[[(int(score), s, m.decode()) for m, score in rows] for s, rows in zip(shards, per_shard)]
        )
        page = list(islice(merged, offset, offset + count))
        with self.client.pipeline(transaction=False) as pipe:
            for _, s, item_id in page:
                k = self._keys[s]
                pipe.hget(k.items, item_id)
                pipe.hget(k.tries, item_id)
                pipe.hget(k.leased, item_id)
            details = pipe.execute()
        out = []
        for n, (score, s, item_id) in enumerate(page):
            envelope, tries, lease = details[3 * n : 3 * n + 3]
            deadline, ready = _parse_lease(lease, score)
            out.append(ScheduledItem(item_id, s, ready, envelope or b"", int(tries or 0), deadline))
        return out

    def _select(self, shard: Optional[int]) -> List[int]:
        if shard is None:
            return list(range(self.config.shards))
        if not 0 <= shard < self.config.shards:
            raise ConfigError(f"shard {shard} does not exist: this store has shards 0..{self.config.shards - 1}")
        return [shard]

    # -- dead letters -----------------------------------------------------------------------

    def dead_letters(self, *, shard: Optional[int] = None, offset: int = 0, count: int = 50) -> List[DeadLetter]:
        """Dead letters, most recent first, with the error that killed each."""
        self.check_meta(record=False)
        shards = self._select(shard)
        with self.client.pipeline(transaction=False) as pipe:
            for s in shards:
                pipe.zrevrange(self._keys[s].dead, 0, offset + count - 1, withscores=True)
            per_shard = pipe.execute()
        merged = heapq.merge(
            *[[(-int(score), s, m.decode()) for m, score in rows] for s, rows in zip(shards, per_shard)]
        )
        page = list(islice(merged, offset, offset + count))
        with self.client.pipeline(transaction=False) as pipe:
            for _, s, item_id in page:
                pipe.hget(self._keys[s].dead_info, item_id)
                pipe.hget(self._keys[s].dead_items, item_id)
            details = pipe.execute()
        out = []
        for n, (neg_died, s, item_id) in enumerate(page):
            info = _parse_dead_info(details[2 * n])
            ready = info.get("ready_ms")
            out.append(
                DeadLetter(
                    item_id,
                    s,
                    -neg_died,
                    str(info.get("error", "")),
                    int(info.get("attempts") or 0),
                    int(float(ready)) if ready not in (None, "") else None,
                    details[2 * n + 1],
                )
            )
        return out

    def requeue_dead(self, ids: Optional[Iterable[Union[str, bytes]]] = None, *, when: Optional[When] = None) -> int:
        """Schedule dead letters again (all when ``ids`` is None) at ``when`` (default: now)."""
        ready = self.clock() if when is None else to_ms(when, clock=self.clock)
        done = 0
        for shard, args in self._dead_calls(ids):
            done += int(self._run(self.scripts.requeue, shard, [ready, self._wake, *args])[0])
        return done

    def purge_dead(self, ids: Optional[Iterable[Union[str, bytes]]] = None) -> int:
        """Delete dead letters for good (all when ``ids`` is None)."""
        return sum(int(self._run(self.scripts.purge, shard, args)) for shard, args in self._dead_calls(ids))

    def _dead_calls(self, ids: Optional[Iterable[Union[str, bytes]]]) -> List[tuple[int, List[str]]]:
        if ids is None:
            return [(s, ["all"]) for s in range(self.config.shards)]
        by_shard: dict[int, List[str]] = defaultdict(list)
        for item_id in ids:
            item_id = normalize_id(item_id)
            by_shard[shard_of(item_id, self.config.shards)].append(item_id)
        return [(shard, ["ids", *chosen]) for shard, chosen in by_shard.items()]


def _parse_lease(lease: Optional[bytes], score: float) -> Tuple[Optional[int], int]:
    """(lease deadline or None, original ready ms) from a ``leased`` hash value."""
    if lease:
        text = lease.decode()
        return int(text.partition(":")[0]), int(text.rpartition(":")[2])
    return None, int(score)


def _parse_dead_info(raw: Optional[bytes]) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        info = json.loads(raw)
    except ValueError:
        return {"error": raw.decode("utf-8", "replace")}
    return info if isinstance(info, dict) else {"error": str(info)}
