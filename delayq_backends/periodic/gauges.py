"""Per-entry gauges of periodic entries for ``delayq exporter``: when each runs next, when it last
succeeded, its period, how long it owes a success, its missed and late counts, whether enabled.

Cardinality is bounded: the ``max_entries`` worst entries are named (the most overdue first, then
the longest without a success), and the rest are summed into one series, ``entry="_other"``.
Each scrape reads the registry (HSCAN), each entry's item and its history (pipelined): a cost
per entry per scrape, so a store of very many entries wants a longer scrape interval.

The entry's state is read as every kind writes it (:func:`~.state.state_of`), so these gauges
serve Celery and RQ entries alike with no import of either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisClusterException

from ..errors import DelayqError
from ..metrics import StoreCollector
from ..store import DelayStore
from ..timeutil import MAX_MS
from .history import EntryHistory, read_histories
from .ops import item_id
from .registry import read_registry
from .schedules import Every
from .state import PeriodicState, read_state

__all__ = ["DEFAULT_PERIODIC_ENTRIES", "OTHER", "EntryGauge", "PeriodicCollector", "entry_gauges"]

log = logging.getLogger("delayq.periodic.gauges")

#: Entries named in the gauges by default (``delayq exporter --periodic-entries``).
DEFAULT_PERIODIC_ENTRIES = 200
#: What a scrape survives (the store away, a refused permission): read as ``delayq_periodic_up 0``.
_STORE_ERRORS = (redis.RedisError, OSError, RedisClusterException, DelayqError)
#: The ``entry`` label of the series summing the entries not named.
OTHER = "_other"


@dataclass(frozen=True)
class EntryGauge:
    """One entry's gauge values at a scrape (ms; None: not known)."""

    name: str
    enabled: bool
    next_run_ms: int | None
    period_ms: int | None
    last_success_ms: int | None
    overdue_ms: int
    missed: int
    late: int

    def badness(self, now_ms: int) -> tuple[int, int]:
        """Sort key, worst first: the most overdue, then the longest without a success (never: worst)."""
        since = now_ms if self.last_success_ms is None else now_ms - self.last_success_ms
        return (-self.overdue_ms, -since)


def _period_ms(state: PeriodicState) -> int | None:
    """The entry's period: a fixed interval's, else the gap between its last run's period and its
    next (a crontab's varies; None before its first run)."""
    if isinstance(state.schedule, Every):
        return state.schedule.every_ms
    last = state.last
    return state.slot.at_ms - last.at_ms if last is not None and state.slot.at_ms > last.at_ms else None


def _gauge(name: str, ready_ms: int | None, state: PeriodicState | None, history: EntryHistory, now: int) -> EntryGauge:
    paused = ready_ms is not None and ready_ms >= MAX_MS
    enabled = (state is None or state.enabled) and not paused
    # a paused period is owed nothing, so a planned pause sets off no "no success" alert
    since = (state.resumed_ms if state is not None else None) or 0
    owed = [max(t, since) for t in (history.unsucceeded_since_ms(), ready_ms) if t is not None and t <= now]
    overdue = now - min(owed) if owed and enabled else 0
    return EntryGauge(
        name,
        enabled,
        None if paused else ready_ms,
        None if state is None else _period_ms(state),
        history.last_success_ms,
        overdue,
        history.missed,
        history.late,
    )


def entry_gauges(store: DelayStore) -> list[EntryGauge]:
    """Every registered entry's gauge values, worst first (a registry field that is no entry's
    name is skipped: `delayq periodic list` names it and its fix)."""
    names = [n for n in read_registry(store).names if _is_name(n)]
    now = store.clock()
    gauges = []
    for name, history in zip(names, read_histories(store, names)):
        item = store.get(item_id(name))
        read = read_state(item)
        gauges.append(_gauge(name, None if item is None else item.ready_ms, read and read[1], history, now))
    return sorted(gauges, key=lambda g: g.badness(now))


