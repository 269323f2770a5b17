"""Why an item is where it is: the reads and the one-line answer of ``Reader.why``.

An item's state is spread over its shard's keys (its ``due`` score, its ``leased`` entry: a
lease, a deferral, a lossless publish; its parking reason) and, for an item of a group, over
the group's keys (its holds, limit and line). :func:`item_state` tells the states apart from the
shard's values alone; an item held back by a group (deferred or parked while its group cannot
take it) needs its groups' keys too, read by :func:`read_groups` in one more round trip, and
:func:`group_state` names the first thing that holds it: paused, throttled, at its limit, over
its rate, or behind other items of its line. Reads only: the ``reader`` ACL role answers it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from ..envelope import Envelope, Group, groups_of
from ..errors import EnvelopeError
from ..group_policies import RATE_BURST_MS, rate_per_second
from ..keys import (
    PARKED_MS,
    claimer_of,
    group_bucket_key,
    group_policy_key,
    slot_holds_key,
    slot_limit_key,
    slot_waiting_key,
)
from ..models import Why
from ..timeutil import MAX_MS, from_ms, score_ms
from .base import StoreCore
from .groups import POLICY_FIELDS
from .groups import _policy as policy_of
from .slots import slot_item_ids

__all__ = [
    "BUCKET_FIELDS",
    "MAX_DEBT_MS",
    "RUNNING_IDS",
    "GroupView",
    "ItemRead",
    "group_state",
    "groups_of_item",
    "held_by",
    "item_state",
    "rate_until",
    "read_groups",
]

#: How many of the ids holding a group's slots an answer names ("2 of 2 running: a, b").
RUNNING_IDS = 5
#: A rate bucket's fields, as ``includes/policy.lua`` writes them.
BUCKET_FIELDS = ("tokens", "at")
#: The deepest debt of a rate bucket, in ms of its rate (MAX_DEBT_MS in ``includes/policy.lua``).
MAX_DEBT_MS = 3_600_000
#: Replies per group of :func:`read_groups`' first round trip.
_READS = 6

T = TypeVar("T")

#: The parking reason of an item waiting in its group's line (``group:<key>``).
GROUP_REASON = "group"
#: A "due" answer's reason when the item's lease ran out (its forwarder stopped, or is stuck).
LEASE_RAN_OUT = "lease ran out"


@dataclass(frozen=True)
class ItemRead:
    """What the item's shard holds about it, as read (raw values; None: absent)."""

    id: str
    score: float | None
    envelope: bytes | None
    lease: bytes | None
    parked_why: Any
    recheck: float | None
    died: float | None
    dead_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupView:
    """One group as it stands: what may hold an item of it back.

    Attributes:
        key: the group's key.
        limit: the limit as applied (runtime over the item's own; None: none).
        running: holds not lapsed; running_ids the first of their item ids.
        ahead: items before this one in the group's line (None: it is not in the line).
        paused_by: who paused it (None: not paused).
        throttled_until, throttled_by: a throttle in force, and who set it.
        rate_until: when the group's rate lets its next item go (None: not over its rate).
    """

    key: str
    limit: int | None
    running: int
    running_ids: tuple[str, ...] = ()
    ahead: int | None = None
    paused_by: str | None = None
    throttled_until: int | None = None
    throttled_by: str | None = None
    rate_until: int | None = None


