"""The prepare stage: a claim's items decoded, checked and grouped per target, hooks applied."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from ..envelope import Envelope
from ..errors import EnvelopeError, NewerFormatError
from ..models import FailedDelivery
from ..store import Lease
from ..targets import Delivery
from .context import Context
from .heartbeat import HeldLease
from .parking import FORMAT, PARK_FOR_MS, TARGET, reason
from .records import Prepared

if TYPE_CHECKING:
    from ..metrics import Labels

__all__ = ["Preparer"]

log = logging.getLogger("delayq.forwarder")


class Preparer:
    """Turns a held claim into a :class:`Prepared`: each item decoded once per distinct envelope,
    an item that cannot be decoded failed alone, one of a newer format or with no target here
    parked (:mod:`.parking`), then each hook's :meth:`~.hooks.PassHook.prepare` applied."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: envelope formats met that are newer than this forwarder reads: each is logged once
        self._newer_formats: set[int] = set()
        #: item kinds met with no target here: each is logged once
        self._missing_targets: set[str] = set()

    def prepare(self, held: HeldLease) -> Prepared:
        started = time.perf_counter()
        claim = held.claim
        groups: dict[str, list[Delivery]] = defaultdict(list)
        failures: list[FailedDelivery] = []
        labels: dict[str, Labels] = {}
        decoded: dict[bytes, Envelope] = {}  # one queue's jobs often share an envelope: decoded once
        later: list[tuple[str, int]] = []
        parked: dict[str, str] = {}
        for item in claim.items:
            envelope = decoded.get(item.envelope)
            if envelope is None:
                try:
                    envelope = decoded[item.envelope] = Envelope.decode(item.envelope)
                except NewerFormatError as exc:
                    parked[item.id] = self._leave_for_newer(item.id, exc, labels)
                    continue
                except EnvelopeError as exc:
                    failures.append(FailedDelivery(item.id, None, f"corrupt envelope: {exc}"))
                    continue
                except Exception as exc:  # whatever the bytes are, one item never fails the batch
                    failures.append(FailedDelivery(item.id, None, f"corrupt envelope: {type(exc).__name__}: {exc}"))
                    continue
            if self.ctx.metrics is not None:
                labels[item.id] = (envelope.target, envelope.destination)
            if envelope.target not in self.ctx.targets:
                parked[item.id] = self._leave_for_target(item.id, envelope.target)
                continue
            groups[envelope.target].append(Delivery(item.id, envelope, item.attempts, item.ready_ms))
        skip: set[str] = set()
        keep: dict[str, int] = {}
        for hook in self.ctx.hooks:
            verdict = hook.prepare(claim, groups)
            skip |= verdict.skip
            failures += verdict.failures
            later += verdict.later
            keep |= verdict.keep
            gone = verdict.skip | {f.id for f in verdict.failures} | {i for i, _ in verdict.later}
            if gone:
                groups = defaultdict(list, {kind: [d for d in ds if d.id not in gone] for kind, ds in groups.items()})
        return Prepared(
            held, Lease(self.ctx.store, claim, keep), dict(groups), tuple(failures), tuple(later), labels,
            frozenset(skip), started, parked,
        )  # fmt: skip

    def _leave_for_newer(self, item_id: str, exc: NewerFormatError, labels: dict[str, Labels]) -> str:
        """An item written by a newer delayq (a rolling upgrade, producers first): parked
        (attempt not counted) for a newer forwarder; its reason returned, counted, and logged
        once per format. Dead-lettering it would lose it for the forwarder's age."""
        self.ctx.stats.newer_format += 1
        if self.ctx.metrics is not None:
            labels[item_id] = self.ctx.metrics.observe_newer_format(exc.version)
        if exc.version not in self._newer_formats:
            self._newer_formats.add(exc.version)
            log.warning(
                "item %r: %s; such items are parked for a newer forwarder (looked at again every %g s, not an "
                "attempt; logged once per format)",
                item_id,
                exc,
                PARK_FOR_MS / 1000,
            )
        return reason(FORMAT, exc.version)

    def _leave_for_target(self, item_id: str, kind: str) -> str:
        """An item of a kind this forwarder has no target for (a Celery periodic entry claimed by
        one started without ``--celery-broker``): parked like a newer format's, for a forwarder
        that has the target; its reason returned, counted, logged once per kind. A
        configuration, not an attempt."""
        self.ctx.stats.no_target += 1
        if self.ctx.metrics is not None:
            self.ctx.metrics.observe_no_target(kind)
        if kind not in self._missing_targets:
            self._missing_targets.add(kind)
            log.warning(
                "item %r: no %r target in forwarder %s (it has %s); such items are parked for a forwarder with "
                "that target (looked at again every %g s, not an attempt; logged once per kind): start one with it",
                item_id, kind, self.ctx.name, sorted(self.ctx.targets), PARK_FOR_MS / 1000,
            )  # fmt: skip
        return reason(TARGET, kind)
