"""A forwarder's running totals."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields, replace

from ..percentile import percentile

__all__ = ["ForwarderStats"]


@dataclass
class ForwarderStats:
    """Running totals of one forwarder; ``lateness_ms`` keeps the most recent samples."""

    forwarded: int = 0
    acked: int = 0
    #: lossless mode: items published and kept until a worker reports their start
    kept: int = 0
    #: lossless mode: kept items found started when they came due again, deleted unpublished
    confirmed: int = 0
    released: int = 0
    #: items held back by flow control (a full or rate-capped queue), given back to the store
    deferred: int = 0
    #: items parked out of the due index: no forwarder like this one can release them
    parked: int = 0
    #: of ``parked``: items of an envelope format newer than this forwarder reads
    newer_format: int = 0
    #: of ``parked``: items of a kind this forwarder has no target for
    no_target: int = 0
    #: parked items this forwarder's re-checks released (it can handle them)
    unparked: int = 0
    retried: int = 0
    dead: int = 0
    batches: int = 0
    outages: int = 0
    errors: int = 0
    #: checks that found the store's metadata changed under this forwarder (it kept its layout)
    meta_alarms: int = 0
    lateness_ms: deque[int] = field(default_factory=lambda: deque(maxlen=100_000), repr=False)

    def percentile(self, q: float) -> int | None:
        """The lateness percentile ``q`` of the kept samples, in ms (None before any)."""
        return percentile(sorted(self.lateness_ms), q)

    def snapshot(self) -> ForwarderStats:
        """A copy, to tell later what happened since (:meth:`since`)."""
        return replace(self, lateness_ms=deque(self.lateness_ms, maxlen=self.lateness_ms.maxlen))

    def settled(self) -> int:
        """Items acked, retried, dead-lettered, deferred or parked so far: progress, unlike releases."""
        return self.acked + self.kept + self.retried + self.dead + self.deferred + self.parked + self.errors

    def since(self, before: ForwarderStats) -> ForwarderStats:
        """What happened after ``before`` (a :meth:`snapshot`): counts, and the lateness of
        the items forwarded since."""
        counts = {
            f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self) if f.name != "lateness_ms"
        }
        recent = list(self.lateness_ms)[len(self.lateness_ms) - min(len(self.lateness_ms), counts["forwarded"]) :]
        return ForwarderStats(**counts, lateness_ms=deque(recent, maxlen=self.lateness_ms.maxlen))
