"""Concurrency slots in the store: taken by forwarders at release, reported started, beating,
ended and throttled by workers (see :mod:`delayq_backends.slots`); a slot key is a group, whose
policy (:mod:`.groups`) the take applies.

A slot key's keys share one hash tag of their own (:func:`~delayq_backends.keys.slot_holds_key`),
so each call touches one cluster slot and different keys spread over the nodes. Only forwarders
write the holds: a worker writes reports (HSET, with a random field of its own), which the next
take checks against the token its hold was granted with (``slot_take.lua``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from redis.exceptions import RedisError

from ..keys import (
    GROUP_KEYS,
    SLOT_KEYS,
    group_wake_channel,
    slot_holds_key,
    slot_reports_key,
    slot_tokens_key,
    slot_waiting_key,
)
from ..models import SlotGrant
from ..scripts.library import ScriptCall
from ..scripts.store import Promote, SlotEnd, SlotTake
from .base import StoreCore

__all__ = [
    "HOLD_MODES",
    "KEY_LIST_TTL",
    "MAX_HOLD_MS",
    "RUN_HOLD_MS",
    "START_HOLD_MS",
    "STATUS_CHUNK",
    "WAIT_MS",
    "SlotAsk",
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
HOLD_MODES = ("start", "beat", "end", "throttle")
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
    """The items of one slot key (a group) asking for a slot: their limit (0: none), (member,
    order) of each, in their order, their rate and weight (None: none), and each one's cost
    against the group's rate (empty: 1 each)."""

    limit: int
    asking: Sequence[tuple[str, int]]
    rate: str | None = None
    weight: float | None = None
    costs: Sequence[int] = ()
    #: mode "take": each item's token (empty: a fresh one each), so an item of several groups
    #: holds each with the one token its message carries
    tokens: Sequence[str] = ()