def _is_name(name: str) -> bool:
    try:
        item_id(name)
    except ValueError:
        return False
    return True


class PeriodicCollector(Collector):
    """The periodic entries' gauges at scrape time, ``max_entries`` named (worst first), the rest
    summed as ``entry="_other"``. A failure yields ``delayq_periodic_up 0`` and no entry gauges,
    never a failed scrape.

    Args:
        after: the store gauges' collector, registered before this one: when its read failed in
            this scrape (a hung store), this one does not wait out another socket timeout, so a
            scrape stays within Prometheus's 10 s.
    """

    def __init__(
        self, store: DelayStore, *, max_entries: int = DEFAULT_PERIODIC_ENTRIES, after: StoreCollector | None = None
    ) -> None:
        self.store = store
        self.max_entries = max_entries
        self.after = after
        self._seen_errors = 0

    def _store_failed(self) -> bool:
        """Whether the store gauges' read failed since the last scrape (in this one)."""
        if self.after is None:
            return False
        before, self._seen_errors = self._seen_errors, self.after.errors
        return self._seen_errors > before

    def collect(self) -> Iterator[Metric]:
        prefix = self.store.config.prefix
        try:
            if self._store_failed():
                raise DelayqError("the store did not answer the store gauges' read in this scrape")
            gauges = entry_gauges(self.store)
        except _STORE_ERRORS as exc:
            log.warning("cannot read the periodic entries (%s: %s)", type(exc).__name__, exc)
            gauges = None
        up = GaugeMetricFamily(
            "delayq_periodic_up", "1 if the last scrape read the periodic entries.", labels=["prefix"]
        )
        up.add_metric([prefix], 0 if gauges is None else 1)
        yield up
        if gauges is None:
            return
        count = GaugeMetricFamily("delayq_periodic_entries", "Periodic entries registered.", labels=["prefix"])
        count.add_metric([prefix], len(gauges))
        yield count
        yield from self._families(prefix, gauges[: self.max_entries], gauges[self.max_entries :])

    def _families(self, prefix: str, named: list[EntryGauge], rest: list[EntryGauge]) -> Iterator[Metric]:
        labels = ["prefix", "entry"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        next_run = gauge("delayq_periodic_next_run_timestamp_seconds", "When the entry's next period is due.")
        success = gauge("delayq_periodic_last_success_timestamp_seconds", "When a run of the entry last succeeded.")
        period = gauge("delayq_periodic_period_seconds", "The entry's period (a crontab's: its last gap).")
        overdue = gauge(
            "delayq_periodic_overdue_seconds",
            "How long the entry has owed a success: since the first period after its last success came "
            "due (or its next period, when no forwarder fired it); 0 while paused. _other: the largest.",
        )
        enabled = gauge("delayq_periodic_enabled", "1 if the entry is enabled (not paused). _other: how many are.")
        missed = CounterMetricFamily("delayq_periodic_missed", "Periods the entry missed (misfire).", labels=labels)
        late = CounterMetricFamily(
            "delayq_periodic_late", "Runs published over 1 s after their due time.", labels=labels
        )
        for g in named:
            key = [prefix, g.name]
            for family, value in ((next_run, g.next_run_ms), (success, g.last_success_ms), (period, g.period_ms)):
                if value is not None:
                    family.add_metric(key, value / 1000)
            overdue.add_metric(key, g.overdue_ms / 1000)
            enabled.add_metric(key, 1 if g.enabled else 0)
            missed.add_metric(key, g.missed)
            late.add_metric(key, g.late)
        if rest:
            key = [prefix, OTHER]
            overdue.add_metric(key, max(g.overdue_ms for g in rest) / 1000)
            enabled.add_metric(key, sum(g.enabled for g in rest))
            missed.add_metric(key, sum(g.missed for g in rest))
            late.add_metric(key, sum(g.late for g in rest))
        yield from (next_run, success, period, overdue, enabled, missed, late)