def item_state(read: ItemRead, now: int) -> Why:
    """The item's state from its shard's values alone. For an item that carries groups, a "due",
    "flow" or ``group:`` "parked" answer may be its groups' doing: :func:`held_by` says which
    groups to read, :func:`group_state` what they hold."""
    if read.score is None or read.envelope is None:
        return _gone(read)
    score = score_ms(read.score)
    fields = read.lease.split(b":") if read.lease else []
    ready = score_ms(fields[-1]) if len(fields) in (2, 3) and fields[-1].lstrip(b"-").isdigit() else score
    if score == PARKED_MS:
        return _parked(read, ready)
    found = Why(read.id, "due", "", ready_ms=ready, queue=_queue(read.envelope))
    if len(fields) == 3 and fields[0].isdigit():
        until, kind = score_ms(fields[0]), fields[1].decode("ascii", "replace")
        if kind == "published":
            return _say(replace(found, state="awaiting_start", until_ms=until))
        if kind == "deferred" and until > now:
            return _say(replace(found, state="flow", until_ms=until))
        if kind != "deferred" and until > now:
            return _say(replace(found, state="leased", until_ms=until, forwarder=claimer_of(kind)))
        if kind != "deferred":
            return _say(replace(found, until_ms=until, reason=LEASE_RAN_OUT))
    if score > now:
        return _say(replace(found, state="scheduled", until_ms=None if score >= MAX_MS - 1000 else score))
    return _say(found)


def held_by(found: Why, envelope: bytes | None) -> tuple[Group, ...]:
    """The groups that may be what holds the item ``found`` describes: those it carries when it
    is due (a claim would meet them), deferred (flow control or, before group lines, its
    group's refusal) or parked in its group's line; none otherwise."""
    in_line = found.reason is None or _in_line(found.reason)  # a producer's born-parked item records none
    grouped = found.state in ("due", "flow") or (found.state == "parked" and in_line)
    return groups_of_item(envelope) if grouped and envelope else ()


def group_state(found: Why, views: Sequence[GroupView], now: int) -> Why:
    """What the item's groups (``views``, its line group first) do to ``found``: the first of
    them paused, throttled, at its limit or over its rate holds it; else it waits in its line
    group's line when it is in it (parked there, or deferred in it), or is ``found`` as it was.
    ``until_ms`` stays when a forwarder looks at it again unless a group's own time says more."""
    for view in views:
        held = replace(found, group=view.key, running=view.running, running_ids=view.running_ids, limit=view.limit)
        if view.paused_by is not None:
            return _say(replace(held, state="group_paused", until_ms=None, reason=view.paused_by))
        if view.throttled_until is not None and view.throttled_until > now:
            throttled = replace(held, state="group_throttled", until_ms=view.throttled_until)
            return _say(replace(throttled, reason=view.throttled_by))
        if view.limit is not None and view.running >= view.limit:
            return _say(replace(held, state="group_limit", ahead=views[0].ahead, reason=None))
        if view.rate_until is not None and view.rate_until > now:
            return _say(replace(held, state="group_rate", until_ms=view.rate_until, reason=None))
    kind, _, named = (found.reason or "").partition(":")
    line = next((v for v in views if kind == GROUP_REASON and v.key == named), views[0])
    if found.state == "parked" or (found.state == "flow" and line.ahead is not None):
        in_line = replace(found, state="group_line", group=line.key, running=line.running, limit=line.limit)
        return _say(replace(in_line, ahead=line.ahead, reason=None))
    return found


def groups_of_item(envelope: bytes) -> tuple[Group, ...]:
    """The groups an envelope carries, its line group first (aliases folded in: ``groups_of``);
    none when it carries none or cannot be read here."""
    try:
        return groups_of(Envelope.decode(envelope))
    except EnvelopeError:
        return ()


