"""The reader's API: items, counts, the due-time histogram and dead letters (ACL role
``reader``), and requeueing or purging dead letters (an operator's writes, run through scripts)."""

from __future__ import annotations

import heapq
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any

import redis

from ..errors import ConfigError
from ..keys import MAX_RANK, PARKED_MS, RANK_SPAN, collapsed_key, normalize_id, shard_of
from ..models import DeadLetter, ScheduledItem, ShardStats, Why
from ..scripts.store import Purge, Requeue
from ..timeutil import When, score_ms, to_ms
from .base import StoreCore
from .batches import fail_in_batches
from .why import ItemRead, group_state, held_by, item_state, read_groups

__all__ = ["DEAD_CHUNK", "Reader"]

#: Dead letters per requeue/purge script call: about 25 ms of server time on a busy 2-core box, so requeueing or
#: purging any number never holds Redis for long (one call for 200k held it for seconds).
DEAD_CHUNK = 500


class Reader(StoreCore):
    """Reads of the store, and the dead-letter operations."""

    def get(self, item_id: str | bytes) -> ScheduledItem | None:
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
            pipe.zscore(k.ranked, item_id)
            pipe.hget(k.parked_why, item_id)
            score, envelope, tries, lease, ranked, why = pipe.execute(raise_on_error=False)
        _raise_first([score, envelope, tries, lease, ranked])
        if score is None or envelope is None:
            return None
        deadline, ready = _parse_lease(lease, score)
        calls = self._calls([(shard, item_id)]).get(item_id, 0)
        return ScheduledItem(
            item_id,
            shard,
            ready,
            envelope,
            _count(tries),
            deadline,
            _rank(ranked),
            calls,
            awaiting_start=_awaiting(lease),
            parked=_parked(score, why),
        )

    def why(self, item_id: str | bytes) -> Why:
        """Why ``item_id`` is where it is, in one line and as details (:class:`~..models.Why`):
        not due yet, due, leased by a forwarder, awaiting its worker's start, held by flow
        control, held by one of its groups (paused, throttled, at its limit, over its rate, in
        line), parked, dead, or unknown. Reads only: one round trip for the item, one or two more
        when its groups hold it back (:mod:`.why`).

        Raises:
            InvalidIdError: ``item_id`` cannot be an id.
        """
        self.check_meta(record=False)
        item_id = normalize_id(item_id)
        k = self._keys[self.shard_of(item_id)]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zscore(k.due, item_id)
            pipe.hget(k.items, item_id)
            pipe.hget(k.leased, item_id)
            pipe.hget(k.parked_why, item_id)
            pipe.zscore(k.parked, item_id)
            pipe.zscore(k.dead, item_id)
            pipe.hget(k.dead_info, item_id)
            score, envelope, lease, why, recheck, died, info = pipe.execute(raise_on_error=False)
        _raise_first([score, envelope, lease, died])
        read = ItemRead(
            item_id,
            score,
            envelope,
            lease,
            why,
            None if isinstance(recheck, Exception) else recheck,
            died,
            {} if isinstance(info, Exception) else _parse_dead_info(info),
        )
        now = self.clock()
        found = item_state(read, now)
        groups = held_by(found, envelope)
        return group_state(found, read_groups(self, item_id, groups, now), now) if groups else found

    def scan(self, *, batch: int = 1000) -> Iterator[ScheduledItem]:
        """Every scheduled item, shard by shard, in no particular order (``ZSCAN``).

        For exports and audits of large stores, where :meth:`scheduled`'s paging would be quadratic.
        Items present throughout are returned at least once; ones added, moved or forwarded
        meanwhile may be missed or repeated.
        """
        self.check_meta(record=False)
        for shard, k in enumerate(self._keys):
            members = self.client.zscan_iter(k.due, count=batch)
            while chunk := list(islice(members, batch)):
                ids = [m for m, _ in chunk]
                with self.client.pipeline(transaction=False) as pipe:
                    pipe.hmget(k.items, ids)
                    pipe.hmget(k.tries, ids)
                    pipe.hmget(k.leased, ids)
                    pipe.zmscore(k.ranked, ids)
                    pipe.hmget(k.parked_why, ids)
                    envelopes, tries, leases, ranks, whys = pipe.execute(raise_on_error=False)
                _raise_first([envelopes, tries, leases, ranks])
                if isinstance(whys, Exception):  # parked_why of another type (a hand write)
                    whys = [None] * len(ids)
                rows = zip(chunk, envelopes, tries, leases, ranks, whys)
                for (member, score), envelope, tried, lease, ranked, why in rows:
                    if envelope is not None:
                        deadline, ready = _parse_lease(lease, score)
                        yield ScheduledItem(
                            _id_text(member),
                            shard,
                            ready,
                            envelope,
                            _count(tried),
                            deadline,
                            _rank(ranked),
                            awaiting_start=_awaiting(lease),
                            parked=_parked(score, why),
                        )

    def rank(self, item_id: str | bytes) -> int | None:
        """The rank ``item_id`` is scheduled with, or None when it is not scheduled."""
        self.check_meta(record=False)
        item_id = normalize_id(item_id)
        k = self._keys[self.shard_of(item_id)]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hexists(k.items, item_id)
            pipe.zscore(k.ranked, item_id)
            exists, score = pipe.execute()
        return None if not exists else _rank(score)

    def exists(self, item_id: str | bytes) -> bool:
        item_id = normalize_id(item_id)
        self.check_meta(record=False)
        return bool(self.client.hexists(self._keys[self.shard_of(item_id)].items, item_id))

    def stats(self) -> list[ShardStats]:
        """Counts per shard, as of the server's clock.

        A shard whose keys cannot be read (one holds another type) reports the reason in its
        ``error`` with zero counts; the others report as usual. An outage still raises.
        """
        self.check_meta(record=False)
        now = self.clock()
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zcard(k.due)
                pipe.zcount(k.due, "-inf", now)
                pipe.hlen(k.leased)
                pipe.zcard(k.dead)
                pipe.zrange(k.due, 0, 0, withscores=True)
                pipe.zcard(k.parked)
            replies = pipe.execute(raise_on_error=False)
        out = []
        for shard in range(self.config.shards):
            part = replies[6 * shard : 6 * shard + 6]
            errors = [r for r in part if isinstance(r, Exception)]
            for err in errors:
                if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):
                    raise err
            if errors:
                reason = f"shard {shard} cannot be read: {errors[0]} (a key of it holds data another tool wrote)"
                out.append(ShardStats(shard, 0, 0, 0, 0, None, now, error=reason))
                continue
            scheduled, due, leased, dead, head, parked = part
            head_ms = score_ms(head[0][1]) if head else None
            out.append(ShardStats(shard, scheduled, due, leased, dead, head_ms, now, parked=parked))
        return out

    def due_histogram(self, start_ms: int, bucket_ms: int, buckets: int) -> tuple[int, list[int]]:
        """How many items fall due before ``start_ms``, and in each of ``buckets`` buckets after it.

        Counts come from ``ZCOUNT`` on each shard per bucket, pipelined: no item is read, so the
        cost grows with buckets x shards, not with the store's size: 288 buckets (24 h by 5 min)
        on 16 shards take about 50 ms, 1440 (by the minute) about 210 ms, mostly client-side
        parsing. A leased item counts at its lease deadline, which is its score.

        Raises:
            ConfigError: ``bucket_ms`` or ``buckets`` is not positive.
        """
        if bucket_ms <= 0 or buckets <= 0:
            raise ConfigError(f"bucket_ms={bucket_ms} and buckets={buckets} must both be positive")
        self.check_meta(record=False)
        edges = [start_ms + bucket_ms * n for n in range(buckets + 1)]
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zcount(k.due, "-inf", f"({start_ms}")
                for low, high in zip(edges, edges[1:]):
                    pipe.zcount(k.due, low, f"({high}")
            replies = pipe.execute()
        per_shard = buckets + 1
        totals = [sum(replies[s * per_shard + n] for s in range(self.config.shards)) for n in range(per_shard)]
        return totals[0], totals[1:]

    def scheduled(
        self,
        *,
        shard: int | None = None,
        start: When | None = None,
        end: When | None = None,
        offset: int = 0,
        count: int = 50,
    ) -> list[ScheduledItem]:
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
        merged = heapq.merge(*[[(score_ms(score), s, m) for m, score in rows] for s, rows in zip(shards, per_shard)])
        page = list(islice(merged, offset, offset + count))
        with self.client.pipeline(transaction=False) as pipe:
            for _, s, member in page:
                k = self._keys[s]
                pipe.hget(k.items, member)
                pipe.hget(k.tries, member)
                pipe.hget(k.leased, member)
                pipe.zscore(k.ranked, member)
                pipe.hget(k.parked_why, member)
            details = pipe.execute(raise_on_error=False)
        _raise_first([d for n, d in enumerate(details) if n % 5 != 4])
        out = []
        calls = self._calls([(s, _id_text(member)) for _, s, member in page])
        for n, (score, s, member) in enumerate(page):
            item_id = _id_text(member)
            envelope, tries, lease, ranked, why = details[5 * n : 5 * n + 5]
            deadline, ready = _parse_lease(lease, score)
            out.append(
                ScheduledItem(
                    item_id,
                    s,
                    ready,
                    envelope or b"",
                    _count(tries),
                    deadline,
                    _rank(ranked),
                    calls.get(item_id, 0),
                    awaiting_start=_awaiting(lease),
                    parked=_parked(score, why),
                )
            )
        return out

    def _calls(self, items: list[tuple[int, str]]) -> dict[str, int]:
        """Call counts of the debounced and throttled ones of ``items`` (shard, id), one round trip."""
        collapsed = [(s, i) for s, i in items if collapsed_key(i)]
        if not collapsed:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            for s, item_id in collapsed:
                pipe.hget(self._keys[s].calls(item_id), "calls")
            counts = pipe.execute(raise_on_error=False)
        return {i: _count(None if isinstance(n, Exception) else n) for (_, i), n in zip(collapsed, counts)}

    # -- dead letters -----------------------------------------------------------------------

    def dead_letters(self, *, shard: int | None = None, offset: int = 0, count: int = 50) -> list[DeadLetter]:
        """Dead letters, most recent first, with the error that killed each."""
        self.check_meta(record=False)
        shards = self._select(shard)
        with self.client.pipeline(transaction=False) as pipe:
            for s in shards:
                pipe.zrevrange(self._keys[s].dead, 0, offset + count - 1, withscores=True)
            per_shard = pipe.execute()
        merged = heapq.merge(*[[(-score_ms(score), s, m) for m, score in rows] for s, rows in zip(shards, per_shard)])
        page = list(islice(merged, offset, offset + count))
        with self.client.pipeline(transaction=False) as pipe:
            for _, s, member in page:
                pipe.hget(self._keys[s].dead_info, member)
                pipe.hget(self._keys[s].dead_items, member)
            details = pipe.execute()
        out = []
        for n, (neg_died, s, member) in enumerate(page):
            info = _parse_dead_info(details[2 * n])
            ready = info.get("ready_ms")
            out.append(
                DeadLetter(
                    _id_text(member),
                    s,
                    -neg_died,
                    str(info.get("error", "")),
                    _count(info.get("attempts")),
                    score_ms(ready) if ready not in (None, "") else None,
                    details[2 * n + 1],
                )
            )
        return out

    def requeue_dead(self, ids: Iterable[str | bytes] | None = None, *, when: When | None = None) -> int:
        """Schedule dead letters again (all when ``ids`` is None) at ``when`` (default: now).

        Runs in calls of at most :data:`DEAD_CHUNK` letters, so Redis serves others in between
        however many there are. All: each shard's letters present when it starts, oldest first.
        """
        ready = self.clock() if when is None else to_ms(when, clock=self.clock)
        done = 0
        if ids is not None:
            for shard, chosen in self._dead_chunks(ids):
                done += self._write(partial(Requeue.ids, ids=chosen, ready_ms=ready, wake=self._wake), shard).requeued
            return done
        for shard in range(self.config.shards):
            skipped, left = 0, self._dead_count(shard)
            while left > 0:  # letters kept (skipped) stay in front: page past them
                count = min(DEAD_CHUNK, left)
                call = partial(Requeue.page, offset=skipped, count=count, ready_ms=ready, wake=self._wake)
                page = self._write(call, shard)
                done, skipped, left = done + page.requeued, skipped + page.skipped, left - page.seen
                if not page.seen:
                    break
        return done

    def purge_dead(self, ids: Iterable[str | bytes] | None = None) -> int:
        """Delete dead letters for good (all when ``ids`` is None), :data:`DEAD_CHUNK` per call.
        A purged sub-job of a batch is reported to it as failed: it will never run."""
        if ids is not None:
            return sum(self._purge(shard, chosen) for shard, chosen in self._dead_chunks(ids))
        done = 0
        for shard in range(self.config.shards):
            self.check_meta()
            while chosen := self._oldest_dead(shard):  # as stored: an id that is no UTF-8 too
                deleted = self._purge(shard, chosen)
                done += deleted
                if not deleted:
                    break
        return done

    def _oldest_dead(self, shard: int) -> list[bytes]:
        return [m for m in self.client.zrange(self._keys[shard].dead, 0, DEAD_CHUNK - 1) if isinstance(m, bytes)]

    def _purge(self, shard: int, ids: Sequence[str | bytes]) -> int:
        """Purge dead letters ``ids`` of ``shard``, and report those that were batches' sub-jobs."""
        envelopes = self.client.hmget(self._keys[shard].dead_items, ids)
        deleted = int(self._run(partial(Purge.ids, ids=ids), shard))
        fail_in_batches(self, {_id_text(i) if isinstance(i, bytes) else i: e for i, e in zip(ids, envelopes) if e})
        return deleted

    def _dead_count(self, shard: int) -> int:
        self.check_meta()
        return int(self.client.zcard(self._keys[shard].dead))

    def _dead_chunks(self, ids: Iterable[str | bytes]) -> list[tuple[int, list[str]]]:
        """``ids`` by shard, in chunks of at most :data:`DEAD_CHUNK`."""
        by_shard: dict[int, list[str]] = defaultdict(list)
        for item_id in ids:
            item_id = normalize_id(item_id)
            by_shard[shard_of(item_id, self.config.shards)].append(item_id)
        return [
            (shard, chosen[i : i + DEAD_CHUNK])
            for shard, chosen in by_shard.items()
            for i in range(0, len(chosen), DEAD_CHUNK)
        ]


