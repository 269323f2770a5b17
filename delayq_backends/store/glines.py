"""Group lines in the store (issue 31): where grouped items wait until their group can take them.

A grouped item waits parked (``includes/parking.lua``) and listed in its shard's line of its
group (:meth:`~delayq_backends.keys.ShardKeys.gline`); the shard's ``gready`` says when each
group's line may next release. Producers write grouped items straight into their lines
(:meth:`~.producer.Producer.schedule`); a forwarder's pass first releases line heads by each
group's room and weight (:meth:`GroupLines.release_lines`), and an item its group then refuses
goes back to its line (:meth:`GroupLines.to_lines`). So a claim never reads an item its group
cannot take, however long the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..envelope import Envelope, groups_of
from ..keys import GROUP_REASON, MAX_RANK, RANK_SPAN, group_policy_key, group_wake_channel
from ..models import Claim, LinePlace, LineRelease, SlotGrant
from ..scripts.store import GroupPark, GroupRelease, LineItem
from .base import Payload
from .slots import WAIT_MS, SlotAsk, Slots

__all__ = [
    "GROUPS_PER_LOOK",
    "HEADS_GUESSED",
    "MAX_HAND_OVER",
    "LINE_RECHECK_MS",
    "GroupLines",
    "GroupRoom",
    "line_group",
    "line_order",
]

#: Most line heads one hand-over gives a group (:meth:`GroupLines.hand_over`); more free slots
#: are the release step's (its budget shared across the shards).
MAX_HAND_OVER = 100
#: Most line heads a shard the hand-over reads with a group's room, in the same round trip (the
#: group's limit as known here, at least one): a group with more free slots has its heads read again.
HEADS_GUESSED = 10
#: How long until a parked re-check looks at an item waiting in its line (a safety net: an item
#: found in no line is released then). Long: a line's item is released by its group, not by this.
LINE_RECHECK_MS = 300_000
#: Most groups one look at a shard's ``gready`` returns: a pass's release step stays bounded
#: however many groups are due (the rest are due at the next pass).
GROUPS_PER_LOOK = 500
#: The end of the last band of a line's orders (rank 0's): an entry at or past it is no item's.
LINE_END = (MAX_RANK + 1) * RANK_SPAN
#: The markers a grouped item's meta carries in its envelope bytes (the JSON of ``groups`` and of
#: its aliases): only an envelope holding one is decoded to find its group, so ungrouped items
#: cost no decode. One pattern, so an ungrouped item costs one search in C, not one per marker
#: (three searches and a generator were a fifth of ``schedule_many``'s client time).
_GROUPED = re.compile(rb'"(?:groups|slot|rate_key)":')
#: How far into an envelope the marker is looked for: the meta comes before the body, so a large
#: body costs nothing. A group past it (a huge meta) is found at the item's admission instead, and
#: the item joins its line then.
_HEAD_BYTES = 2048


def line_group(envelope: Payload) -> str | None:
    """The key of ``envelope``'s line group (its first), None when it carries no group."""
    if isinstance(envelope, (bytes, bytearray)):
        if _GROUPED.search(envelope, 0, _HEAD_BYTES) is None:
            return None
        envelope = Envelope.decode(bytes(envelope))
    groups = groups_of(envelope)
    return groups[0].key if groups else None


def line_order(rank: int, ready_ms: int) -> int:
    """An item's order in its line, as ``includes/glines.lua`` writes it: rank band, then ready."""
    return (MAX_RANK - rank) * RANK_SPAN + max(0, min(ready_ms, RANK_SPAN - 1))


@dataclass(frozen=True)
class GroupRoom:
    """What a group can take now: its limit (0: none) and holds running, and whether it is
    paused or throttled, from its keys (``slot_take.lua``, which folds the workers' reports first)."""

    limit: int
    running: int
    #: what the slot script found out of place in the group's keys and dropped ("" when nothing)
    reset: str = ""
    paused: bool = False
    #: ms until which the group is throttled; None: it is not
    throttled_until: int | None = None

    @property
    def free(self) -> int | None:
        """Slots free now (none while paused or throttled); None: no limit."""
        if self.paused or self.throttled_until is not None:
            return 0
        return None if self.limit <= 0 else max(0, self.limit - self.running)

    def stopped_until(self, now: int, paused_recheck_ms: int) -> int | None:
        """When to look at a stopped group again (its throttle's end; a paused one soon, for
        its resume); None: it is not stopped."""
        if self.throttled_until is not None:
            return self.throttled_until
        return now + paused_recheck_ms if self.paused else None