def read_groups(store: StoreCore, item_id: str, groups: Sequence[Group], now: int) -> list[GroupView]:
    """Each of ``groups`` as it stands for ``item_id`` (reads only), its values as the group
    scripts apply them: the runtime policy over the item's own over the patterns'
    (``Config.group_policies``, as this process has them). One round trip, and one more for its
    place when it is in a group's line. A group key of another type (a hand write) reads as
    empty, as the group scripts treat it."""
    prefix = store.config.prefix
    with store.pipeline() as pipe:
        for key in (g.key for g in groups):
            holds = slot_holds_key(prefix, key)
            pipe.hmget(group_policy_key(prefix, key), POLICY_FIELDS)
            pipe.get(slot_limit_key(prefix, key))
            pipe.zcount(holds, f"({now}", "+inf")
            pipe.zrangebyscore(holds, f"({now}", "+inf", start=0, num=RUNNING_IDS)
            pipe.hmget(group_bucket_key(prefix, key), BUCKET_FIELDS)
            pipe.zscore(slot_waiting_key(prefix, key), item_id)
        line = groups[0].key if groups else ""
        pipe.zscore(store.keys(store.shard_of(item_id)).gline(line), item_id)  # its line group's shard line
        *replies, order = _plain(pipe.execute(raise_on_error=False))
    rows = [replies[n : n + _READS] for n in range(0, len(replies), _READS)]
    places = {g.key: row[-1] for g, row in zip(groups, rows) if row[-1] is not None}
    with store.pipeline() as pipe:
        for key, place in places.items():
            pipe.zcount(slot_waiting_key(prefix, key), "-inf", f"({place}")
        if order is not None:  # in its group's lines: the items before it, every shard's
            for shard in range(store.shards):
                pipe.zcount(store.keys(shard).gline(line), "-inf", f"({int(order)}")
        counts = _plain(pipe.execute(raise_on_error=False)) if places or order is not None else []
    ahead = dict(zip(places, counts))
    if order is not None:
        ahead[line] = sum(c for c in counts[len(places) :] if isinstance(c, int))
    views = []
    for group, (fields, alias, running, holders, bucket, _) in zip(groups, rows):
        runtime = policy_of(fields, alias, now)
        pattern = store.config.group_policies.of(group.key)
        rate = _first(runtime.rate, group.rate, pattern.rate)
        views.append(
            GroupView(
                group.key,
                _first(runtime.limit, group.limit, pattern.limit),
                running if isinstance(running, int) else 0,
                tuple(slot_item_ids(_text(m))[-1] for m in holders or ()),
                ahead.get(group.key),
                runtime.paused,
                runtime.throttled_until,
                runtime.throttled_by,
                None if rate is None else rate_until(bucket, rate, group.cost, now),
            )
        )
    return views


def rate_until(bucket: Any, rate: str, cost: int, now: int) -> int | None:
    """When a group's rate bucket (its HMGET ``tokens``, ``at``) holds ``cost`` tokens again, None
    when it does now: the read side of ``includes/policy.lua``'s bucket, which holds
    :data:`~delayq_backends.group_policies.RATE_BURST_MS` worth (at least one token), refills at the
    rate, and starts full when absent or garbage."""
    per_ms = rate_per_second(rate) / 1000
    burst = max(1, math.ceil(per_ms * RATE_BURST_MS))
    tokens, at = (_number(v) for v in (bucket if isinstance(bucket, list) else (None, None)))
    if tokens is None or at is None or not -per_ms * MAX_DEBT_MS <= tokens <= burst or at > now:
        tokens, at = burst, now
    held = min(burst, tokens + (now - at) * per_ms)
    need = min(cost, burst)
    return None if held >= need else now + math.ceil((need - held) / per_ms)


def _first(*values: T | None) -> T | None:
    """The first value set: the runtime policy's, the item's, the patterns'."""
    return next((v for v in values if v is not None), None)


