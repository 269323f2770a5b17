"""What every stage of a forwarder's pass shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..store import DelayStore
from ..targets import Target
from ..timeutil import Clock
from .hooks import PassHook
from .stats import ForwarderStats

if TYPE_CHECKING:
    from ..metrics import ForwarderMetrics

__all__ = ["Context"]


@dataclass(frozen=True)
class Context:
    """The store, targets, hooks, clock, totals and metrics of one forwarder, given to each stage."""

    store: DelayStore
    targets: Mapping[str, Target]
    hooks: Sequence[PassHook]
    #: the store's clock (``store.clock``), the one instance its leases, firing and targets read
    clock: Clock
    stats: ForwarderStats
    metrics: ForwarderMetrics | None
    #: this forwarder's name in logs and audit records
    name: str
    retry_delay_ms: int
    max_retry_delay_ms: int

    def retry_at(self, attempts: int) -> int:
        """When an item failed on its ``attempts``-th claim is tried again: the retry delay,
        doubled per attempt, capped."""
        delay = min(self.max_retry_delay_ms, self.retry_delay_ms << min(30, max(0, attempts - 1)))
        return self.clock() + delay
