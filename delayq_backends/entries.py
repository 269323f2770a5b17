"""JSON-ready views of the store's objects: one shape for ``delayq … --json`` and the HTTP API,
so a script written against one reads the other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from .envelope import Envelope
from .errors import EnvelopeError, NewerFormatError
from .keys import collapsed_key
from .kinds import view
from .models import DeadLetter, GroupStatus, ScheduledItem, ShardStats, Why
from .store import DelayStore
from .store.groupboard import GroupBoard, held, throttled
from .timeutil import from_ms

__all__ = [
    "around_bad_shards",
    "collapsed_entry",
    "dead_entry",
    "describe_collapsed",
    "group_board_entry",
    "group_entry",
    "iso",
    "item_entry",
    "listed_at",
    "stats_entry",
    "why_entry",
]

Row = TypeVar("Row")


def iso(ms: int | None) -> str | None:
    """UTC ISO-8601 to the millisecond, the one time format of every command's output."""
    return None if ms is None else from_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stats_entry(label: Any, group: Sequence[ShardStats]) -> dict[str, Any]:
    """One shard's numbers, or the totals of several: the same keys either way."""
    heads = [s.next_ready_ms for s in group if s.next_ready_ms is not None]
    return {
        "shard": label,
        "scheduled": sum(s.scheduled for s in group),
        "due": sum(s.due for s in group),
        "leased": sum(s.leased for s in group),
        "dead": sum(s.dead for s in group),
        "parked": sum(s.parked for s in group),
        "next_due": iso(min(heads)) if heads else None,
        "oldest_overdue_ms": max((s.oldest_overdue_ms for s in group), default=0),
    }


def item_entry(item: ScheduledItem) -> dict[str, Any]:
    """A scheduled item as JSON-ready values; an undecodable envelope is shown, not fatal."""
    entry: dict[str, Any] = {
        "id": item.id,
        "shard": item.shard,
        "ready": iso(item.ready_ms),
        "attempts": item.attempts,
        "leased_until": iso(item.leased_until_ms),
        "awaiting_start": item.awaiting_start,
        "parked": item.parked,
        "rank": item.rank,
        "target": None,
        "destination": None,
        "corrupt": None,
        "newer_format": None,
        "size": len(item.envelope),
        "task": None,
        "collapsed": collapsed_entry(item),
    }
    try:
        envelope = Envelope.decode(item.envelope)
    except NewerFormatError as exc:  # a newer release's item: fine, only not readable here
        entry["newer_format"] = exc.version
    except EnvelopeError as exc:
        entry["corrupt"] = str(exc)
    else:
        entry.update(target=envelope.target, destination=envelope.destination, task=view(envelope))
    return entry


def collapsed_entry(item: ScheduledItem) -> dict[str, Any] | None:
    """A debounced or throttled item's mode, key and collapsed calls (for the listings), else None."""
    found = collapsed_key(item.id)
    if found is None:
        return None
    mode, key = found
    return {"mode": mode, "key": key, "calls": item.calls}


def describe_collapsed(collapsed: dict[str, Any] | None) -> str:
    """``"debounced: 12 calls, key user-42"`` ("" for other items): how the listings show it."""
    if not collapsed:
        return ""
    calls = collapsed["calls"]
    return f"{collapsed['mode']}d: {calls} call{'s' if calls != 1 else ''}, key {collapsed['key']}"


def group_entry(status: GroupStatus, now_ms: int) -> dict[str, Any]:
    """A group's policy and counts (``delayq groups … --json``, the API's groups): ``held`` says
    why it releases nothing now ("paused", "throttled") or is null; a throttle that has run out
    shows as none (the store may still hold its time until the next take folds it)."""
    policy = status.policy
    by_worker = throttled(status, now_ms)
    return {
        "key": status.key,
        "limit": policy.limit,
        "rate": policy.rate,
        "weight": policy.weight,
        "paused_by": policy.paused or None,
        "throttled_until": iso(policy.throttled_until) if by_worker else None,
        "throttled_by": policy.throttled_by if by_worker else None,
        "held": held(status, now_ms),
        "running": status.running,
        "parked": status.parked,
    }


def group_board_entry(board: GroupBoard) -> dict[str, Any]:
    """A page of groups (:func:`group_entry` each) with the counts over every group."""
    return {
        "groups": board.groups,
        "running": board.running,
        "parked": board.parked,
        "paused": board.paused,
        "throttled": board.throttled,
        "page": [group_entry(s, board.now_ms) for s in board.page],
    }


def dead_entry(dead: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON-ready values."""
    return {
        "id": dead.id,
        "shard": dead.shard,
        "died_at": iso(dead.died_ms),
        "attempts": dead.attempts,
        "error": dead.error,
        "ready": iso(dead.ready_ms),
    }


def around_bad_shards(
    store: DelayStore,
    shard: int | None,
    offset: int,
    limit: int,
    read: Callable[[int | None, int], list[Row]],
    order: Callable[[Row], int],
) -> tuple[list[Row], list[str]]:
    """One page of a listing merged over the shards; when a shard's key holds another type
    (WRONGTYPE), the page is merged from the shards that can be read and the others are named,
    so one bad key does not hide every other shard's entries."""
    try:
        return read(shard, offset + limit)[offset:], []
    except redis.ResponseError:
        if shard is not None:
            raise
    rows: list[Row] = []
    problems = []
    for s in range(store.shards):
        try:
            rows.extend(read(s, offset + limit))
        except redis.ResponseError as exc:
            problems.append(f"shard {s} cannot be read: {exc}")
    return sorted(rows, key=order)[offset : offset + limit], problems


def listed_at(item: ScheduledItem) -> int:
    """An item's place in the listing: its score, the lease deadline while leased."""
    return item.ready_ms if item.leased_until_ms is None else item.leased_until_ms


def why_entry(why: Why) -> dict[str, Any]:
    """Why an item is where it is (``Reader.why``) as JSON-ready values: times as ISO-8601."""
    return {
        "id": why.id,
        "state": why.state,
        "line": why.line,
        "until": iso(why.until_ms),
        "since": iso(why.since_ms),
        "ready": iso(why.ready_ms),
        "attempts": why.attempts,
        "group": why.group,
        "running": why.running,
        "running_ids": list(why.running_ids),
        "limit": why.limit,
        "ahead": why.ahead,
        "queue": why.queue,
        "forwarder": why.forwarder,
        "reason": why.reason,
    }