class GroupLines(Slots):
    """The lines: the forwarder's release, refusal and wake; the readers' counts and places."""

    def due_groups(self, shards: Sequence[int], *, now: int) -> dict[int, tuple[list[str], bool]]:
        """Per shard of ``shards`` whose lines may release now: those groups (at most
        :data:`GROUPS_PER_LOOK`, earliest first), and whether items of no group are due there
        too (they share the shard's pass as one more group). One round trip. A shard whose
        ``gready`` holds another type is listed with no group: its release call drops the key."""
        with self.client.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.zrangebyscore(self._keys[shard].gready, "-inf", now, start=0, num=GROUPS_PER_LOOK)
                pipe.zrange(self._keys[shard].due, 0, 0, withscores=True)
            replies = pipe.execute(raise_on_error=False)
        found: dict[int, tuple[list[str], bool]] = {}
        for shard, groups, head in zip(shards, replies[::2], replies[1::2]):
            others = isinstance(head, list) and bool(head) and head[0][1] <= now
            if isinstance(groups, list) and groups:
                found[shard] = ([_text(g) for g in groups], others)
            elif isinstance(groups, ResponseError):  # another type: the release call makes it expire
                found[shard] = ([], others)
        return found

    def group_rooms(
        self, groups: Iterable[str], *, limits: Mapping[str, int], hold_ms: int
    ) -> dict[str, GroupRoom | Exception]:
        """Each group's room, in one round trip: its slot keys' limit (the runtime one, else
        ``limits``': what its items carry, as an admission last applied it) and running holds (a
        "join" of no item: it folds the workers' reports and lapsed holds)."""
        named = list(dict.fromkeys(groups))
        if not named:
            return {}
        asks = {g: SlotAsk(limits.get(g, 0), ()) for g in named}
        grants = self.take_slots(asks, hold_ms=hold_ms, wait_ms=WAIT_MS, mode="join")
        return {g: _room(grant) for g, grant in grants.items()}

    def group_weights(self, groups: Sequence[str]) -> dict[str, float]:
        """Each group's weight (its policy's ``weight``; 1 when unset or not a number > 0), one
        round trip."""
        if not groups:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            for g in groups:
                pipe.hget(group_policy_key(self.config.prefix, g), "weight")
            replies = pipe.execute(raise_on_error=False)
        return {g: _weight(w) for g, w in zip(groups, replies)}

    def line_heads(
        self, wanted: Mapping[str, Sequence[int]], *, count: int, now: int
    ) -> dict[str, list[tuple[int, int]]]:
        """The first ``count`` items of each group's line in each of its shards (``wanted``: group
        -> shards) that are due by ``now``, as (order, shard): one round trip. A group with few
        free slots gives them to the earliest heads across the shards."""
        asked = [(g, s, count) for g, shards in wanted.items() for s in shards]
        if not asked or count <= 0:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            self._queue_heads(pipe, asked)
            replies = pipe.execute(raise_on_error=False)
        return self._heads_read(wanted, asked, replies, now)

    def _queue_heads(self, pipe: Any, asked: Sequence[tuple[str, int, int]]) -> None:
        """Queue on ``pipe`` the reads of the first items of each (group, shard, count) line."""
        for g, s, count in asked:  # within the bands: a hand-written entry outside them is no item
            pipe.zrangebyscore(self._keys[s].gline(g), 0, f"({LINE_END}", start=0, num=count, withscores=True)

    @staticmethod
    def _heads_read(
        groups: Iterable[str], asked: Sequence[tuple[str, int, int]], replies: Sequence[object], now: int
    ) -> dict[str, list[tuple[int, int]]]:
        """The due heads (order, shard) per group of :meth:`_queue_heads`' ``replies``."""
        heads: dict[str, list[tuple[int, int]]] = {g: [] for g in groups}
        for (g, s, _), reply in zip(asked, replies):
            if isinstance(reply, list):
                heads[g] += [(int(o), s) for _, o in reply if int(o) % RANK_SPAN <= now]
        return heads

    def release_lines(
        self, plan: Mapping[int, Sequence[tuple[str, int, int]]], *, now: int | None = None
    ) -> dict[int, tuple[list[LineRelease], str] | Exception]:
        """Release line heads per shard (``group_release.lua``, one call per shard, one round
        trip): ``plan`` maps a shard to (group, allowance, held-until ms or 0) of its groups.
        Each shard's releases in the plan's order and the keys it found holding another type
        (made to expire: "" when none), or the error its call raised."""
        shards = list(plan)
        at = self.script_now(now)
        calls = [GroupRelease.call(self._keys[s], plan[s], now=at) for s in shards]
        replies: list[tuple[list[LineRelease], str] | Exception] = self.run_each(calls)
        return dict(zip(shards, replies))

    def to_lines(self, claim: Claim, items: Sequence[LineItem], *, recheck_at: int) -> tuple[int, int]:
        """Put ``claim``'s ``items`` (refused by their groups) back in their lines, each group
        looked at again at its item's ``until_ms``: how many were still under the lease, and
        how many of those were deferred to that time instead (a line key of another type)."""
        if not items:
            return 0, 0
        return self._run(lambda k: GroupPark.call(k, claim.lease, items, recheck_at=recheck_at), claim.shard)

    def hand_over(
        self, groups: Iterable[str], *, now: int, held_until: int, limits: Mapping[str, int], hold_ms: int
    ) -> dict[str, GroupRoom | Exception]:
        """Hand the free slots of ``groups`` (woken: a slot was given back) straight to the heads of
        their lines, earliest first across the shards, in two round trips: the groups' rooms (as
        :meth:`group_rooms` reads them, folding the workers' end reports) with their due line
        heads (as many a shard as the limit known here, at most :data:`HEADS_GUESSED`; read
        again in a round trip of their own when a group has more free slots), then one
        ``group_release.lua`` call per shard holding a head, with a group whose heads take all
        its free slots held until ``held_until`` in its other shards' lines (as the release step
        holds a bound group). The claim that follows takes the heads, and admission takes their
        slots as for any release: a hand-over adds no slot. A group with no limit, or whose room
        or heads cannot be read, has its lines made due now in every shard: the release step
        looks at them in this pass. The groups' rooms as read (for the caller to log what the
        slot script dropped)."""
        named = list(dict.fromkeys(groups))
        if not named:
            return {}
        guessed = {g: max(1, min(limits.get(g, 0), HEADS_GUESSED)) for g in named}
        rooms, heads = self._rooms_and_heads(guessed, limits=limits, hold_ms=hold_ms, now=now)
        free = {g: r.free for g, r in rooms.items() if isinstance(r, GroupRoom) and r.free is not None}
        wanted = {g: min(n, MAX_HAND_OVER) for g, n in free.items() if n > 0}
        more = {g: n for g, n in wanted.items() if n > guessed[g]}
        if more:  # more free slots than heads read a shard
            shards = range(len(self._keys))
            heads.update(self.line_heads(dict.fromkeys(more, shards), count=max(more.values()), now=now))
        plan, bound = _hand_over_plan(wanted, heads)
        self._hand_over_writes(plan, bound, [g for g in named if g not in free], now=now, held_until=held_until)
        return rooms

    def _rooms_and_heads(
        self, guessed: Mapping[str, int], *, limits: Mapping[str, int], hold_ms: int, now: int
    ) -> tuple[dict[str, GroupRoom | Exception], dict[str, list[tuple[int, int]]]]:
        """The rooms of the groups of ``guessed`` and the first ``guessed[g]`` due heads of each
        of group g's lines (order, shard), in one round trip."""
        asks = {g: SlotAsk(limits.get(g, 0), ()) for g in guessed}
        at = self.script_now(None)
        calls, tokens = self.slot_take_calls(asks, hold_ms=hold_ms, wait_ms=WAIT_MS, now=at, mode="join")
        asked = [(g, s, n) for g, n in guessed.items() for s in range(len(self._keys))]
        replies, reads = self.run_each_with(calls, lambda pipe: self._queue_heads(pipe, asked))
        grants = self.slots_granted(asks, replies, tokens, at)
        return {g: _room(grant) for g, grant in grants.items()}, self._heads_read(guessed, asked, reads, now)

    def _hand_over_writes(
        self,
        plan: Mapping[int, Mapping[str, int]],
        bound: Sequence[str],
        looked: Sequence[str],
        *,
        now: int,
        held_until: int,
    ) -> None:
        """Release ``plan``'s heads (shard -> group -> how many), hold the ``bound`` groups' other
        lines until ``held_until`` (only raised: a line due later keeps its time) and make the
        ``looked`` groups' lines due now, in one round trip; a group whose release failed has its
        lines made due now (one more)."""
        held = set(bound)
        at = self.script_now(None)
        calls = [
            GroupRelease.call(self._keys[s], [(g, n, held_until if g in held else 0) for g, n in gs.items()], now=at)
            for s, gs in plan.items()
        ]

        def writes(pipe: Any) -> None:
            if looked:
                self._lines_due(pipe, looked, now)
            for k in self._keys if bound else ():
                pipe.zadd(k.gready, dict.fromkeys(bound, held_until), xx=True, gt=True)

        replies, _ = self.run_each_with(calls, writes)
        failed = sorted({g for s, reply in zip(plan, replies) if isinstance(reply, Exception) for g in plan[s]})
        if failed:
            with self.client.pipeline(transaction=False) as pipe:
                self._lines_due(pipe, failed, now)
                pipe.execute(raise_on_error=False)

    @property
    def group_wake_channel(self) -> str:
        """The channel a worker's end names its group on (:func:`~delayq_backends.keys.group_wake_channel`)."""
        return group_wake_channel(self.config.prefix)

    def bring_lines_near(self, *, now: int, ahead_ms: int) -> int:
        """Make due ``now`` the group lines whose next look (``gready``) lies over ``ahead_ms``
        ahead, every shard (two round trips, at most :data:`GROUPS_PER_LOOK` per shard): how many."""
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zrangebyscore(k.gready, f"({now + ahead_ms}", "+inf", start=0, num=GROUPS_PER_LOOK)
            far = pipe.execute(raise_on_error=False)
        found = [(k, reply) for k, reply in zip(self._keys, far) if isinstance(reply, list) and reply]
        if found:
            with self.client.pipeline(transaction=False) as pipe:
                for k, groups in found:
                    pipe.zadd(k.gready, dict.fromkeys(groups, now), xx=True)
                pipe.execute(raise_on_error=False)
        return sum(len(groups) for _, groups in found)

    def group_lines(self, groups: Sequence[str]) -> dict[str, int]:
        """Items waiting in each group's lines, all shards summed (one pipelined round of ZCARD
        per group and shard; a line of another type counts 0)."""
        with self.client.pipeline(transaction=False) as pipe:
            for g in groups:
                for k in self._keys:
                    pipe.zcard(k.gline(g))
            replies = pipe.execute(raise_on_error=False)
        n = len(self._keys)
        return {g: sum(r for r in replies[i * n : (i + 1) * n] if isinstance(r, int)) for i, g in enumerate(groups)}

    def line_place(self, item_id: str) -> LinePlace | None:
        """The group whose line ``item_id`` waits in, and how many of its items (every shard's)
        go before it; None when it waits in no line. A few round trips (a reader's question)."""
        k = self._keys[self.shard_of(item_id)]
        why, envelope = self.client.hget(k.parked_why, item_id), self.client.hget(k.items, item_id)
        kind, _, group = (_text(why) if isinstance(why, bytes) else "").partition(":")
        if kind != GROUP_REASON:  # a producer's schedule records no reason: the item names its group
            group = (line_group(envelope) if isinstance(envelope, bytes) else None) or ""
        if not group:
            return None
        order = self.client.zscore(k.gline(group), item_id)
        if order is None:
            return None
        with self.client.pipeline(transaction=False) as pipe:
            for other in self._keys:
                pipe.zcount(other.gline(group), "-inf", f"({int(order)}")
            counts = pipe.execute(raise_on_error=False)
        return LinePlace(group, sum(c for c in counts if isinstance(c, int)))


