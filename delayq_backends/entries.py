"""JSON-ready views of the store's objects: one shape for ``delayq … --json`` and the HTTP API,
so a script written against one reads the other."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .envelope import Envelope
from .errors import EnvelopeError
from .models import DeadLetter, ScheduledItem, ShardStats
from .timeutil import from_ms

__all__ = ["dead_entry", "iso", "item_entry", "stats_entry"]


def iso(ms: Optional[int]) -> Optional[str]:
    """UTC ISO-8601 to the millisecond, the one time format of every command's output."""
    return None if ms is None else from_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _time(ms: Optional[int], what: str, problems: List[str]) -> Optional[str]:
    """``iso(ms)``, or None with the reason added to ``problems`` when a score written around
    delayq (``1e300``) is no date: one odd value is shown, never fatal to a listing."""
    try:
        return iso(ms)
    except (ValueError, OverflowError) as exc:
        problems.append(f"{what} {ms} ms is not a time ({exc})")
        return None


def stats_entry(label: Any, group: Sequence[ShardStats], problems: Optional[List[str]] = None) -> dict[str, Any]:
    """One shard's numbers, or the totals of several: the same keys either way. ``next_due`` is
    null when the head's score is not a time; the reason goes to ``problems`` if given."""
    heads = [s.next_ready_ms for s in group if s.next_ready_ms is not None]
    return {
        "shard": label,
        "scheduled": sum(s.scheduled for s in group),
        "due": sum(s.due for s in group),
        "leased": sum(s.leased for s in group),
        "dead": sum(s.dead for s in group),
        "next_due": _time(min(heads), "the next due score", [] if problems is None else problems) if heads else None,
        "oldest_overdue_ms": max((s.oldest_overdue_ms for s in group), default=0),
    }


def item_entry(item: ScheduledItem) -> dict[str, Any]:
    """A scheduled item as JSON-ready values; an undecodable envelope or a time that is no date
    is shown in ``corrupt``, not fatal."""
    problems: List[str] = []
    entry: dict[str, Any] = {
        "id": item.id,
        "shard": item.shard,
        "ready": _time(item.ready_ms, "ready", problems),
        "attempts": item.attempts,
        "leased_until": _time(item.leased_until_ms, "lease deadline", problems),
        "rank": item.rank,
        "target": None,
        "destination": None,
        "corrupt": None,
        "size": len(item.envelope),
    }
    try:
        envelope = Envelope.decode(item.envelope)
    except EnvelopeError as exc:
        problems.append(str(exc))
    else:
        entry.update(target=envelope.target, destination=envelope.destination)
    entry["corrupt"] = "; ".join(problems) or None
    return entry


def dead_entry(dead: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON-ready values; a time that is no date is null, its reason added to ``error``."""
    problems: List[str] = []
    died_at = _time(dead.died_ms, "died at", problems)
    ready = _time(dead.ready_ms, "ready", problems)
    return {
        "id": dead.id,
        "shard": dead.shard,
        "died_at": died_at,
        "attempts": dead.attempts,
        "error": "; ".join([dead.error, *problems]) if problems else dead.error,
        "ready": ready,
    }
