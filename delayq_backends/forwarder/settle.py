"""The settle stage: published claims acked, and their failures, deferrals and releases written."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, cast

from ..targets import Buried, BuryTarget
from .context import Context
from .hooks import without_kept
from .parking import PARK_FOR_MS
from .publish import shard_step
from .records import Published

if TYPE_CHECKING:
    pass

__all__ = ["Settler"]

log = logging.getLogger("delayq.forwarder")


class Settler:
    """Settles published claims: the acks of all in one round trip (the usual, only step), then
    the rest claim by claim (hooks, failures, deferrals, releases, metrics)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._buriers = {kind for kind, target in ctx.targets.items() if isinstance(target, BuryTarget)}

    def settle_all(self, published: Sequence[Published]) -> list[Exception | None]:
        """Each claim's error (its shard's), or None.

        Raises:
            redis.ConnectionError, redis.TimeoutError: the store is unreachable.
        """
        acks = self.ctx.store.ack_many([(p.lease.claim, p.to_ack()) for p in published])
        errors: list[Exception | None] = []
        for p, acked in zip(published, acks):
            self.ctx.stats.batches += 1
            self.ctx.stats.forwarded += len(p.report.published)
            errors.append(acked if isinstance(acked, Exception) else shard_step(partial(self._settle, p, acked)))
        return errors

    def _settle(self, p: Published, acked: int) -> None:
        """The rest of a claim's settle once its acks are in."""
        lease, report = p.lease, p.report
        keep = lease.keep_windows
        self.ctx.stats.acked += len(set(report.acked) - keep.keys()) + acked
        for hook in self.ctx.hooks:
            hook.settled(p)
        retried = buried = released = 0
        if p.failures:
            counts = lease.fail(p.failures)
            retried, buried = counts.retried, counts.buried
            self.ctx.stats.retried += retried
            self.ctx.stats.dead += buried
            for f in p.failures:
                log.warning("item %r failed: %s", f.id, f.error)
            if counts.buried_ids and self._buriers:
                self._tell_buried(p, counts.buried_ids)
        deferred = lease.defer(p.later) if p.later else 0
        self.ctx.stats.deferred += deferred
        parked = self._park(p) if p.prepared.parked else 0
        if report.unsent:
            released = lease.release(report.unsent)
            self.ctx.stats.released += released
        if self.ctx.metrics is not None:
            self.ctx.metrics.observe_settled(
                lease.claim,
                p.prepared.labels,
                without_kept(report, keep),
                p.failures,
                acked=acked,
                retried=retried,
                buried=buried,
                released=released,
                deferred=[i for i, _ in p.later],
                deferred_count=deferred,
                parked=list(p.prepared.parked),
                parked_count=parked,
                max_attempts=self.ctx.store.config.max_attempts,
            )
        log.debug(
            "shard %d: claimed %d, published %d, failed %d, released %d, deferred %d, parked %d in %.1f ms",
            lease.shard,
            len(lease.items),
            len(report.published),
            len(p.failures),
            len(report.unsent),
            len(p.later),
            len(p.prepared.parked),
            (time.perf_counter() - p.prepared.started) * 1000,
        )

    def _park(self, p: Published) -> int:
        """Park the claim's items no forwarder like this one can release (:mod:`.parking`); how many."""
        parked = p.lease.park(p.prepared.parked, recheck_ms=self.ctx.clock() + PARK_FOR_MS)
        self.ctx.stats.parked += parked.count
        if parked.bad_key:
            log.error(
                "cannot park %d items: %s holds another type (written by another tool); they are deferred "
                "%g s instead: move the key away (RENAME) so they are parked",
                parked.count, parked.bad_key, PARK_FOR_MS / 1000,
            )  # fmt: skip
        return parked.count

    def _tell_buried(self, p: Published, ids: tuple[str, ...]) -> None:
        """Tell each :class:`BuryTarget` which of its deliveries the store just dead-lettered."""
        dead, errors = set(ids), {f.id: f.error for f in p.failures}
        for kind in self._buriers & p.prepared.groups.keys():
            letters = [Buried(d, errors[d.id]) for d in p.prepared.groups[kind] if d.id in dead]
            if not letters:
                continue
            try:
                cast(BuryTarget, self.ctx.targets[kind]).buried(letters)
            except Exception:  # the dead letters are kept: this only mirrors them
                log.exception("target %r could not record %d dead letters on its side", kind, len(letters))
