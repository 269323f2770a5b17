"""Prometheus metrics of a forwarder and of a delay store.

:class:`ForwarderMetrics` counts what one forwarder did with the items it claimed (forwarded,
acked, released, retried, dead-lettered, by target and queue) and times lateness and claims.
:class:`StoreCollector` reads each shard's counts from the store at scrape time, so the gauges
are never stale and cost nothing between scrapes. Each object owns its own
:class:`~prometheus_client.CollectorRegistry`, never the global one: several forwarders, or a
forwarder and the tests, may live in one process without their metrics colliding.

The forwarder labels by ``target`` (the envelope's target kind) and ``queue`` (its
destination: a Celery queue or routing key, an RQ queue, a list key). Both come from item data,
which anyone who can write to the store controls, so each label takes its value from a bounded
set (:class:`LabelBounds`): the queues and target kinds the forwarder is configured with, and
:data:`OTHER` for everything else. 3,300 distinct queues once made 72,699 series; now they make
one ``other`` series per metric, holding their sums.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisClusterException

from .errors import ConfigError, DelayqError
from .group_policies import rate_per_second
from .store import KEY_LIST_TTL, SlotKeyList
from .store.groupboard import GroupKeyList, busiest_first, throttled

if TYPE_CHECKING:
    from .models import Claim, FailedDelivery, GroupStatus
    from .store import DelayStore
    from .targets import Delivery, PublishReport

__all__ = [
    "DEFAULT_GROUPS",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_SLOT_KEYS",
    "OTHER",
    "UNATTRIBUTED",
    "ForwarderMetrics",
    "GroupCollector",
    "OTHER_GROUPS",
    "LabelBounds",
    "Labels",
    "SlotCollector",
    "StoreCollector",
    "attribute",
    "serve_metrics",
]

log = logging.getLogger("delayq.metrics")

#: Loopback by default: the metrics name every queue and its backlog, which is nobody's business
#: outside the host unless the operator says so (``--metrics-host 0.0.0.0`` in a container).
DEFAULT_METRICS_HOST = "127.0.0.1"

#: (target, queue) of an item.
Labels = tuple[str, str]

#: Labels of an item whose envelope could not be decoded, so it has no target or queue.
CORRUPT: Labels = ("(corrupt)", "(corrupt)")
#: Labels of an item whose envelope format is newer than the forwarder reads (left for a newer one).
NEWER_FORMAT: Labels = ("(newer format)", "(newer format)")
#: Labels of outcomes the store counted but the forwarder cannot pin on one (target, queue): a
#: batch of several queues where some items lost their lease mid-batch (the store's scripts
#: return counts, not ids). Rare; the totals over all labels stay exact.
UNATTRIBUTED: Labels = ("?", "?")
#: The label value of every queue (or target kind) the forwarder was not configured to name.
OTHER = "other"
#: Without configured queues (library use), the first this many distinct queues seen get their
#: own label and later ones count under :data:`OTHER`; the CLI always passes the configured set.
DEFAULT_MAX_QUEUE_LABELS = 100
#: Likewise for target kinds (a forwarder has a handful).
DEFAULT_MAX_TARGET_LABELS = 8
#: Periodic entries labelled by name (operators define them; an entry name comes from store
#: data, so past this many the rest count under :data:`OTHER`).
MAX_ENTRY_LABELS = 500


class _Bound:
    """One label's allowed values: a fixed set, or (``allowed`` None) the first ``cap`` seen."""

    def __init__(self, allowed: Iterable[str] | None, cap: int) -> None:
        self.fixed = allowed is not None
        self.values: set[str] = set(allowed or ())
        self.cap = cap
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self.values:
            return value
        if self.fixed:
            return OTHER
        with self._lock:
            if len(self.values) < self.cap:
                self.values.add(value)
                return value
        return OTHER


class LabelBounds:
    """Maps an item's (target, queue) onto bounded label values.

    Args:
        queues: the queues to label by name (configured ones, and those under rate or depth caps);
            any other is :data:`OTHER`. None: the first ``max_queues`` seen, then :data:`OTHER`.
        targets: the target kinds the forwarder has; None: the first ``max_targets`` seen.
    """

    def __init__(
        self,
        queues: Iterable[str] | None = None,
        targets: Iterable[str] | None = None,
        *,
        max_queues: int = DEFAULT_MAX_QUEUE_LABELS,
        max_targets: int = DEFAULT_MAX_TARGET_LABELS,
    ) -> None:
        self.queue = _Bound(queues, max_queues)
        self.target = _Bound(targets, max_targets)

    def __call__(self, labels: Labels) -> Labels:
        if labels in (CORRUPT, NEWER_FORMAT, UNATTRIBUTED):
            return labels
        return (self.target(labels[0]), self.queue(labels[1]))


