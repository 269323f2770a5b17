"""Concurrency slots in the store: taken by forwarders at release, held and given back by
workers, limits set at runtime (see :mod:`delayq_backends.slots`).

A slot key's four keys share one hash tag of their own (:func:`~delayq_backends.keys.slot_holds_key`),
so each call touches one cluster slot and different keys spread over the nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from redis.exceptions import RedisError, ResponseError

from ..envelope import MAX_SLOT_LIMIT, Slot
from ..keys import slot_holds_key, slot_limit_key, slot_waiting_key, slot_waits_key
from ..models import SlotBoard, SlotGrant, SlotStatus
from ..scripts.store import Promote, SlotEnd, SlotHold, SlotTake
from .base import StoreCore
from .keylist import KeyList

__all__ = [
    "KEY_LIST_TTL",
    "RUN_HOLD_MS",
    "START_HOLD_MS",
    "STATUS_CHUNK",
    "WAIT_MS",
    "SlotAsk",
    "SlotKeyList",
    "Slots",
    "slot_item_ids",
    "slot_member",
]

log = logging.getLogger("delayq.slots")

#: How long a slot taken at release is held before the worker starts its item: the time a
#: message may wait in the broker. A message lost on its way holds its slot this long.
START_HOLD_MS = 300_000
#: How long a running item's hold lasts after its start or its worker's last beat (every third
#: of it): a worker that dies mid-task gives its slots back this long after its last beat.
RUN_HOLD_MS = 60_000
#: How long an item keeps its place in a key's line unless it asks again (it does at least
#: every few seconds while it waits): an item cancelled while it waits holds the line this long.
WAIT_MS = 15_000
#: Slot keys whose statuses one pipelined round reads (three commands each).
STATUS_CHUNK = 500
#: Seconds a :class:`SlotKeyList` keeps its list of slot keys before it SCANs again.
KEY_LIST_TTL = 30.0


def slot_member(item_id: str, run: int | None) -> str:
    """An item's member in its slot key's sets: its id, and its run when the target names one
    (Celery's ``retries``), so a retry released before its first run has ended takes a slot of
    its own instead of the one that run is about to give back."""
    return item_id if run is None else f"{item_id}#{run}"


def slot_item_ids(member: str) -> list[str]:
    """The item ids a member of a slot key's sets may name (:func:`slot_member`): itself, and
    the part before ``#`` when a run follows (an id may hold a ``#`` of its own)."""
    item, sep, run = member.rpartition("#")
    return [member, item] if sep and item and run.isdigit() else [member]


class SlotAsk(NamedTuple):
    """The items of one slot key asking for a slot: their limit (0: none) and (member, order)
    of each, in their order."""

    limit: int
    asking: Sequence[tuple[str, int]]


class Slots(StoreCore):
    """Slot keys: forwarders take (:meth:`take_slots`), workers hold and give back
    (:meth:`hold_slots`), operators set limits (:meth:`set_slot_limit`) and look
    (:meth:`slot_status`)."""

    def slot_keys(self, key: str) -> tuple[str, str, str, str]:
        """The holds, waiting, waits and limit keys of slot ``key``, in ``slot_take.lua``'s order."""
        prefix = self.config.prefix
        return (
            slot_holds_key(prefix, key),
            slot_waiting_key(prefix, key),
            slot_waits_key(prefix, key),
            slot_limit_key(prefix, key),
        )

    def take_slots(
        self,
        asks: Mapping[str, SlotAsk],
        *,
        hold_ms: int,
        wait_ms: int,
        now: int | None = None,
        mode: str = "take",
    ) -> dict[str, SlotGrant | Exception]:
        """Take slots for the items of each key of ``asks``, in one round trip; each key's
        grant, or the error its keys raised. ``mode`` "join": the items only take their places in
        their keys' lines (granted none); "leave": they give them up."""
        at = self.script_now(now)
        calls = [
            SlotTake.call(
                self.slot_keys(key), a.asking, limit=a.limit, hold_ms=hold_ms, wait_ms=wait_ms, now=at, mode=mode
            )
            for key, a in asks.items()
        ]
        replies = self.run_each(calls)
        return dict(zip(asks, replies))

    def hold_slots(
        self, holds: Mapping[str, Sequence[str]], mode: str, *, hold_ms: int, now: int | None = None
    ) -> dict[str, int | Exception]:
        """Start, extend ("beat") or end the holds of ``members`` per slot key, in one round
        trip: per key, how many were held before (-1: its holds key is garbage).

        "end" passes each slot it frees to the head of the key's line and brings those items
        forward (:meth:`_end_holds`): the slot is taken within a forwarder's pass, not at the item's
        next ask. ``hold_ms`` is then unused."""
        if mode == "end":
            return self._end_holds(holds, now)
        if mode not in SlotHold.MODES:
            raise ValueError(f"mode={mode!r}: use one of {(*SlotHold.MODES, 'end')}")
        prefix, at = self.config.prefix, self.script_now(now)
        calls = [
            SlotHold.call(slot_holds_key(prefix, key), mode, members, hold_ms=hold_ms, now=at)
            for key, members in holds.items()
        ]
        replies = self.run_each(calls)
        return dict(zip(holds, replies))

    def _end_holds(self, holds: Mapping[str, Sequence[str]], now: int | None) -> dict[str, int | Exception]:
        """End ``holds`` (``slot_end.lua``) and bring forward the items their slots passed to.

        A passed slot is held :data:`WAIT_MS` for its item to ask (it asks within a pass; at
        its recheck if bringing it forward failed), then as granted: an item cancelled meanwhile
        holds it no longer than it would have held the line. Never ended here on the item's
        behalf: an item not found may have been published and acked already, and its task
        runs under that slot."""
        at = self.script_now(now)
        calls = [SlotEnd.call(self.slot_keys(key), members, hold_ms=WAIT_MS, now=at) for key, members in holds.items()]
        answers = self.run_each(calls)
        replies = dict(zip(holds, answers))
        self._bring_forward((m for r in replies.values() if not isinstance(r, Exception) for m in r.passed), at)
        return {key: r if isinstance(r, Exception) else r.ended for key, r in replies.items()}

    def _bring_forward(self, members: Iterable[str], at: int) -> None:
        """Make the items of ``members`` due now if deferred (``promote.lua``, one call per
        shard, in one round trip; it wakes the forwarders). A failed call (or an outage) is
        logged and not raised: its items find their slots at their next ask."""
        by_shard: dict[int, list[str]] = {}
        for member in members:
            for item_id in slot_item_ids(member):
                by_shard.setdefault(self.shard_of(item_id), []).append(item_id)
        if not by_shard:
            return
        calls = [Promote.call(self._keys[s], ids, now=at, wake=self._wake) for s, ids in by_shard.items()]
        try:
            replies: list[int | Exception] = self.run_each(calls)
        except (RedisError, OSError) as exc:  # the holds are ended and passed: only this step failed
            replies = [exc]
        for reply in replies:
            if isinstance(reply, Exception):
                log.warning("could not bring the next in a slot line forward (%s); it asks at its recheck", reply)

    def set_slot_limit(self, key: str, limit: int | None) -> None:
        """Let at most ``limit`` items of ``key`` run at once, from the next release on, over the
        limit the items carry; None removes it (the items' own limit applies again, or none).

        Raises:
            InvalidSlotError: a key or limit that is not one; nothing was written.
            NotDurableError: with ``durable_replicas``, fewer replicas confirmed it in time.
        """
        Slot.parse({"key": key, "limit": limit})
        name = slot_limit_key(self.config.prefix, key)
        self.write_acknowledged(name, ("DEL", name) if limit is None else ("SET", name, str(limit)))

    def slot_keys_in_use(self) -> list[str]:
        """Every slot key with holds, a line or a limit, sorted (a SCAN of the prefix's slot
        keys, every primary's on a cluster: for ``delayq slots``, not a hot path)."""
        start = f"{self.config.prefix}:{{{self.config.prefix}:slot:"
        names = ("holds", "waiting", "waits", "limit")
        found: set[str] = set()
        for raw in self.client.scan_iter(match=f"{_glob_escaped(start)}*", count=1000):
            name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            key, sep, kind = name[len(start) :].rpartition("}:")
            if sep and kind in names:
                found.add(key)
        return sorted(found)

    def slot_status(self, key: str) -> SlotStatus:
        """Slot ``key``'s runtime limit, holds not lapsed and items waiting (read-only)."""
        return self.slot_statuses([key])[0]

    def slot_statuses(self, keys: Sequence[str]) -> list[SlotStatus]:
        """:meth:`slot_status` of each of ``keys``, in their order: one pipelined round per
        :data:`STATUS_CHUNK` keys, so a dashboard or a scrape of many keys costs few round trips."""
        now = self.clock()
        found: list[SlotStatus] = []
        for start in range(0, len(keys), STATUS_CHUNK):
            chunk = keys[start : start + STATUS_CHUNK]
            with self.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    holds, waiting, _, limit_key = self.slot_keys(key)
                    pipe.get(limit_key)
                    pipe.zcount(holds, f"({now}", "+inf")
                    pipe.zcard(waiting)
                replies = pipe.execute(raise_on_error=False)
            found += (_status(key, *replies[3 * i : 3 * i + 3]) for i, key in enumerate(chunk))
        return found

    def slot_board(self, keys: Sequence[str], *, offset: int = 0, limit: int | None = None) -> SlotBoard:
        """The statuses of ``keys`` busiest first (running plus waiting, then by key), ``limit``
        of them from ``offset`` on, with the counts over all of them (read-only)."""
        statuses = sorted(self.slot_statuses(keys), key=lambda s: (-(s.running + s.waiting), s.key))
        end = None if limit is None else offset + limit
        return SlotBoard(
            keys=len(statuses),
            running=sum(s.running for s in statuses),
            waiting=sum(s.waiting for s in statuses),
            slots=statuses[offset:end],
        )


class SlotKeyList(KeyList):
    """The slot keys in use (:meth:`Slots.slot_keys_in_use`), listed again at most every ``ttl``
    seconds (see :class:`~.keylist.KeyList`); the statuses of listed keys are read fresh on every
    call (:meth:`Slots.slot_board`)."""

    def __init__(self, slots: Slots, *, ttl: float = KEY_LIST_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(slots.slot_keys_in_use, ttl=ttl, clock=clock)


def _glob_escaped(text: str) -> str:
    """``text`` matched literally by a SCAN pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _status(key: str, raw_limit: object, running: object, waiting: object) -> SlotStatus:
    """A key's status from its three replies; garbage (another type, a limit not a number) reads
    as no limit and none running or waiting, as the slot scripts treat it.

    Raises:
        RedisError: a reply that is no plain error of the key's value (a refused permission, a
            lost connection): an ACL that hides the limit must not read as "no limit".
    """
    for reply in (raw_limit, running, waiting):
        if isinstance(reply, Exception) and type(reply) is not ResponseError:
            raise reply
    text = raw_limit.decode("ascii", "replace") if isinstance(raw_limit, bytes) else ""
    limit = int(text) if text.isdigit() and 1 <= int(text) <= MAX_SLOT_LIMIT else None
    return SlotStatus(key, limit, _count(running), _count(waiting))


def _count(reply: object) -> int:
    """A count read back; a key of another type (an error reply) reads as empty."""
    return reply if isinstance(reply, int) else 0