def _number(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _plain(replies: list[Any]) -> list[Any]:
    """Replies of a group's keys: a key of another type (an error reply) reads as absent; any
    other error (a refused permission, a lost connection) is raised, never read as "none"."""
    for reply in replies:
        if isinstance(reply, Exception) and type(reply) is not ResponseError:
            raise reply
    return [None if isinstance(r, Exception) else r for r in replies]


def _text(member: Any) -> str:
    return member.decode("utf-8", "backslashreplace") if isinstance(member, bytes) else str(member)


def _queue(envelope: bytes | None) -> str | None:
    try:
        return Envelope.decode(envelope).destination if envelope else None
    except EnvelopeError:
        return None


def _gone(read: ItemRead) -> Why:
    """A dead letter, or an id the store does not hold."""
    if read.died is None:
        return _say(Why(read.id, "unknown", ""))
    info = read.dead_info
    ready = info.get("ready_ms")
    return _say(
        Why(
            read.id,
            "dead",
            "",
            since_ms=score_ms(read.died),
            ready_ms=score_ms(ready) if isinstance(ready, (int, float)) else None,
            attempts=_attempts(info.get("attempts")),
            reason=str(info.get("error") or "no reason recorded"),
        )
    )


def _attempts(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else None


def _in_line(reason: str | None) -> bool:
    """Whether a parking reason is a group's line (``group:<key>``)."""
    return (reason or "").partition(":")[0] == GROUP_REASON


def _parked(read: ItemRead, ready: int) -> Why:
    """A parked item's state, and why (a ``group:`` reason: :func:`group_state` says more)."""
    why = read.parked_why.decode("utf-8", "backslashreplace") if isinstance(read.parked_why, bytes) else None
    until = score_ms(read.recheck) if read.recheck is not None else None
    return _say(Why(read.id, "parked", "", until_ms=until, ready_ms=ready, reason=why))


def _say(why: Why) -> Why:
    """``why`` with its one-line answer."""
    return replace(why, line=_LINES[why.state](why))


def at(ms: int | None) -> str:
    """A time in an answer: UTC ISO-8601 to the millisecond (as every listing prints it)."""
    if ms is None:
        return "an unknown time"
    return from_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _group_limit(w: Why) -> str:
    ids = ", ".join(w.running_ids)
    more = ", ..." if w.running and w.running > len(w.running_ids) else ""
    behind = f"; {w.ahead} ahead of it in its line" if w.ahead else ""
    return f"waiting for group {w.group} ({w.running} of {w.limit} running: {ids}{more}){behind}"


def _parked_line(w: Why) -> str:
    if w.reason is None:
        return f"parked, no reason recorded; looked at again at {at(w.until_ms)}"
    kind, _, value = w.reason.partition(":")
    what = {
        "format": f"its envelope format {value} is newer than the forwarders that claimed it read (upgrade them)",
        "target": f"the forwarders that claimed it have no {value!r} target (start one that has)",
    }.get(kind, f"for {w.reason!r}")
    return f"parked: {what}; looked at again at {at(w.until_ms)}"


def _due(w: Why) -> str:
    if w.reason == LEASE_RAN_OUT:
        return f"due: its lease ran out at {at(w.until_ms)} (its forwarder stopped?); the next claim takes it"
    return f"due since {at(w.ready_ms)}: the next claim takes it"


def _group_line(w: Why) -> str:
    if w.ahead:
        return f"behind {w.ahead} items of group {w.group}"
    if w.until_ms is None:
        return f"waiting in group {w.group}'s line: the group has room, a forwarder's pass releases it"
    return f"next in group {w.group}'s line: released at {at(w.until_ms)} or when a slot frees"


_LINES = {
    "unknown": lambda w: (
        f"unknown id {w.id!r}: not scheduled and no dead letter (forwarded, cancelled, purged, or never scheduled)"
    ),
    "dead": lambda w: (
        f"dead since {at(w.since_ms)}: {w.reason}" + (f" ({w.attempts} attempts)" if w.attempts is not None else "")
    ),
    "scheduled": lambda w: (
        "never due: a paused or finished periodic entry" if w.until_ms is None else f"not due until {at(w.until_ms)}"
    ),
    "due": _due,
    "leased": lambda w: (
        f"leased by forwarder {w.forwarder or '(unnamed: an earlier release)'} until {at(w.until_ms)} (being published)"
    ),
    "awaiting_start": lambda w: f"published, awaiting its worker's start until {at(w.until_ms)} (then published again)",
    "flow": lambda w: (
        f"held by flow control on queue {w.queue} until {at(w.until_ms)} (deferred by flow: "
        "a full broker queue or a rate cap)"
    ),
    "group_paused": lambda w: f"group {w.group} paused (by {w.reason})",
    "group_throttled": lambda w: (
        f"group {w.group} throttled until {at(w.until_ms)}" + (f" (by {w.reason})" if w.reason else "")
    ),
    "group_limit": _group_limit,
    "group_rate": lambda w: f"over group {w.group}'s rate until {at(w.until_ms)}",
    "group_line": _group_line,
    "parked": _parked_line,
}