#: Lateness runs from milliseconds (an idle forwarder woken on time) to an hour (a backlog after
#: an outage); finer buckets below a second, where an SLO would sit.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: A claim of a few hundred items takes about a millisecond; tens of ms mean a huge batch or a
#: busy server (a claim blocks Redis while it runs).
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

#: Slot keys the slot gauges name, busiest first: slot keys are user data (one per customer,
#: maybe), so the rest count only in the totals over every key.
DEFAULT_SLOT_KEYS = 50

#: Groups the group gauges name, busiest first (running plus parked): a group is user data (one
#: per tenant, maybe), so the rest are summed under :data:`OTHER_GROUPS`.
DEFAULT_GROUPS = 50
#: The ``group`` label of the sums over the groups not named. A group of that very name is
#: counted in the sums, never named (two series of one label set would spoil the scrape).
OTHER_GROUPS = "(other)"

#: What a scrape may meet when the store is away or misconfigured; anything else is a bug and
#: is left to prometheus_client to report (as an HTTP 500), not hidden.
_STORE_ERRORS = (redis.RedisError, OSError, RedisClusterException, DelayqError)


def attribute(labels: Sequence[Labels], done: int) -> Tally[Labels]:
    """Split a count the store returned over the labels of the items it was asked about.

    Exact when the store did them all (the normal case) or when they share one label; otherwise
    the count goes to :data:`UNATTRIBUTED`, because a script's count cannot say which items
    it skipped.
    """
    if done == len(labels):
        return Tally(labels)
    if done and len(set(labels)) == 1:
        return Tally({labels[0]: done})
    return Tally({UNATTRIBUTED: done}) if done else Tally()


