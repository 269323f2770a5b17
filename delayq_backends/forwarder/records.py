"""What a pass knows about one claim at each stage: typed, and frozen once the stage is done."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..models import FailedDelivery
from ..store import Lease
from ..targets import Delivery, PublishReport
from .heartbeat import HeldLease

if TYPE_CHECKING:
    from ..metrics import Labels

__all__ = ["Prepared", "Published", "Sent", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """What a hook decided about some items of a claim at a stage boundary (see :mod:`.hooks`)."""

    #: not published: settled by the hook that named them (lossless: found started)
    skip: frozenset[str] = frozenset()
    #: not published: retried or dead-lettered
    failures: tuple[FailedDelivery, ...] = ()
    #: not published now: given back until (id, not-before ms), no attempt counted
    later: tuple[tuple[str, int], ...] = ()
    #: once published, kept in the store (id -> window ms) instead of deleted (lossless)
    keep: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Prepared:
    """A claim decoded and ready to publish; its lease is held by the heartbeat until settled."""

    held: HeldLease
    #: the claim's lease, with the ids its ack keeps (:attr:`Verdict.keep`)
    lease: Lease
    #: the deliveries to publish, per target kind
    groups: Mapping[str, list[Delivery]]
    failures: tuple[FailedDelivery, ...]
    later: tuple[tuple[str, int], ...]
    #: (target, queue) of each decoded item, for the metrics (only kept with metrics)
    labels: Mapping[str, Labels]
    #: ids the hooks settle themselves (:attr:`Verdict.skip`)
    skipped: frozenset[str]
    #: perf_counter() at the start of the prepare, for the batch's log line
    started: float
    #: ids no forwarder like this one can release (a newer format, no target here) -> why:
    #: parked out of the due index at the settle (:mod:`.parking`)
    parked: Mapping[str, str] = field(default_factory=dict)

    @property
    def shard(self) -> int:
        return self.lease.shard


@dataclass(frozen=True)
class Published:
    """A claim once its publish calls are done: what the targets reported, and what to settle."""

    prepared: Prepared
    report: PublishReport
    failures: tuple[FailedDelivery, ...]
    later: tuple[tuple[str, int], ...]

    @property
    def lease(self) -> Lease:
        return self.prepared.lease

    def to_ack(self) -> list[str]:
        """The published ids to delete: not acked by a ClaimTarget in its transaction already,
        nor kept (:attr:`Verdict.keep`)."""
        pre_acked, keep = set(self.report.acked), self.lease.keep_windows
        return [i for i in self.report.published if i not in pre_acked and i not in keep]


@dataclass(frozen=True)
class Sent:
    """One publish call, as the observing hooks see it (:meth:`.hooks.PassHook.reported`)."""

    kind: str
    deliveries: list[Delivery]
    report: PublishReport
    #: when the target answered (server ms), and when the call started (``time_ns``: the span's start)
    now_ms: int
    started_ns: int
