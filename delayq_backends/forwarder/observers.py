"""Observers of the publish calls, as hooks: the stats' lateness, the metrics, the audit trail.
Each reads a call's :class:`~.records.Sent` and changes nothing of it (the spans are
:class:`~.tracing.ForwardTracer`'s, a hook too)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..audit import FORWARDED, AuditRecord, AuditSink
from .hooks import PassHook
from .records import Sent
from .stats import ForwarderStats

if TYPE_CHECKING:
    from ..metrics import ForwarderMetrics

__all__ = ["AuditHook", "MetricsHook", "StatsHook"]

log = logging.getLogger("delayq.forwarder")


class StatsHook(PassHook):
    """The lateness of each item published (:attr:`ForwarderStats.lateness_ms`)."""

    def __init__(self, stats: ForwarderStats) -> None:
        self.stats = stats

    def reported(self, sent: Sent) -> None:
        now, published = sent.now_ms, sent.report.published
        if len(published) == len(sent.deliveries):  # all of them (almost always): no lookup per item
            self.stats.lateness_ms.extend(now - d.ready_ms for d in sent.deliveries)
        else:
            ready = {d.id: d.ready_ms for d in sent.deliveries}
            self.stats.lateness_ms.extend(now - ready[i] for i in published)


class MetricsHook(PassHook):
    """The items published and their lateness, and the periods overlap policies skipped."""

    def __init__(self, metrics: ForwarderMetrics) -> None:
        self.metrics = metrics

    def reported(self, sent: Sent) -> None:
        self.metrics.observe_published(sent.deliveries, sent.report.published, sent.now_ms)
        for skipped in sent.report.skipped:
            self.metrics.observe_periodic_skipped(skipped.entry, skipped.periods)


class AuditHook(PassHook):
    """One ``forwarded`` audit record per item published, by forwarder ``name``."""

    def __init__(self, audit: AuditSink, name: str) -> None:
        self.audit = audit
        self.name = name

    def reported(self, sent: Sent) -> None:
        if not sent.report.published:
            return
        done = set(sent.report.published)
        records = [
            AuditRecord(FORWARDED, d.id, d.envelope.target, d.envelope.destination, d.ready_ms, sent.now_ms,
                        d.attempts, self.name)
            for d in sent.deliveries
            if d.id in done
        ]  # fmt: skip
        try:
            self.audit.record(records)
        except Exception:  # an audit sink must never stop forwarding
            log.exception("audit sink %r failed; forwarding goes on", self.audit)
