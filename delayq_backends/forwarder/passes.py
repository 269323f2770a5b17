"""A pass: claim -> prepare -> publish -> settle, one batch per due shard, over the store's lease role."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..models import Claim
from .backoff import OutageBackoff, ShardBackoff
from .context import Context
from .heartbeat import Heartbeat, HeldLease
from .prepare import Preparer
from .publish import Publisher, shard_step
from .records import Prepared, Published
from .settle import Settler

if TYPE_CHECKING:
    from .groups import ReleaseStep

__all__ = ["Claimed", "Pass"]


@dataclass(frozen=True)
class Claimed:
    """The claim stage's result: each due shard's claim (or the error its shard raised), and the
    claims' leases, held by the heartbeat from here until :meth:`Pass.deliver` has settled them."""

    claims: list[tuple[int, Claim | Exception]]
    held: list[HeldLease]
    #: how many items a full claim holds: a shard whose claim came back full may have more due
    batch: int
    #: the shards whose group lines may release more now (the release step's)
    lines: frozenset[int] = frozenset()

    def full(self) -> list[int]:
        """The shards whose claim came back full."""
        return [shard for shard, c in self.claims if isinstance(c, Claim) and len(c.items) == self.batch]

    def more(self) -> list[int]:
        """The shards worth a next claim at once: those whose claim came back full, and, when
        this one claimed something, those whose group lines may release more (a pass releases
        a capped share of a backlog: the next pass takes the next share, and looks at the other
        groups' lines again first)."""
        claimed = any(isinstance(c, Claim) and c.items for _, c in self.claims)
        return sorted({*self.full(), *(self.lines if claimed else ())})


class Pass:
    """One batch from each due shard, all claimed in one round trip, published with one call per
    target, then all acked in one round trip.

    A publish and an ack round trip per shard made a pass over 16 shards cost ~7 ms, most of the
    lateness at a high rate. Every batch claimed is delivered, even after a stop: they are in
    flight. A batch published late in the pass keeps its items ours by the lease check before its
    publish (the publisher extends a lease near its end), and every batch is held by the
    heartbeat from its claim until its acks are in.
    """

    def __init__(
        self,
        ctx: Context,
        batch: int,
        heartbeat: Heartbeat,
        stages: tuple[Preparer, Publisher, Settler],
        shards: ShardBackoff,
        outages: OutageBackoff,
        release: ReleaseStep | None = None,
    ) -> None:
        self.ctx = ctx
        #: the release step (:class:`~.groups.ReleaseStep`): group line heads into the due index;
        #: it tells which due shards are worth a claim
        self.release = release
        self.store = ctx.store
        self.batch = batch
        self.heartbeat = heartbeat
        self.preparer, self.publisher, self.settler = stages
        self.shards = shards
        self.outages = outages

    def run(self, due: list[int]) -> tuple[int, list[int]]:
        """The items claimed from ``due``, and the shards whose batch came back full (more may be due)."""
        return self.deliver(self.claim(due))

    def claim(self, due: Sequence[int]) -> Claimed:
        """Release the groups' line heads whose time came (:mod:`.groups`), then claim a batch
        of each shard of ``due`` in one round trip (an outage raises)."""
        lines: frozenset[int] = frozenset()
        if self.release is not None:
            due = self.release.release(due)
            lines = frozenset(self.release.due_lines)
        started = time.perf_counter()
        claims = self.store.claim_many(list(due), limit=self.batch, claimer=self.ctx.name) if due else []
        if self.ctx.metrics is not None:
            self.ctx.metrics.observe_claim(time.perf_counter() - started)
        held = self.heartbeat.hold()
        held += [HeldLease(self.store, c) for c in claims if isinstance(c, Claim) and c.items]
        return Claimed(list(zip(due, claims)), held, self.batch, lines)

    def deliver(self, claimed: Claimed) -> tuple[int, list[int]]:
        """Prepare, publish and settle ``claimed``: the items claimed and the shards still due."""
        done: list[Claim] = []
        try:
            held = iter(claimed.held)
            prepared: list[Prepared] = []
            for shard, claim in claimed.claims:
                if isinstance(claim, Exception):  # a key of another type, the server at maxmemory
                    self.shards.set_aside(shard, claim, None)
                elif not claim.items:
                    done.append(claim)
                elif isinstance(p := shard_step(partial(self.preparer.prepare, next(held))), Exception):
                    self.shards.set_aside(shard, p, claim)
                else:
                    prepared.append(p)
            done += self._publish_and_settle(prepared)
        finally:
            self.heartbeat.drop(claimed.held)
        for claim in done:
            self.shards.cleared(claim.shard)
        full = set(claimed.full())
        settled = {c.shard for c in done}
        return sum(len(c.items) for c in done), [s for s in claimed.more() if s in settled or s not in full]

    def deliver_one(self, claim: Claim) -> None:
        """Publish one claim's items, then ack, fail or release each as its target reports;
        raises what handling the claim raised."""
        held = self.heartbeat.hold()
        try:
            held.append(HeldLease(self.store, claim))
            published, errors = self.publisher.publish_all([self.preparer.prepare(held[0])])
            error: Exception | None = errors.get(0)
            if error is None and published:
                (error,) = self._settle(published)
        finally:
            self.heartbeat.drop(held)
        if error is not None:
            raise error

    def _publish_and_settle(self, prepared: list[Prepared]) -> list[Claim]:
        """The claims of ``prepared`` settled without error; the others' shards set aside."""
        published, errors = self.publisher.publish_all(prepared)
        settled = self._settle(published)
        for n, raised in errors.items():
            self.shards.set_aside(prepared[n].shard, raised, prepared[n].lease.claim)
        done: list[Claim] = []
        for p, error in zip(published, settled):
            if error is None:
                done.append(p.lease.claim)
            else:
                self.shards.set_aside(p.lease.shard, error, p.lease.claim)
        return done

    def _settle(self, published: list[Published]) -> list[Exception | None]:
        """Settle, then one pause if the publishes met an unreachable broker, after every claim
        is settled (its unsent items released): one publish call carries many claims, and a
        pause per claim would hold the others' leases through each."""
        errors = self.settler.settle_all(published)
        down = [p.report for p in published if p.report.broker_error is not None]
        if not down:
            self.outages.reset()
        else:
            self.ctx.stats.outages += 1
            released = sum(len(r.unsent) for r in down)
            self.outages.pause(f"broker unreachable ({down[0].broker_error}); released {released} items")
        return errors
