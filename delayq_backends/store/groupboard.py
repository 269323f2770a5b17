"""Many groups at once, as operators look at them: ``delayq groups list``, the API's and the
dashboard's Groups panel, the exporter's per-group gauges and ``delayq stats``'s busiest groups.

Apart from :mod:`.groups` (a group's policy and status, read per key), which the board lists,
orders busiest first and counts. A group is user data (one per tenant, maybe 100,000 of them),
so every view names a page or the top N and sums the rest: the board holds both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..models import GroupStatus
from .groups import Groups
from .keylist import KeyList

__all__ = ["GROUP_KEYS_TTL", "GroupBoard", "GroupKeyList", "busiest_first", "group_board", "held", "throttled"]

#: Seconds a :class:`GroupKeyList` keeps its list of groups before it SCANs again: the dashboard
#: refreshes every 2 s and a scrape comes every 15 s, and neither may walk the keyspace each time.
GROUP_KEYS_TTL = 10.0


def busiest_first(statuses: Sequence[GroupStatus]) -> list[GroupStatus]:
    """``statuses`` busiest first: items running plus parked in the group's lines, then by key
    (a stable order for pages and for the gauges' named groups)."""
    return sorted(statuses, key=lambda s: (-(s.running + s.parked), s.key))


def throttled(status: GroupStatus, now_ms: int) -> bool:
    """Whether a worker's throttle holds the group at ``now_ms`` (one that ran out is none,
    though the store keeps its time until the next take folds it)."""
    until = status.policy.throttled_until
    return until is not None and until > now_ms


def held(status: GroupStatus, now_ms: int) -> str | None:
    """Why the group releases nothing whatever its room: "paused" (by an operator; a pause
    outlasts any throttle) or "throttled" (by a worker, until ``policy.throttled_until``); None
    when it releases."""
    if status.policy.paused:
        return "paused"
    return "throttled" if throttled(status, now_ms) else None


@dataclass(frozen=True)
class GroupBoard:
    """Groups busiest first: a page of them, and the counts over every group listed.

    Attributes:
        groups: the groups in use (holds, a line, a policy), on the page or not.
        running: items holding a place in a group's limit, summed over every group.
        parked: items waiting in the groups' lines, summed over every group.
        paused, throttled: the groups paused by an operator, and throttled by a worker now.
        page: the statuses asked for (from ``offset``, at most ``limit``), busiest first.
        now_ms: the store's clock when read (what ``throttled`` counts against).
    """

    groups: int
    running: int
    parked: int
    paused: int
    throttled: int
    page: list[GroupStatus]
    now_ms: int


def group_board(store: Groups, keys: Sequence[str], *, offset: int = 0, limit: int | None = None) -> GroupBoard:
    """The statuses of ``keys`` busiest first, ``limit`` of them from ``offset`` on, with the
    counts over all of them (read-only: :meth:`Groups.group_statuses`, pipelined rounds).

    Every group's counts are read for the order anyway, so a deep page costs no more than the first.
    """
    statuses = busiest_first(store.group_statuses(keys))
    now = store.clock()
    end = None if limit is None else offset + limit
    return GroupBoard(
        groups=len(statuses),
        running=sum(s.running for s in statuses),
        parked=sum(s.parked for s in statuses),
        paused=sum(1 for s in statuses if s.policy.paused),
        throttled=sum(1 for s in statuses if throttled(s, now)),
        page=statuses[offset:end],
        now_ms=now,
    )


class GroupKeyList(KeyList):
    """The groups in use (:meth:`Groups.groups_in_use`, a SCAN), listed again at most every
    ``ttl`` seconds (see :class:`~.keylist.KeyList`); their statuses are read fresh on every call."""

    def __init__(self, store: Groups, *, ttl: float = GROUP_KEYS_TTL):
        super().__init__(store.groups_in_use, ttl=ttl)
