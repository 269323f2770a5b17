"""The forwarder's API: claim due items under a lease, then settle them through the
:class:`Lease` (ack, release, defer, fail, extend, rearm), and the shared rate buckets."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..connection import on_store_server
from ..keys import GROUP_REASON, ShardKeys, claim_token, key_rate_key, rate_key
from ..models import (
    Claim,
    ClaimedItem,
    FailCounts,
    FailedDelivery,
    LeaseExtension,
    Parked,
    ParkedCounts,
    RearmOutcome,
    RunRef,
    ScheduleItem,
    TokenGrant,
)
from ..outages import CONNECTION_ERRORS
from ..scripts.library import ScriptCall
from ..scripts.store import (
    Ack,
    ClaimScript,
    DeadLimits,
    Defer,
    Extend,
    Fail,
    Keep,
    Park,
    Rearm,
    Release,
    ScheduleOne,
    Take,
    Unpark,
)
from ..timeutil import When, score_ms
from .base import Payload, R, full_store_said_plainly
from .glines import LINE_RECHECK_MS
from .periodic import PeriodicRecords
from .starts import is_start_record

__all__ = ["Forwarding", "Lease"]


class Forwarding(PeriodicRecords):
    """The forwarder role (ACL role ``forwarder``): claims and what settles them.

    The methods taking a :class:`~delayq_backends.models.Claim` are what a :class:`Lease` calls;
    a forwarder takes a :class:`Lease` from :meth:`lease` and settles through it.
    """

    def claim(
        self, shard: int, *, limit: int = 200, lease_ms: int | None = None, now: int | None = None, claimer: str = ""
    ) -> Claim:
        """Lease up to ``limit`` due items of ``shard``: ranked ones first (highest rank, then
        earliest), then the rest earliest first.

        ``now`` overrides the server clock (tests and the in-process testing store only).
        ``claimer`` (a forwarder's name) is written into the claim's token (:func:`claim_token`),
        so ``delayq why`` can say which forwarder holds an item.
        """
        return self._run(self._claim_call(shard, limit, lease_ms, now, claimer), shard)

    def claim_many(
        self,
        shards: Sequence[int],
        *,
        limit: int = 200,
        lease_ms: int | None = None,
        now: int | None = None,
        claimer: str = "",
    ) -> list[Claim | Exception]:
        """:meth:`claim` on each of ``shards``, in one round trip: each shard's claim, or the
        error it raised (a key of another type, the server at maxmemory), so one bad shard does
        not cost the others their batch.

        On a cluster, one call per shard (redis-py runs no script in a cluster pipeline).

        Raises:
            redis.ConnectionError, redis.TimeoutError: the store is unreachable, not one shard.
        """
        self.check_meta()
        calls = [self._claim_call(shard, limit, lease_ms, now, claimer)(self._keys[shard]) for shard in shards]
        return self._run_per_shard(calls)

    def _run_per_shard(self, calls: Sequence[ScriptCall[R]]) -> list[R | Exception]:
        """Run ``calls`` (each on one shard's keys) in one round trip: each call's reply, or the
        error it raised, so one bad shard does not cost the others theirs. On a cluster, one
        call at a time (redis-py runs no script in a cluster pipeline).

        Raises:
            redis.ConnectionError, redis.TimeoutError: the store is unreachable, not one shard.
        """
        return self.run_each(calls, _shard_reply)

    def _claim_call(
        self, shard: int, limit: int, lease_ms: int | None, now: int | None, claimer: str = ""
    ) -> Callable[[ShardKeys], ScriptCall[Claim]]:
        lease = self.config.lease_ms if lease_ms is None else lease_ms
        token = claim_token(claimer)
        return lambda k: ClaimScript.call(
            k,
            shard=shard,
            token=token,
            limit=limit,
            lease_ms=lease,
            max_attempts=self.config.max_attempts,
            now=self.script_now(now),
            dead=self._dead_limits,
            max_payload_bytes=self.config.max_payload_bytes,
        )

    def lease(self, shard: int, *, limit: int = 200, lease_ms: int | None = None, now: int | None = None) -> Lease:
        """:meth:`claim`, as a :class:`Lease` to settle the items through."""
        return Lease(self, self.claim(shard, limit=limit, lease_ms=lease_ms, now=now))

    def ack(self, claim: Claim, ids: Iterable[str] | None = None, *, pipeline: Any = None) -> int:
        """Delete delivered items of ``claim`` (all by default) still under its lease.

        With ``pipeline`` (a transaction on the store's own server), the ack is queued there, so a
        target commits its publish and the ack in one MULTI/EXEC; returns 0 then.
        """
        chosen = _ids(claim, ids)
        if not chosen:
            return 0
        if pipeline is not None:
            self._queue(lambda k: Ack.call(k, claim.lease, chosen), claim.shard, pipeline)
            return 0
        return self._run(lambda k: Ack.call(k, claim.lease, chosen), claim.shard)

    def ack_many(self, acks: Sequence[tuple[Claim, Sequence[str]]]) -> list[int | Exception]:
        """:meth:`ack` for each ``(claim, ids)`` of ``acks``, in one round trip (a forwarder's
        pass settles a claim per shard): each ack's count, or the error its shard raised.

        Raises:
            redis.ConnectionError, redis.TimeoutError: the store is unreachable, not one shard.
        """
        self.check_meta()
        todo = [n for n, (_, ids) in enumerate(acks) if ids]
        calls = [Ack.call(self._keys[acks[n][0].shard], acks[n][0].lease, acks[n][1]) for n in todo]
        replies = self._run_per_shard(calls)
        by_index = dict(zip(todo, replies))
        return [by_index.get(n, 0) for n in range(len(acks))]

    def release(self, claim: Claim, ids: Iterable[str] | None = None) -> int:
        """Put unpublished items of ``claim`` back at their ready time, attempt not counted."""
        chosen = _ids(claim, ids)
        if not chosen:
            return 0
        return self._run(lambda k: Release.call(k, claim.lease, chosen, wake=self._wake), claim.shard)

    def defer(self, claim: Claim, later: Iterable[tuple[str, int]]) -> int:
        """Give back items of ``claim`` as ``(id, not_before_ms)``, attempt not counted.

        For flow control: the items wait in the store until then, keeping their original ready
        time (lateness stays truthful). Returns how many were still under the lease.
        """
        pairs = list(later)
        if not pairs:
            return 0
        return self._run(lambda k: Defer.call(k, claim.lease, pairs), claim.shard)

    def park(self, claim: Claim, reasons: Mapping[str, str], *, recheck_ms: int) -> Parked:
        """Park items of ``claim`` this forwarder cannot release (id -> reason, ``format:<n>`` or
        ``target:<kind>``) out of the due index until ``recheck_ms`` (:meth:`recheck_parked`).

        Unlike :meth:`defer`, no claim reads them meanwhile: 100,000 items of a newer format
        deferred every few seconds cost every other item its lateness. Attempt not counted, the
        original ready time kept. A parking key of another type (a hand write) is named in the
        result, and the items are deferred to ``recheck_ms`` instead.
        """
        if not reasons:
            return Parked(0)
        chosen = dict(reasons)
        return self._run(lambda k: Park.call(k, claim.lease, chosen, recheck_ms=recheck_ms), claim.shard)

    def recheck_parked(
        self, shard: int, releasable: Callable[[str | None], bool], *, limit: int, later_ms: int, now: int | None = None
    ) -> ParkedCounts:
        """Look again at up to ``limit`` of ``shard``'s parked items whose time has come: those
        whose reason ``releasable`` accepts are due again (at their ready time), the rest parked
        until ``later_ms``.

        ``releasable`` gets each reason as stored (None when missing; anything when a hand
        write): a caller accepts what it cannot read, so the next claim decides again and no
        garbage keeps an item parked. An item parked for its group (``group:<key>``) stays
        parked while it is in its group's line (looked at again :data:`LINE_RECHECK_MS` later)
        and is released once it is in none. Two round trips: the entries and reasons, then the moves.

        Raises:
            redis.ResponseError: a parking key holds another type (a hand write); the message names it.
        """
        k = self._keys[shard]
        at = self.clock() if now is None else now
        entries = self.client.zrangebyscore(k.parked, "-inf", at, start=0, num=limit)
        ids = [i for i in entries if isinstance(i, bytes)]  # the store's clients never decode
        if not ids:
            return ParkedCounts()
        reasons = [
            r.decode("utf-8", "replace") if isinstance(r, bytes) else None for r in self.client.hmget(k.parked_why, ids)
        ]
        in_line = self._in_lines(k, ids, reasons)
        go = [i not in in_line and (_grouped(why) or releasable(why)) for i, why in zip(ids, reasons)]
        release = [i for i, ok in zip(ids, go) if ok]
        keep = [i for i, ok in zip(ids, go) if not ok and i not in in_line]
        wake = self._wake
        counts = self._run(
            lambda keys: Unpark.call(keys, release, keep, later_ms=later_ms, now=self.script_now(now), wake=wake), shard
        )
        if not in_line:
            return counts
        lined = self._run(
            lambda keys: Unpark.call(
                keys, [], sorted(in_line), later_ms=at + LINE_RECHECK_MS, now=self.script_now(now), wake=wake
            ),
            shard,
        )
        return ParkedCounts(counts.released, counts.kept + lined.kept, counts.stale + lined.stale)

    def _in_lines(self, k: ShardKeys, ids: Sequence[bytes], reasons: Sequence[str | None]) -> set[bytes]:
        """The ``ids`` parked for a group (reason ``group:<key>``) that wait in its line: they stay
        parked until their group releases them; one parked for a group but in no line (its line
        lost to a hand write) is released, and its claim puts it back in line."""
        grouped = [(i, k.gline(why.partition(":")[2])) for i, why in zip(ids, reasons) if why and _grouped(why)]
        if not grouped:
            return set()
        with self.client.pipeline(transaction=False) as pipe:
            for i, line in grouped:
                pipe.zscore(line, i)
            found = pipe.execute(raise_on_error=False)
        return {i for (i, _), score in zip(grouped, found) if isinstance(score, float)}

    def keep(self, claim: Claim, windows: Mapping[str, int], *, now: int | None = None, pipeline: Any = None) -> int:
        """Lossless mode's ack: keep published items of ``claim`` (id -> window ms) until a
        worker reports their start, each due again its window from the server's now (``keep.lua``).

        The lease is dropped and the claim's attempt stays counted (a task that never starts is
        published at most ``max_attempts`` times); the item reads as awaiting its start
        (:attr:`~delayq_backends.models.ScheduledItem.awaiting_start`). Returns how many were
        still under the lease (0 when queued on ``pipeline``, a caller's MULTI/EXEC).
        """
        if not windows:
            return 0
        chosen = dict(windows)
        call = lambda k: Keep.call(k, claim.lease, chosen, now=self.script_now(now))  # noqa: E731
        if pipeline is not None:
            self._queue(call, claim.shard, pipeline)
            return 0
        return self._run(call, claim.shard)

    def started(self, shard: int, runs: Sequence[RunRef]) -> set[str]:
        """The ids among ``runs`` whose run a worker has started (its dedupe record exists).

        One pipelined ``GET`` per run, on the one server that holds ``shard``: each record
        lives in its item's shard slot (:meth:`~delayq_backends.keys.ShardKeys.started`). A
        value that is no start record (a hand write, another type) is none: the run is
        published again, and its worker replaces it (:meth:`Starts.record_start`).
        """
        if not runs:
            return set()
        keys = self._keys[shard]
        with self._node_client(shard).pipeline(transaction=False) as pipe:
            for ref in runs:
                pipe.get(keys.started(ref.id, ref.run))
            found = pipe.execute(raise_on_error=False)
        return {ref.id for ref, v in zip(runs, found) if isinstance(v, bytes) and is_start_record(v)}

    def fail(self, claim: Claim, failures: Iterable[FailedDelivery], *, now: int | None = None) -> FailCounts:
        """Record failed deliveries: retried at their ``retry_at_ms``, or buried when that is None
        (a permanent error) or the item is out of attempts."""
        chosen = list(failures)
        if not chosen:
            return FailCounts()
        at, tries = self.script_now(now), self.config.max_attempts
        return self._run(
            lambda k: Fail.call(k, claim.lease, chosen, max_attempts=tries, now=at, dead=self._dead_limits), claim.shard
        )

    def extend(
        self,
        claim: Claim,
        ids: Iterable[str] | None = None,
        *,
        lease_ms: int | None = None,
        now: int | None = None,
    ) -> LeaseExtension:
        """Hold ``claim``'s items (all by default) ``lease_ms`` more from the server's now.

        For a publish that runs long: only the items' deadlines move, the claim's lease (what
        ack, release, fail and defer present) stays the same. Items no longer under the lease
        (acked, cancelled, claimed again after it ran out) are left alone and not returned.
        """
        chosen = _ids(claim, ids)
        lease = self.config.lease_ms if lease_ms is None else lease_ms
        at = self.script_now(now)
        return self._run(lambda k: Extend.call(k, claim.lease, chosen, lease_ms=lease, now=at), claim.shard)

    def rearm(self, claim: Claim, item_id: str, when: When, envelope: Payload, *, rank: int = 0) -> RearmOutcome:
        """Ack a claimed item and schedule it again (new ready time, envelope and rank) in one
        step, only while it is still under ``claim``'s lease: the next run of a periodic entry.

        A forwarder killed before this call leaves the item leased (it is claimed again when
        the lease runs out); after it, the next run stands. Either way exactly one next run.
        Returns REPLACED, HELD (no longer ours: nothing changed) or NOT_FOUND (cancelled).
        """
        item = self.check_item(item_id, when, envelope, rank)
        return self._run(lambda k: self._rearm_call(k, claim, item), self.shard_of(item.id))

    def rearm_many(self, claim: Claim, items: Sequence[ScheduleItem]) -> list[RearmOutcome | Exception]:
        """:meth:`rearm` of each of ``items`` (checked: :meth:`check_item`), in one round trip
        (one call per item on a cluster): each outcome, or the error its call raised.

        A claim's firings rearmed one call at a time cost a round trip per entry; on a busy
        machine each is a wait for the CPU, and a pass of many entries fell behind its next.

        Raises:
            redis.ConnectionError, redis.TimeoutError: the store is unreachable.
        """
        self.check_meta()
        return self._run_per_shard([self._rearm_call(self._keys[self.shard_of(i.id)], claim, i) for i in items])

    def _rearm_call(self, keys: ShardKeys, claim: Claim, item: ScheduleItem) -> ScriptCall[RearmOutcome]:
        return Rearm.call(keys, item, lease=claim.lease, expected=b"", now=self.script_now(None), wake=self._wake)

    def held(self, claim: Claim, ids: Sequence[str], *, client: Any = None) -> list[str]:
        """The ``ids`` still under ``claim``'s lease, read through ``client`` (default: the store's).

        A target that WATCHes :meth:`lease_key` first and reads this through the same connection
        knows its transaction will abort if any of these leases changes before EXEC.
        """
        if not ids:
            return []
        held = (self.client if client is None else client).hmget(self._keys[claim.shard].leased, list(ids))
        mark = f"{claim.lease}:".encode()
        return [item_id for item_id, lease in zip(ids, held) if lease is not None and lease.startswith(mark)]

    def lease_key(self, claim: Claim) -> str:
        """The key every change to a lease of ``claim``'s shard writes: WATCH it to guard a hand-off."""
        return self._keys[claim.shard].leased

    def take_tokens(self, queue: str, wanted: int, *, rate: float, burst: int, now: int | None = None) -> TokenGrant:
        """Take up to ``wanted`` tokens from ``queue``'s rate bucket, shared by all forwarders.

        The refused ``wanted - granted`` may go from the grant's first slot on, one every
        ``1000 / rate`` ms (they hold those slots).
        """
        call = Take.call(rate_key(self.config.prefix, queue), wanted, rate=rate, burst=burst, now=self.script_now(now))
        with full_store_said_plainly():
            return self.scripts.run(call)

    def take_key_tokens(
        self, queue: str, wanted: Mapping[str, int], *, rate: float, burst: int, now: int | None = None
    ) -> dict[str, TokenGrant | Exception]:
        """:meth:`take_tokens` from the bucket of each rate key of ``queue`` in ``wanted``
        (key -> tokens wanted), in one round trip (one per key on a cluster, whose pipelines
        cannot run scripts). A key whose bucket fails gets its error (a Redis error reply, or
        :class:`StoreFullError`) instead of its grant."""
        prefix = self.config.prefix
        calls = [
            Take.call(key_rate_key(prefix, queue, key), n, rate=rate, burst=burst, now=self.script_now(now))
            for key, n in wanted.items()
        ]
        replies = self.run_each(calls)
        return dict(zip(wanted, replies))

    def heads(self, *, lines: list[int | None] | None = None) -> list[int | None]:
        """Each shard's earliest score (ready time, or lease deadline, or the time a group's line
        may next release: ``gready``), None when empty.

        A shard whose index cannot be read (a key of ours holding another type, say) reads as
        due at 0, so a forwarder tries it and reports the error, while the other shards go on;
        so does a ``gready`` of another type (the release step makes it expire and says so).
        ``lines``, when given, is filled with each shard's ``gready`` head alone.
        """
        self.check_meta(record=False)
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zrange(k.due, 0, 0, withscores=True)
                pipe.zrange(k.gready, 0, 0, withscores=True)
            replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
                raise reply  # an outage, not one bad shard: the caller backs off
        heads: list[int | None] = []
        for due, group in zip(replies[::2], replies[1::2]):
            head = 0 if isinstance(due, Exception) else score_ms(due[0][1]) if due else None
            # a gready of another type reads as due: the release step makes it expire
            line = 0 if isinstance(group, Exception) else score_ms(group[0][1]) if group else None
            if lines is not None:
                lines.append(line)
            heads.append(line if head is None else head if line is None else min(head, line))
        return heads

    def subscribe_wake(self) -> Any:
        """A pub/sub connection subscribed to the wake channel: scripts publish there when a
        change makes a shard's head earlier, so a sleeping forwarder wakes for it."""
        # redis-py < 8.2 leaves pubsub() unannotated (an untyped call); 8.2 annotates it
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        pubsub.subscribe(self._wake)
        return pubsub

    @property
    def _dead_limits(self) -> DeadLimits:
        """What the scripts that bury keep (Config.dead_letter_max / dead_letter_ttl_seconds)."""
        return DeadLimits(self.config.dead_letter_max, self.config.dead_letter_ttl_seconds * 1000)


@dataclass(frozen=True)
class Lease:
    """One claim held by a forwarder, and everything it may do with the claimed items.

    To hand items over exactly once, a target on the store's own server WATCHes
    :attr:`watch_key` (with its own keys), reads :meth:`held` on the watching connection,
    queues its publish, then :meth:`ack` with ``pipeline=``, and runs EXEC: a lease lost or
    changed after the read aborts the transaction, and a crash before EXEC leaves nothing
    published and nothing acked.
    """

    store: Forwarding
    claim: Claim
    #: lossless mode: ids whose ack keeps them awaiting their start -> window ms (see
    #: :meth:`Forwarding.keep`); :meth:`ack` deletes the others
    keep_windows: Mapping[str, int] = field(default_factory=dict)

    @property
    def shard(self) -> int:
        return self.claim.shard

    @property
    def items(self) -> list[ClaimedItem]:
        return self.claim.items

    @property
    def deadline_ms(self) -> int:
        return self.claim.deadline_ms

    def now_ms(self) -> int:
        """The store's clock (the server's, unless a test store runs a fake one)."""
        return self.store.clock()

    def shares_server(self, client: Any) -> bool:
        """Whether ``client`` talks to the store's own (non-cluster) server and database."""
        return on_store_server(self.store, client)

    @property
    def watch_key(self) -> str:
        return self.store.lease_key(self.claim)

    def held(self, client: Any, ids: Sequence[str]) -> list[str]:
        """The ``ids`` still under this lease, read through ``client`` (see :meth:`Forwarding.held`)."""
        return self.store.held(self.claim, ids, client=client)

    def ack(self, ids: Iterable[str] | None = None, *, pipeline: Any = None) -> int:
        """Delete delivered items (all by default) still under this lease; see :meth:`Forwarding.ack`.

        In lossless mode the ids in :attr:`keep_windows` are kept awaiting their start instead
        (:meth:`Forwarding.keep`, on the same ``pipeline``); the count is of both.
        """
        chosen = _ids(self.claim, ids)
        kept = {i: self.keep_windows[i] for i in chosen if i in self.keep_windows}
        deleted = self.store.ack(self.claim, [i for i in chosen if i not in kept], pipeline=pipeline)
        return deleted + self.store.keep(self.claim, kept, pipeline=pipeline)

    def keep(self, windows: Mapping[str, int]) -> int:
        return self.store.keep(self.claim, windows)

    def release(self, ids: Iterable[str] | None = None) -> int:
        return self.store.release(self.claim, ids)

    def defer(self, later: Iterable[tuple[str, int]]) -> int:
        return self.store.defer(self.claim, later)

    def park(self, reasons: Mapping[str, str], *, recheck_ms: int) -> Parked:
        return self.store.park(self.claim, reasons, recheck_ms=recheck_ms)

    def fail(self, failures: Iterable[FailedDelivery], *, now: int | None = None) -> FailCounts:
        return self.store.fail(self.claim, failures, now=now)

    def extend(self, ids: Iterable[str] | None = None, *, lease_ms: int | None = None) -> LeaseExtension:
        return self.store.extend(self.claim, ids, lease_ms=lease_ms)

    def rearm(self, item_id: str, when: When, envelope: Payload, *, rank: int = 0) -> RearmOutcome:
        """Ack ``item_id`` and schedule it again in one step, if still under this lease (a
        periodic entry's next run; see :meth:`Forwarding.rearm`). For targets whose broker is
        not the store's server: publish first, then rearm; report the id in ``acked``."""
        return self.store.rearm(self.claim, item_id, when, envelope, rank=rank)

    def rearm_many(self, items: Sequence[ScheduleItem]) -> list[RearmOutcome | Exception]:
        """:meth:`rearm` of each of ``items`` (checked by the store's ``check_item``) in one round
        trip (:meth:`Forwarding.rearm_many`): each outcome, or the error its call raised."""
        return self.store.rearm_many(self.claim, items)

    def schedule(self, item_id: str, when: When, envelope: Payload, *, rank: int = 0, pipeline: Any = None) -> None:
        """Schedule a follow-up (a periodic job's next run), replacing the item of that id: on the
        caller's ``pipeline`` (its MULTI/EXEC) or at once. Dropping the lease with it, so a late
        ack cannot delete the next run."""
        item = self.store.check_item(item_id, when, envelope, rank)
        shard = self.store.shard_of(item.id)
        wake = self.store.wake_channel
        self.store._write_or_queue(lambda k: ScheduleOne.call(k, item, wake=wake), shard, pipeline)


def _shard_reply(call: Callable[[], R]) -> R | Exception:
    """``call()``'s reply, or the error it raised; an outage is raised (it is not one shard's)."""
    try:
        with full_store_said_plainly():
            return call()
    except CONNECTION_ERRORS:
        raise
    except Exception as exc:  # a Redis error reply, or a reply that cannot be read
        return exc


def _grouped(why: str | None) -> bool:
    """Whether a parked item's reason is its group's (``group:<key>``)."""
    return why is not None and why.partition(":")[0] == GROUP_REASON


def _ids(claim: Claim, ids: Iterable[str] | None) -> list[str]:
    return [item.id for item in claim.items] if ids is None else list(ids)