def _rank(ranked_score: float | None) -> int:
    """An item's rank from its ``ranked`` entry: the entry's band (includes/common.lua), which
    schedule keeps exact for the items it holds; no entry (or one outside every band) is rank 0."""
    if ranked_score is None or not 0 <= ranked_score < MAX_RANK * RANK_SPAN:
        return 0
    return MAX_RANK - int(ranked_score) // RANK_SPAN


def _count(raw: Any) -> int:
    """A stored count (tries, attempts) for reading: 0 when it is no whole number."""
    try:
        return max(0, int(raw or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _id_text(member: bytes) -> str:
    """A stored id as text for reading; one that is not UTF-8 (a hand write) shows its bytes escaped."""
    return member.decode("utf-8", "backslashreplace")


def _awaiting(lease: bytes | None) -> bool:
    """Whether a ``leased`` hash value marks an item published in lossless mode, awaiting its start."""
    return lease is not None and b":published:" in lease


def _raise_first(replies: list[Any]) -> None:
    """Raise the first error among ``replies``: reads of the item itself. Its parked reason is
    read beside them without raising: a ``parked_why`` of another type (a hand write) shows the
    item as parked for an unknown reason rather than failing every listing."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _parked(score: float, why: Any) -> str | None:
    """Why an item is parked (its ``parked_why`` entry), None when it is not: its due score is not
    :data:`~delayq_backends.keys.PARKED_MS` (a stale entry), or the entry is unreadable."""
    if score_ms(score) != PARKED_MS:
        return None
    return why.decode("utf-8", "backslashreplace") if isinstance(why, bytes) else "unknown"


def _parse_lease(lease: bytes | None, score: float) -> tuple[int | None, int]:
    """(lease deadline or None, original ready ms) from a ``leased`` hash value.

    A deferred item's entry ("<not-before>:deferred:<ready>") reads as held until not-before.
    An entry that is not "<ms>:<token>:<ms>" (a hand write) reads as no lease, so the item
    stays readable; the next claim buries it with the reason.
    """
    parts = lease.split(b":") if lease else []
    if len(parts) in (2, 3) and parts[0].isdigit() and parts[-1].lstrip(b"-").isdigit():
        return score_ms(parts[0]), score_ms(parts[-1])
    return None, score_ms(score)


def _parse_dead_info(raw: bytes | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        info = json.loads(raw)
    except ValueError:
        return {"error": raw.decode("utf-8", "replace")}
    return info if isinstance(info, dict) else {"error": str(info)}