class Slots(StoreCore):
    """Slot keys: forwarders take (:meth:`take_slots`, as the group's policy allows), workers
    hold, give back and throttle (:meth:`hold_slots`); operators set limits and policies and
    look through :class:`~.groups.Groups`."""

    def slot_keys(self, key: str) -> tuple[str, str, str, str, str, str]:
        """The holds, waiting, waits, limit, tokens and reports keys of slot ``key``, in
        ``slot_take.lua``'s order."""
        holds, waiting, waits, limit, tokens, reports = (f(self.config.prefix, key) for f in SLOT_KEYS)
        return holds, waiting, waits, limit, tokens, reports

    def group_keys(self, key: str) -> tuple[str, ...]:
        """Group ``key``'s keys in ``slot_take.lua``'s order: its slot keys, policy and bucket."""
        return tuple(f(self.config.prefix, key) for f in GROUP_KEYS)

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
        forward (:meth:`_bring_forward`): ends read here reach the head of the line within a pass.

        The group's runtime policy wins over the items' limit, rate and weight, and these over
        the store's policies by pattern (``config.group_policies``); a paused or throttled
        group, or one over its rate, grants nothing (``SlotGrant.reasons`` says why)."""
        at = self.script_now(now)
        calls, tokens_of = self.slot_take_calls(asks, hold_ms=hold_ms, wait_ms=wait_ms, now=at, mode=mode)
        replies = self.run_each(calls)
        return self.slots_granted(asks, replies, tokens_of, at)

    def slot_take_calls(
        self, asks: Mapping[str, SlotAsk], *, hold_ms: int, wait_ms: int, now: int, mode: str
    ) -> tuple[list[ScriptCall[SlotGrant]], dict[str, tuple[str, ...]]]:
        """The ``slot_take.lua`` calls of :meth:`take_slots` (one per key of ``asks``, in their
        order; ``now`` as :meth:`script_now` gives it), and each key's tokens."""
        calls, tokens_of = [], {}
        for key, a in asks.items():
            if mode != "take":
                tokens: tuple[str, ...] = ("",) * len(a.asking)
            elif a.tokens:  # an item of several groups: one token for all its holds
                tokens = tuple(a.tokens)
            else:
                tokens = tuple(secrets.token_hex(16) for _ in a.asking)
            tokens_of[key] = tokens
            costs = a.costs or (1,) * len(a.asking)
            if len(costs) != len(a.asking):
                raise ValueError(f"group {key!r}: {len(costs)} costs for {len(a.asking)} items: give one each")
            asking = [(m, order, t, c) for (m, order), t, c in zip(a.asking, tokens, costs)]
            pattern = self.config.group_policies.of(key)
            calls.append(
                SlotTake.call(
                    self.group_keys(key),
                    asking,
                    limit=a.limit or pattern.limit or 0,
                    rate=a.rate or pattern.rate,
                    weight=a.weight if a.weight is not None else pattern.weight,
                    hold_ms=hold_ms,
                    wait_ms=wait_ms,
                    cap_ms=MAX_HOLD_MS,
                    now=now,
                    mode=mode,
                )
            )
        return calls, tokens_of

    def slots_granted(
        self,
        asks: Mapping[str, SlotAsk],
        replies: Sequence[SlotGrant | Exception],
        tokens_of: Mapping[str, tuple[str, ...]],
        at: int,
    ) -> dict[str, SlotGrant | Exception]:
        """The grants of :meth:`slot_take_calls`' ``replies`` (each with its tokens), once the
        items the free slots wait for are brought forward."""
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
        wake channel, so a forwarder takes the free slot within a pass; "throttle" stops the key
        (a group) releasing for ``hold_ms`` (same cap) at every forwarder, from the next take on.
        Per key, None or the error its report met.

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
            if mode == "end":
                self._wake_lines(pipe, keys)
            replies = pipe.execute(raise_on_error=False)
        answers = {key: reply if isinstance(reply, Exception) else None for key, reply in zip(keys, replies)}
        if mode == "end":
            self._bring_heads_forward({key: len(holds[key]) for key in keys if answers[key] is None})
        return answers

    def _lines_due(self, pipe: Any, groups: Sequence[str], now: int) -> None:
        """Queue on ``pipe`` the writes that make ``groups``' lines due ``now`` in every shard
        (``gready``, ZADD XX LT: a shard where a group has no line stays without one)."""
        for k in self._keys:
            pipe.zadd(k.gready, dict.fromkeys(groups, now), xx=True, lt=True)

    def _wake_lines(self, pipe: Any, groups: Sequence[str]) -> None:
        """A slot of each of ``groups`` was given back: their lines are due now (so the next pass
        releases from them, a burst run of the testing store's included) and named on the groups'
        wake channel, for forwarders asleep."""
        self._lines_due(pipe, groups, self.clock())
        for group in groups:
            pipe.publish(group_wake_channel(self.config.prefix), group)

    def _report(self, mode: str, token: str, hold_ms: int) -> str:
        """A worker's report on its hold (``slot_take.lua`` reads it): an end shows the token
        (the task is over), a start, beat or throttle only its SHA-1 (:meth:`slot_token_proof`),
        so a report read by another credential cannot end a running task's hold."""
        if mode == "end":
            return f"end:{token}"
        return f"{mode}:{self.slot_token_proof(token) if token else ''}:{hold_ms}"

    def slot_token_proof(self, token: str) -> str:
        """What a hold's token is kept as (its SHA-1, as ``slot_take.lua`` writes it) and what a
        start or beat shows."""
        return hashlib.sha1(token.encode()).hexdigest()

    def give_back_slots(self, holds: Mapping[str, Sequence[str]]) -> dict[str, int | Exception]:
        """A forwarder gives back the holds of ``members`` per slot key (their items were not
        published, or a periodic run not moved), in one round trip that also names each key
        whose hold ended on the groups' wake channel (a forwarder hands the slot to the key's line
        then, :meth:`~.glines.GroupLines.hand_over`), and brings forward the heads of the keys'
        slot lines: per key, how many were held (-1: its holds key is garbage)."""
        prefix, wake = self.config.prefix, group_wake_channel(self.config.prefix)
        calls = [
            SlotEnd.call(
                (slot_holds_key(prefix, key), slot_tokens_key(prefix, key), slot_waiting_key(prefix, key)),
                members,
                wake=wake,
                group=key,
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


def _glob_escaped(text: str) -> str:
    """``text`` matched literally by a SCAN pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
