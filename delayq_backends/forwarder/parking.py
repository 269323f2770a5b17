"""Parking: items a forwarder cannot release (an envelope format newer than it reads, a target
kind it lacks) kept out of the due index, and looked at again on a slow clock.

Deferring such items (the earlier way) kept them in the due index: 100,000 of them were claimed
and deferred again every 5 s for ever, and the other items' lateness p99 went from 11 ms to
2.5 s. Parked, they cost a claim nothing: their ``due`` score is
:data:`~delayq_backends.keys.PARKED_MS`, which no claim reaches (a previous release's neither).
Each forwarder looks at the parked items whose time has come every :data:`RECHECK_EVERY_S`,
at most :data:`RECHECK_LIMIT` per shard per look, and releases those whose reason it can now
handle (a forwarder of a newer release, or one with the missing target): they are claimed at
their next pass. A reason is recorded with each parked item, so parking by another reason (a
group's admission, issue 31) fits the same keys.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from ..envelope import READABLE_VERSIONS
from ..models import ParkedCounts
from ..outages import CONNECTION_ERRORS
from .context import Context

__all__ = [
    "FORMAT",
    "LINE_AHEAD_MS",
    "PARK_FOR_MS",
    "RECHECK_EVERY_S",
    "RECHECK_LIMIT",
    "TARGET",
    "ParkedRecheck",
    "reason",
]

log = logging.getLogger("delayq.forwarder")

#: How long a parked item waits before a forwarder looks at it again.
PARK_FOR_MS = 30_000
#: How often each forwarder looks for parked items whose time has come: a third of
#: :data:`PARK_FOR_MS`, so an item is looked at within 40 s of its parking.
RECHECK_EVERY_S = 10.0
#: Most parked items one look reads per shard: the look's cost stays bounded whatever is parked.
RECHECK_LIMIT = 1000

#: How far ahead a group line's next look (``gready``) may lie before the re-check brings it to now.
LINE_AHEAD_MS = 60_000

#: Reasons: an envelope format this forwarder does not read; a target kind it has none of.
FORMAT, TARGET = "format", "target"


def reason(kind: str, value: object) -> str:
    """The stored reason, ``<kind>:<value>`` (``format:4``, ``target:rq``)."""
    return f"{kind}:{value}"


@dataclass
class ParkedRecheck:
    """One forwarder's looks at the parked items (``unpark.lua``): what it can release goes back
    to the due index; the rest stays parked another :data:`PARK_FOR_MS`."""

    ctx: Context

    def releasable(self, why: str | None) -> bool:
        """Whether this forwarder can handle an item parked for ``why``. A reason it cannot read
        (none, or a hand write) is released too: the next claim decides again, so no garbage in
        ``parked_why`` keeps an item parked."""
        kind, _, value = (why or "").partition(":")
        if kind == FORMAT and value.isdigit():
            return int(value) in READABLE_VERSIONS
        if kind == TARGET and value:
            return value in self.ctx.targets
        return True

    def run(self) -> bool:
        """Look at each shard's parked items whose time has come; whether to look again at once
        (a shard released a full look's worth: more may be releasable)."""
        now = self.ctx.clock()
        total, again = ParkedCounts(), False
        for shard in range(self.ctx.store.shards):
            try:
                counts = self.ctx.store.recheck_parked(
                    shard, self.releasable, limit=RECHECK_LIMIT, later_ms=now + PARK_FOR_MS
                )
            except CONNECTION_ERRORS:
                raise
            except redis.ResponseError as exc:  # a parking key of another type: the line goes on
                k = self.ctx.store.keys(shard)
                log.error(
                    "shard %d: cannot look at its parked items (%s): %s or %s holds another type (written by another "
                    "tool): move it away (RENAME) so they are looked at again; the shard's other items flow",
                    shard, exc, k.parked, k.parked_why,
                )  # fmt: skip
                continue
            again = again or (counts.released > 0 and counts.released + counts.kept + counts.stale >= RECHECK_LIMIT)
            total = ParkedCounts(total.released + counts.released, total.kept + counts.kept, total.stale + counts.stale)
        self.ctx.stats.unparked += total.released
        if total.released:
            log.info("released %d parked items this forwarder can now deliver", total.released)
        self._bring_lines_near(now)
        return again

    def _bring_lines_near(self, now: int) -> None:
        """Make the group lines due now whose next look lies over :data:`LINE_AHEAD_MS` ahead (one
        round trip): a forwarder never sets one so far (its looks at a full group are a second
        apart, and a look sets a throttle's time again), so such a time is a hand write that
        would hold the group's items."""
        moved = self.ctx.store.bring_lines_near(now=now, ahead_ms=LINE_AHEAD_MS)
        if moved:
            log.warning("%d group lines were set to wait over %d s (written by another tool); looked at now",
                        moved, LINE_AHEAD_MS // 1000)  # fmt: skip