def _room(grant: SlotGrant | Exception) -> GroupRoom | Exception:
    """A group's room as a "join" of no item read it (or the error its keys raised)."""
    if isinstance(grant, Exception):
        return grant
    return GroupRoom(grant.limit, grant.running, grant.reset, grant.paused, grant.throttled_until)


def _hand_over_plan(
    wanted: Mapping[str, int], heads: Mapping[str, Sequence[tuple[int, int]]]
) -> tuple[dict[int, dict[str, int]], list[str]]:
    """Where each group's ``wanted`` free slots go: its earliest due ``heads`` (order, shard)
    across the shards, as shard -> group -> how many; and the groups those heads take all of."""
    plan: dict[int, dict[str, int]] = {}
    bound: list[str] = []
    for g, n in wanted.items():
        first = sorted(heads.get(g, ()))[:n]
        for _, shard in first:
            plan.setdefault(shard, {})[g] = plan.get(shard, {}).get(g, 0) + 1
        if len(first) >= n:
            bound.append(g)
    return plan, bound


def _text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _weight(raw: object) -> float:
    """A policy's weight as stored; garbage (not a number > 0, or another type) reads as 1."""
    if isinstance(raw, ResponseError) or not isinstance(raw, bytes):
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        return 1.0
    return value if 0 < value <= 1_000_000 else 1.0
