"""Concurrency slots in the store: taken by forwarders at release, reported started, beating
and ended by workers, limits set at runtime (see :mod:`delayq_backends.slots`).

A slot key's six keys share one hash tag of their own (:func:`~delayq_backends.keys.slot_holds_key`),
so each call touches one cluster slot and different keys spread over the nodes. Only forwarders
write the holds: a worker writes reports (HSET, with a random field of its own), which the next
take checks against the token its hold was granted with (``slot_take.lua``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from redis.exceptions import RedisError, ResponseError

from ..envelope import MAX_SLOT_LIMIT, Slot
from ..keys import (
    SLOT_KEYS,
    group_wake_channel,
    slot_holds_key,
    slot_limit_key,
    slot_reports_key,
    slot_tokens_key,
    slot_waiting_key,
)
from ..models import SlotBoard, SlotGrant, SlotStatus
from ..scripts.store import Promote, SlotEnd, SlotTake
from .base import StoreCore
from .keylist import KeyList

__all__ = [
    "HOLD_MODES",
    "KEY_LIST_TTL",
    "MAX_HOLD_MS",
    "RUN_HOLD_MS",
    "START_HOLD_MS",
    "STATUS_CHUNK",
    "WAIT_MS",
    "SlotAsk",
    "SlotKeyList",
    "SlotRun",
    "Slots",
    "slot_item_ids",
    "slot_member",
]

log = logging.getLogger("delayq.slots")

#: How long a slot taken at release is held before the worker reports its item started (the start
#: window, a forwarder setting): the time a message may wait in the broker. A message lost on its
#: way, or sent to a queue nobody reads, holds its slot this long; a start later than this may run
#: over the limit (docs/slots.md weighs the two).
START_HOLD_MS = 60_000
#: The most a hold lasts from now, whatever a worker reports or a setting asks (slot_take.lua
#: caps every start and beat, and drops a hold further ahead).
MAX_HOLD_MS = 3_600_000
#: How long a running item's hold lasts after its start or its worker's last beat (every third
#: of it): a worker that dies mid-task gives its slots back this long after its last beat.
RUN_HOLD_MS = 60_000
#: How long an item keeps its place in a key's line unless it asks again (it does at least
#: every few seconds while it waits): an item cancelled while it waits holds the line this long.
WAIT_MS = 15_000
#: Slot keys whose statuses one pipelined round reads (three commands each).
STATUS_CHUNK = 500
#: What a worker reports on a hold (:meth:`Slots.hold_slots`).
HOLD_MODES = ("start", "beat", "end")
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


class SlotRun(NamedTuple):
    """A hold as its worker knows it: the member, and the token its forwarder minted when it
    granted the slot (passed in the item's message; "" for a message released without one)."""

    member: str
    token: str


class SlotAsk(NamedTuple):
    """The items of one slot key asking for a slot: their limit (0: none) and (member, order)
    of each, in their order."""

    limit: int
    asking: Sequence[tuple[str, int]]


class Slots(StoreCore):
    """Slot keys: forwarders take (:meth:`take_slots`), workers hold and give back
    (:meth:`hold_slots`), operators set limits (:meth:`set_slot_limit`) and look
    (:meth:`slot_status`)."""

    def slot_keys(self, key: str) -> tuple[str, str, str, str, str, str]:
        """The holds, waiting, waits, limit, tokens and reports keys of slot ``key``, in
        ``slot_take.lua``'s order."""
        holds, waiting, waits, limit, tokens, reports = (f(self.config.prefix, key) for f in SLOT_KEYS)
        return holds, waiting, waits, limit, tokens, reports

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
        their keys' lines (granted none); "leave": they give them up.

        In mode "take" each granted hold gets a fresh token (``SlotGrant.tokens``, in the asking
        order): its worker reports the item's start, beats and end with it, and no other report
        counts. A periodic run's overlap modes take tokenless holds (any report ends them).
        The items a free slot waits for that did not ask (``SlotGrant.heads``) are brought
        forward (:meth:`_bring_forward`): ends read here reach the head of the line within a pass."""
        at = self.script_now(now)
        calls, tokens_of = [], {}
        for key, a in asks.items():
            tokens = tuple(secrets.token_hex(16) if mode == "take" else "" for _ in a.asking)
            tokens_of[key] = tokens
            asking = [(m, order, t) for (m, order), t in zip(a.asking, tokens)]
            keys = self.slot_keys(key)
            calls.append(
                SlotTake.call(
                    keys, asking, limit=a.limit, hold_ms=hold_ms, wait_ms=wait_ms, cap_ms=MAX_HOLD_MS, now=at, mode=mode
                )
            )
        replies = self.run_each(calls)
        self._bring_forward((m for r in replies if not isinstance(r, Exception) for m in r.heads), at)
        return {
            key: reply if isinstance(reply, Exception) else replace(reply, tokens=tokens_of[key])
            for key, reply in zip(asks, replies)
        }

    def hold_slots(
        self, holds: Mapping[str, Sequence[SlotRun]], mode: str, *, hold_ms: int = 0
    ) -> dict[str, Exception | None]:
        """A worker reports its runs' holds, per slot key, in one round trip: "start" and "beat"
        hold each ``hold_ms`` from now (capped at :data:`MAX_HOLD_MS`), "end" gives it back and
        brings forward the items at the head of the key's line and names the key on the groups'
        wake channel, so a forwarder takes the free slot within a pass. Per key, None or the error its report met.

        A report is one HSET of a random field: the next take checks it against the hold's
        token, so a report that is not the hold's (another worker's member, a forged one)
        changes nothing; a start whose hold had lapsed is logged there."""
        if mode not in HOLD_MODES:
            raise ValueError(f"mode={mode!r}: use one of {HOLD_MODES}")
        until = min(max(hold_ms, 0), MAX_HOLD_MS)
        keys = list(holds)
        with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                fields = [
                    (f"{run.member}\n{secrets.token_hex(6)}", self._report(mode, run.token, until))
                    for run in holds[key]
                ]
                pipe.hset(slot_reports_key(self.config.prefix, key), items=[v for pair in fields for v in pair])
            if mode == "end":  # a hint: forwarders look at these groups' lines at once
                for key in keys:
                    pipe.publish(group_wake_channel(self.config.prefix), key)
            replies = pipe.execute(raise_on_error=False)
        answers = {key: reply if isinstance(reply, Exception) else None for key, reply in zip(keys, replies)}
        if mode == "end":
            self._bring_heads_forward({key: len(holds[key]) for key in keys if answers[key] is None})
        return answers

    def _report(self, mode: str, token: str, hold_ms: int) -> str:
        """A worker's report on its hold (``slot_take.lua`` reads it): an end shows the token
        (the task is over), a start or beat only its SHA-1 (:meth:`slot_token_proof`), so a
        report read by another credential cannot end a running task's hold."""
        if mode == "end":
            return f"end:{token}"
        return f"{mode}:{self.slot_token_proof(token) if token else ''}:{hold_ms}"

    def slot_token_proof(self, token: str) -> str:
        """What a hold's token is kept as (its SHA-1, as ``slot_take.lua`` writes it) and what a
        start or beat shows."""
        return hashlib.sha1(token.encode()).hexdigest()

    def give_back_slots(self, holds: Mapping[str, Sequence[str]]) -> dict[str, int | Exception]:
        """A forwarder gives back the holds of ``members`` per slot key (their items were not
        published, or a periodic run not moved), in one round trip, and brings forward the
        heads of the keys' lines: per key, how many were held (-1: its holds key is garbage)."""
        prefix = self.config.prefix
        calls = [
            SlotEnd.call(
                (slot_holds_key(prefix, key), slot_tokens_key(prefix, key), slot_waiting_key(prefix, key)), members
            )
            for key, members in holds.items()
        ]
        replies: list[tuple[int, tuple[str, ...]] | Exception] = self.run_each(calls)
        self._bring_forward((m for r in replies if not isinstance(r, Exception) for m in r[1]), self.script_now(None))
        return {key: r if isinstance(r, Exception) else r[0] for key, r in zip(holds, replies)}

    def _bring_heads_forward(self, freed: Mapping[str, int]) -> None:
        """Bring forward the first ``freed[key]`` items of each key's line (one read of the
        lines, then :meth:`_bring_forward`): a slot given back is taken within a pass, not at
        the next item's recheck. A failure is logged: those items ask at their recheck."""
        if not freed:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key, n in freed.items():
                    pipe.zrange(slot_waiting_key(self.config.prefix, key), 0, n - 1)
                lines = pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            log.warning("could not read a slot line to bring its head forward (%s); it asks at its recheck", exc)
            return
        heads = [
            m.decode() if isinstance(m, bytes) else str(m) for line in lines if isinstance(line, list) for m in line
        ]
        self._bring_forward(heads, self.script_now(None))

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
        except (RedisError, OSError) as exc:  # the holds are ended: only this step failed
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
        names = ("holds", "waiting", "waits", "limit", "tokens", "reports")
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
        per_key = 3 + len(self._keys)
        for start in range(0, len(keys), STATUS_CHUNK):
            chunk = keys[start : start + STATUS_CHUNK]
            with self.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    holds, waiting, _, limit_key, _, _ = self.slot_keys(key)
                    pipe.get(limit_key)
                    pipe.zcount(holds, f"({now}", "+inf")
                    pipe.zcard(waiting)
                    for k in self._keys:  # the key's group lines, where its items wait (issue 31)
                        pipe.zcard(k.gline(key))
                replies = pipe.execute(raise_on_error=False)
            for i, key in enumerate(chunk):
                limit, running, waiting, *lines = replies[per_key * i : per_key * (i + 1)]
                _raise_unless_plain(limit, running, waiting, *lines)
                # a periodic run buffered by its overlap policy is in both lines: counted once
                found.append(_status(key, limit, running, max(_count(waiting), sum(map(_count, lines)))))
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


def _raise_unless_plain(*replies: object) -> None:
    """Raise a reply that is no plain error of a key's value (a refused permission, a lost
    connection): an ACL that hides the limit must not read as "no limit".

    Raises:
        RedisError: that reply.
    """
    for reply in replies:
        if isinstance(reply, Exception) and type(reply) is not ResponseError:
            raise reply


def _status(key: str, raw_limit: object, running: object, waiting: int) -> SlotStatus:
    """A key's status from its replies (``waiting`` counted); garbage (another type, a limit not
    a number) reads as no limit and none running, as the slot scripts treat it."""
    text = raw_limit.decode("ascii", "replace") if isinstance(raw_limit, bytes) else ""
    limit = int(text) if text.isdigit() and 1 <= int(text) <= MAX_SLOT_LIMIT else None
    return SlotStatus(key, limit, _count(running), waiting)


def _count(reply: object) -> int:
    """A count read back; a key of another type (an error reply) reads as empty."""
    return reply if isinstance(reply, int) else 0