class ForwarderMetrics:
    """The metrics of one forwarder, in a registry of their own.

    Args:
        store: when given, the registry also serves that store's per-shard gauges
            (:class:`StoreCollector`), so one scrape of a forwarder shows both.
        registry: where to register (default: a new one, see :attr:`registry`).
        bounds: which label values may appear (default: :class:`LabelBounds` with its caps).
    """

    def __init__(
        self,
        *,
        store: DelayStore | None = None,
        registry: CollectorRegistry | None = None,
        bounds: LabelBounds | None = None,
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self.bounds = LabelBounds() if bounds is None else bounds
        labels = ("target", "queue")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        self.forwarded = counter("delayq_forwarded", "Items their target's broker accepted.")
        self.acked = counter("delayq_acked", "Forwarded items deleted from the store under this forwarder's lease.")
        self.released = counter("delayq_released", "Items put back unsent (broker outage), attempt not counted.")
        self.retried = counter("delayq_retried", "Failed deliveries scheduled again with back-off.")
        self.deferred = counter(
            "delayq_deferred", "Items flow control gave back to the store to wait (queue full or rate cap)."
        )
        self.parked = counter(
            "delayq_parked",
            "Items parked out of the due index: this forwarder cannot release them (a newer envelope format, a "
            "target it lacks); a forwarder that can releases them at its next look. Not an attempt.",
        )
        self.kept = counter(
            "delayq_kept", "Published items kept in the store until a worker records their start (lossless mode)."
        )
        self.found_started = counter(
            "delayq_found_started",
            "Kept items found started when due again: deleted, not published again (lossless mode).",
        )
        self.dead_lettered = counter(
            "delayq_dead_lettered", "Items this forwarder moved to the dead letters (out of attempts or permanent)."
        )
        self.newer_format = Counter(
            "delayq_newer_format",
            "Claims of items whose envelope format is newer than this forwarder reads: parked for a newer "
            "forwarder, not an attempt (upgrade this forwarder).",
            ("format",),
            registry=self.registry,
        )
        self.no_target = Counter(
            "delayq_no_target",
            "Claims of items of a kind this forwarder has no target for: parked for a forwarder that has it, "
            "not an attempt (start one with that target).",
            ("target",),
            registry=self.registry,
        )
        self.meta_alarms = Counter(
            "delayq_meta_alarms",
            "Checks that found the store's metadata (<prefix>:meta) changed under this forwarder.",
            registry=self.registry,
        )
        self.lateness = Histogram(
            "delayq_lateness_seconds",
            "Forwarded time (store clock) minus ready time.",
            labels,
            registry=self.registry,
            buckets=LATENESS_BUCKETS,
        )
        self.claim_seconds = Histogram(
            "delayq_claim_seconds",
            "Duration of one claim call (one shard, one batch), as the forwarder sees it.",
            registry=self.registry,
            buckets=CLAIM_BUCKETS,
        )
        self.backpressure = Gauge(
            "delayq_backpressure",
            "1 while forwarding to this target and queue is paused by back-pressure, else 0.",
            labels,
            registry=self.registry,
        )
        self.config_errors = Counter(
            "delayq_config_errors",
            "Calls to a target that met a configuration error (a refused login or permission, a missing "
            "module): the target is paused, its items wait in the store, no attempt counted.",
            ("target",),
            registry=self.registry,
        )
        self.target_paused = Gauge(
            "delayq_target_paused",
            "1 while this target is paused by a configuration error, else 0.",
            ("target",),
            registry=self.registry,
        )
        self.periodic_skipped = Counter(
            "delayq_periodic_skipped",
            "Periods of a periodic entry skipped by its overlap policy (its previous run still running).",
            ("entry",),
            registry=self.registry,
        )
        self._entry = _Bound(None, MAX_ENTRY_LABELS)
        if store is not None:
            self.registry.register(StoreCollector(store))

    def observe_periodic_skipped(self, entry: str, periods: int) -> None:
        """``periods`` of periodic entry ``entry`` skipped by its overlap policy."""
        self.periodic_skipped.labels(self._entry(entry)).inc(periods)

    def observe_pause(self, target: str, paused: bool) -> None:
        """A target paused by a configuration error (counted), or working again."""
        label = self.bounds.target(target)
        if paused:
            self.config_errors.labels(label).inc()
        self.target_paused.labels(label).set(1 if paused else 0)

    def set_backpressure(self, target: str, queue: str, paused: bool) -> None:
        """Show whether back-pressure holds deliveries to ``target``/``queue`` back.

        Call it on every change of state, pausing and resuming alike; a queue never paused
        has no series until then, which reads as "not paused" in a ``max by`` alert.
        """
        self.backpressure.labels(*self.bounds((target, queue))).set(1 if paused else 0)

    def observe_newer_format(self, version: int) -> Labels:
        """Count a claimed item of envelope format ``version`` (newer than this forwarder reads);
        returns the labels its parking counts under. ``version`` is one byte: a bounded label."""
        self.newer_format.labels(str(version)).inc()
        return NEWER_FORMAT

    def observe_no_target(self, kind: str) -> None:
        """Count a claimed item of kind ``kind`` that this forwarder has no target for."""
        self.no_target.labels(self.bounds.target(kind)).inc()

    def observe_claim(self, seconds: float) -> None:
        self.claim_seconds.observe(seconds)

    def observe_published(self, deliveries: Sequence[Delivery], published: Iterable[str], now_ms: int) -> None:
        """Count the items a target accepted and record their lateness at ``now_ms``.

        Grouped by label first: a batch usually holds one or a few queues, and each label
        lookup takes the metric's lock.
        """
        sent = set(published)
        late: dict[Labels, list[float]] = defaultdict(list)
        for d in deliveries:
            if d.id in sent:
                labels = self.bounds((d.envelope.target, d.envelope.destination))
                late[labels].append(max(0, now_ms - d.ready_ms) / 1000)
        for (target, queue), seconds in late.items():
            self.forwarded.labels(target, queue).inc(len(seconds))
            lateness = self.lateness.labels(target, queue)
            for s in seconds:
                lateness.observe(s)

    def observe_settled(
        self,
        claim: Claim,
        labels: Mapping[str, Labels],
        report: PublishReport,
        failures: Sequence[FailedDelivery],
        *,
        acked: int,
        retried: int,
        buried: int,
        released: int,
        deferred: Sequence[str] = (),
        deferred_count: int = 0,
        parked: Sequence[str] = (),
        parked_count: int = 0,
        max_attempts: int,
    ) -> None:
        """Count a batch's acks, retries, dead letters, releases and deferrals by target and queue.

        Args:
            labels: (target, queue) of each claimed id whose envelope decoded.
            failures: as given to ``store.fail``.
            acked: what ``store.ack`` returned for the published ids a target had not acked
                itself (``report.acked``, counted here as acked).
            retried, buried: what ``store.fail`` returned.
            released: what ``store.release`` returned for ``report.unsent``.
            deferred, deferred_count: the ids flow control held back, and what ``store.defer``
                returned for them.
            parked, parked_count: the ids this forwarder cannot release, and what ``store.park``
                returned for them.
            max_attempts: the store's; an item failing on its last attempt is buried, as
                fail.lua decides, which is how each failure's outcome is told apart.
        """

        def of(ids: Iterable[str]) -> list[Labels]:
            return [self.bounds(labels.get(i, CORRUPT)) for i in ids]

        self._add(self.acked, Tally(of(report.acked)))
        already = set(report.acked)
        self._add(self.acked, attribute(of(i for i in report.published if i not in already), acked))
        attempts = {item.id: item.attempts for item in claim.items}
        doomed = {f.id for f in failures if f.retry_at_ms is None or attempts[f.id] >= max_attempts}
        self._add(self.dead_lettered, attribute(of(f.id for f in failures if f.id in doomed), buried))
        self._add(self.retried, attribute(of(f.id for f in failures if f.id not in doomed), retried))
        self._add(self.released, attribute(of(report.unsent), released))
        self._add(self.deferred, attribute(of(deferred), deferred_count))
        self._add(self.parked, attribute(of(parked), parked_count))

    def observe_lossless(
        self, labels: Mapping[str, Labels], *, kept: Sequence[str], found_started: Sequence[str]
    ) -> None:
        """Count a batch's items kept awaiting their start and those found started (lossless mode)."""
        self._add(self.kept, Tally(self.bounds(labels.get(i, CORRUPT)) for i in kept))
        self._add(self.found_started, Tally(self.bounds(labels.get(i, CORRUPT)) for i in found_started))

    @staticmethod
    def _add(counter: Counter, counts: Tally[Labels]) -> None:
        for (target, queue), n in counts.items():
            counter.labels(target, queue).inc(n)


class StoreCollector(Collector):
    """Per-shard gauges of a store, read with one pipelined round of ZCARD/ZCOUNT/HLEN at scrape
    time (:meth:`DelayStore.stats`): no scans, so a scrape costs the same for ten items or ten
    million.

    A store that cannot be read yields no shard gauges and ``delayq_store_up 0`` (and counts the
    failure) instead of failing the scrape, so an exporter outlives its store's outages and the
    outage itself is what alerts.
    """

    def __init__(self, store: DelayStore) -> None:
        self.store = store
        self.errors = 0

    def collect(self) -> Iterator[Metric]:
        prefix = self.store.config.prefix
        started = time.perf_counter()
        try:
            per_shard = self.store.stats()
        except _STORE_ERRORS as exc:
            self.errors += 1
            log.warning("cannot read the store's counts (%s: %s)", type(exc).__name__, exc)
            per_shard = None
        elapsed = time.perf_counter() - started
        up = GaugeMetricFamily("delayq_store_up", "1 if the last scrape read the store, else 0.", labels=["prefix"])
        up.add_metric([prefix], 0 if per_shard is None else 1)
        errors = CounterMetricFamily(
            "delayq_store_scrape_errors", "Scrapes that could not read the store.", labels=["prefix"]
        )
        errors.add_metric([prefix], self.errors)
        duration = GaugeMetricFamily(
            "delayq_store_scrape_seconds", "How long reading the store's counts took.", labels=["prefix"]
        )
        duration.add_metric([prefix], elapsed)
        yield from (up, errors, duration)
        if per_shard is None:
            return
        gauges = {
            name: GaugeMetricFamily(name, doc, labels=["prefix", "shard"])
            for name, doc in (
                ("delayq_scheduled", "Items in the shard, leased ones included."),
                ("delayq_due", "Items whose time has come (or whose lease ran out), not yet claimed."),
                ("delayq_leased", "Items claimed by a forwarder and not yet acked or released."),
                ("delayq_dead", "Dead letters of the shard."),
                (
                    "delayq_parked",
                    "Items parked out of the due index: no forwarder that claimed them could release them (a newer "
                    "envelope format, a target it lacks).",
                ),
                ("delayq_oldest_overdue_seconds", "How long the shard's earliest item has waited past its time."),
            )
        }
        for s in per_shard:
            shard = [prefix, str(s.shard)]
            gauges["delayq_scheduled"].add_metric(shard, s.scheduled)
            gauges["delayq_due"].add_metric(shard, s.due)
            gauges["delayq_leased"].add_metric(shard, s.leased)
            gauges["delayq_dead"].add_metric(shard, s.dead)
            gauges["delayq_parked"].add_metric(shard, s.parked)
            gauges["delayq_oldest_overdue_seconds"].add_metric(shard, s.oldest_overdue_ms / 1000)
        yield from gauges.values()


class SlotCollector(Collector):
    """Gauges of a store's concurrency slots at scrape time: items running (holding a slot) and
    waiting, and the runtime limit, of the busiest ``max_keys`` slot keys (running plus waiting),
    and the same counts summed over every key.

    The keys are listed by a SCAN at most every ``key_ttl`` seconds (:class:`SlotKeyList`); each
    scrape reads the listed keys' counts in pipelined rounds (three reads a key). A failure (the
    store away, a Redis user without SCAN or GET) yields ``delayq_slots_up 0`` and no slot gauges,
    never a failed scrape, and the store's other gauges are unaffected.
    """

    def __init__(self, store: DelayStore, *, max_keys: int = DEFAULT_SLOT_KEYS, key_ttl: float = KEY_LIST_TTL) -> None:
        self.store = store
        self.max_keys = max_keys
        self.keys = SlotKeyList(store, ttl=key_ttl)
        self.errors = 0

    def collect(self) -> Iterator[Metric]:
        prefix = self.store.config.prefix
        try:
            board = self.store.slot_board(self.keys(), limit=self.max_keys)
        except _STORE_ERRORS as exc:
            self.errors += 1
            _unread("the slot keys", "the slot gauges need SCAN and GET", "--slot-keys 0", exc)
            board = None
        yield from _scrape_health(prefix, ("delayq_slots_up", "delayq_slot_scrape_errors"), "the slot keys",
                                  board is not None, self.errors)  # fmt: skip
        if board is None:
            return
        per_key = ["prefix", "key"]
        in_use = GaugeMetricFamily("delayq_slots_in_use", "Items of the slot key holding a slot.", labels=per_key)
        waiting = GaugeMetricFamily("delayq_slot_waiting", "Items of the slot key waiting for a slot.", labels=per_key)
        limit = GaugeMetricFamily(
            "delayq_slot_limit", "The slot key's limit set at runtime (none: the items' own).", labels=per_key
        )
        for s in board.slots:
            in_use.add_metric([prefix, s.key], s.running)
            waiting.add_metric([prefix, s.key], s.waiting)
            if s.limit is not None:
                limit.add_metric([prefix, s.key], s.limit)
        totals = (
            ("delayq_slot_keys", "Slot keys in use (holds, a line or a limit), named or not.", board.keys),
            ("delayq_slots_in_use_all_keys", "Items holding a slot, over every slot key.", board.running),
            ("delayq_slot_waiting_all_keys", "Items waiting for a slot, over every slot key.", board.waiting),
        )
        for name, doc, n in totals:
            family = GaugeMetricFamily(name, doc, labels=["prefix"])
            family.add_metric([prefix], n)
            yield family
        yield from (in_use, waiting, limit)


class GroupCollector(Collector):
    """Gauges of a store's groups at scrape time: running, parked, limit, rate (per second),
    weight, paused and throttled of the ``max_groups`` busiest groups (running plus parked), and
    the same summed over every other group under ``group="(other)"`` (limits, rates and weights
    of the groups that have one; paused and throttled count the groups held), so the sums of a
    gauge over its series are the store's totals however many groups there are.

    The groups are listed by a SCAN at most every ``key_ttl`` seconds (:class:`GroupKeyList`; 30 s
    as the slot keys', so a hung store costs a scrape one read's timeout more, not a SCAN's too);
    each scrape reads the listed groups' statuses in pipelined rounds. A failure (the store
    away, a Redis user without SCAN) yields ``delayq_groups_up 0`` and no group gauges, never a
    failed scrape; the store's other gauges are unaffected.
    """

    GAUGES = (
        ("delayq_group_running", "Items of the group holding a place in its limit: running, or released."),
        ("delayq_group_parked", "Items waiting in the group's lines, every shard."),
        ("delayq_group_limit", "The group's limit set at runtime (no series: none set)."),
        ("delayq_group_rate", "The group's rate set at runtime, in items per second (no series: none set)."),
        ("delayq_group_weight", "The group's weight set at runtime (no series: none set, which is 1)."),
        ("delayq_group_paused", "1 while an operator has paused the group, else 0 (other: how many)."),
        ("delayq_group_throttled", "1 while a worker's throttle holds the group, else 0 (other: how many)."),
    )

    def __init__(self, store: DelayStore, *, max_groups: int = DEFAULT_GROUPS, key_ttl: float = KEY_LIST_TTL):
        self.store = store
        self.max_groups = max_groups
        self.keys = GroupKeyList(store, ttl=key_ttl)
        self.errors = 0

    def collect(self) -> Iterator[Metric]:
        prefix = self.store.config.prefix
        try:
            statuses = busiest_first(self.store.group_statuses(self.keys()))
            now = self.store.clock()
        except _STORE_ERRORS as exc:
            self.errors += 1
            _unread("the groups", "the group gauges need SCAN and the groups' reads", "--groups 0", exc)
            statuses = None
        yield from _scrape_health(prefix, ("delayq_groups_up", "delayq_group_scrape_errors"), "the groups",
                                  statuses is not None, self.errors)  # fmt: skip
        if statuses is None:
            return
        count = GaugeMetricFamily("delayq_groups", "Groups in use (holds, a line or a policy).", labels=["prefix"])
        count.add_metric([prefix], len(statuses))
        yield count
        families = {name: GaugeMetricFamily(name, doc, labels=["prefix", "group"]) for name, doc in self.GAUGES}
        # a group named "(other)" itself is never named: its series would be the sums' twin
        named = [s for s in statuses if s.key != OTHER_GROUPS][: self.max_groups]
        chosen = {s.key for s in named}
        rest = [s for s in statuses if s.key not in chosen]
        for status in named:
            for name, value in _group_values(status, now).items():
                if value is not None:
                    families[name].add_metric([prefix, status.key], value)
        others = [_group_values(s, now) for s in rest]
        for name, family in families.items():
            values = [v for v in (o[name] for o in others) if v is not None]
            if values:
                family.add_metric([prefix, OTHER_GROUPS], sum(values))
        yield from families.values()


def _unread(what: str, needs: str, off: str, exc: Exception) -> None:
    """Log a scrape that could not read ``what`` (the collector's gauges are left out)."""
    log.warning(
        "cannot read %s (%s: %s): %s on the store (`delayq exporter %s` turns them off)",
        what, type(exc).__name__, exc, needs, off,
    )  # fmt: skip


def _scrape_health(prefix: str, names: tuple[str, str], what: str, read: bool, errors: int) -> Iterator[Metric]:
    """A collector's two health series: ``<up>`` (1 if this scrape read ``what``) and the count of
    scrapes that could not."""
    up = GaugeMetricFamily(names[0], f"1 if the last scrape read {what}, else 0.", labels=["prefix"])
    up.add_metric([prefix], 1 if read else 0)
    failed = CounterMetricFamily(names[1], f"Scrapes that could not read {what}.", labels=["prefix"])
    failed.add_metric([prefix], errors)
    yield from (up, failed)


def _group_values(status: GroupStatus, now_ms: int) -> dict[str, float | None]:
    """A group's value of each of :attr:`GroupCollector.GAUGES` (None: no series, a part not set)."""
    policy = status.policy
    return {
        "delayq_group_running": status.running,
        "delayq_group_parked": status.parked,
        "delayq_group_limit": policy.limit,
        "delayq_group_rate": None if policy.rate is None else rate_per_second(policy.rate),
        "delayq_group_weight": policy.weight,
        "delayq_group_paused": 1 if policy.paused else 0,
        "delayq_group_throttled": 1 if throttled(status, now_ms) else 0,
    }


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> None:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread.

    Raises:
        ConfigError: the address cannot be listened on (in use, not ours, not resolvable).
    """
    try:
        start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}: choose another port") from exc
    log.info("metrics on http://%s:%d/metrics", host, port)
