"""The forwarder: claim due items, publish them to their broker, then ack.

No leader and no lock: any number of forwarders run side by side, and the lease makes each
claim exclusive. A crash between publish and ack re-delivers the item after its lease
(at-least-once, same id); a crash before publish loses nothing.

Nothing read from Redis or the wake channel can stop it: a bad value is logged, a shard whose
handling raises is set aside with back-off while the others flow, and the loop only ends on
:meth:`Forwarder.stop` (SIGTERM/SIGINT).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis

from .audit import FORWARDED, AuditRecord, AuditSink
from .envelope import Envelope
from .errors import ConfigError, EnvelopeError, NewerFormatError
from .flow import FlowControl, FlowGate
from .models import Claim, DeliveryFailure, FailedDelivery, RunRef
from .outages import CONNECTION_ERRORS, config_error, config_fix, gives_back
from .pauses import TargetPauses
from .percentile import percentile
from .store import DelayStore, Lease
from .targets import Buried, BuryTarget, CheckedTarget, ClaimTarget, Delivery, PublishReport, RunTarget, Target

if TYPE_CHECKING:
    from .metrics import ForwarderMetrics, Labels

__all__ = ["DEFAULT_LOSSLESS_WINDOW", "Forwarder", "ForwarderStats"]

log = logging.getLogger("delayq.forwarder")

#: Most items one claim takes; claim.lua cuts a bigger limit to it (MAX_CLAIM), since a claim blocks
#: its Redis while it runs.
MAX_BATCH = 10_000

#: How often the forwarder re-reads the server's clock (TIME); in between it advances the last
#: reading with the monotonic clock, so a step of the local wall clock changes nothing.
CLOCK_RESAMPLE_S = 60.0
#: Lossless mode's window unless set: a task not started this long after its publish is published
#: again. Above a healthy broker queue's wait, far below the workers' dedupe TTL (a day).
DEFAULT_LOSSLESS_WINDOW = 60.0
#: Lossless mode doubles the window per claim of an item, at most this often (64 windows).
MAX_WINDOW_DOUBLINGS = 6
#: How long an item of an envelope format newer than this forwarder reads waits before it is
#: claimed again (by any forwarder): a newer forwarder running beside this one delivers it, and an
#: older one alone looks at it this often, not in a busy loop. Not an attempt: it never ends in the
#: dead letters for the forwarder's age.
NEWER_FORMAT_DELAY_MS = 5_000
#: Errors that mean the store is unreachable or failing as a whole: the loop backs off.
_STORE_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, redis.RedisError)
#: Shortest gap between two log lines about garbage on the wake channel (anyone allowed to
#: PUBLISH there could otherwise flood the log).
_BAD_WAKE_LOG_EVERY_S = 10.0
#: How often a running forwarder re-reads the store's metadata to see it was not changed under it.
_META_WATCH_S = 5.0

T = TypeVar("T")


@dataclass
class _Held:
    """A lease being published: until when its items are ours (moved by extensions), and the
    ids found no longer ours (acked, cancelled or claimed again after the lease ran out)."""

    lease: Lease
    deadline_ms: int
    lost: set[str] = field(default_factory=set)


@dataclass
class _Published:
    """A claim of a pass, prepared to publish, then published and waiting for its settle: its
    publishes share a call per target and its acks a round trip with the pass's other claims
    (:meth:`Forwarder._publish_all`, :meth:`Forwarder._settle_all`)."""

    held: _Held
    report: PublishReport
    failures: list[FailedDelivery]
    labels: dict[str, Labels]
    later: list[tuple[str, int]]
    ran: set[str]
    started: float
    #: the deliveries to publish, per target kind
    groups: dict[str, list[Delivery]] = field(default_factory=dict)

    @property
    def lease(self) -> Lease:
        return self.held.lease

    def to_ack(self) -> list[str]:
        """The published ids to delete: not acked by a ClaimTarget in its transaction already,
        nor kept awaiting their start (lossless mode)."""
        pre_acked, keep = set(self.report.acked), self.lease.keep_windows
        return [i for i in self.report.published if i not in pre_acked and i not in keep]


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
    #: items held back by flow control (a full or rate-capped queue) or of a newer envelope
    #: format, given back to the store
    deferred: int = 0
    #: of ``deferred``: items of an envelope format newer than this forwarder reads
    newer_format: int = 0
    #: of ``deferred``: items of a kind this forwarder has no target for
    no_target: int = 0
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
        """Items acked, retried, dead-lettered or deferred so far: progress, unlike releases."""
        return self.acked + self.kept + self.retried + self.dead + self.deferred + self.errors

    def since(self, before: ForwarderStats) -> ForwarderStats:
        """What happened after ``before`` (a :meth:`snapshot`): counts, and the lateness of
        the items forwarded since."""
        counts = {
            f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self) if f.name != "lateness_ms"
        }
        recent = list(self.lateness_ms)[len(self.lateness_ms) - min(len(self.lateness_ms), counts["forwarded"]) :]
        return ForwarderStats(**counts, lateness_ms=deque(recent, maxlen=self.lateness_ms.maxlen))


class Forwarder:
    """Moves due items from a :class:`DelayStore` to their targets.

    Args:
        store: the delay store.
        targets: the targets this forwarder delivers to, keyed by ``Target.kind``.
        batch: items per claim; a claim blocks Redis while it runs, so keep it modest.
        poll_interval: longest sleep, in seconds, so a lost wake-up never strands an item.
        retry_delay: first delay before a failed item is retried; doubles per attempt.
        max_retry_delay: cap of that delay.
        max_outage_backoff: longest pause while a broker or the store is unreachable.
        audit: where to log one record per forwarded item (off by default); it must not block,
            and its failures are logged, never raised.
        metrics: Prometheus metrics to update (off by default, and then nothing is counted).
        flow: back-pressure and rate caps per target queue (off by default); :attr:`flow`
            ``.state`` tells which depth-capped queues are paused.
        lossless_window: lossless mode (off by default; needs workers with dedupe on): seconds
            a published item is kept awaiting its start. When it comes due again, it is deleted
            if its run's "started" record exists, else published again (and the window doubles
            per claim of the item, up to 64 windows), so a message the broker lost becomes a late run.
            Only items whose target names their run
            (:class:`~delayq_backends.targets.RunTarget`: Celery tasks) are kept.
    """

    def __init__(
        self,
        store: DelayStore,
        targets: Mapping[str, Target] | Sequence[Target],
        *,
        batch: int = 200,
        poll_interval: float = 1.0,
        retry_delay: float = 1.0,
        max_retry_delay: float = 300.0,
        max_outage_backoff: float = 10.0,
        name: str | None = None,
        audit: AuditSink | None = None,
        metrics: ForwarderMetrics | None = None,
        flow: FlowControl | None = None,
        lossless_window: float | None = None,
    ) -> None:
        if not isinstance(targets, Mapping):
            targets = {t.kind: t for t in targets}
        if not 1 <= batch <= MAX_BATCH:
            raise ConfigError(
                f"batch={batch}: use 1..{MAX_BATCH} (100-500 is best: a claim blocks Redis while it runs)"
            )
        if lossless_window is not None and not 1 <= lossless_window <= 86400:
            raise ConfigError(
                f"lossless_window={lossless_window!r}: use seconds from 1 to 86400, longer than a message "
                "waits in the broker's queue and shorter than the workers' dedupe TTL"
            )
        self.store = store
        self.targets = dict(targets)
        #: lossless mode's window in ms (0: off)
        self.keep_ms = 0 if lossless_window is None else int(lossless_window * 1000)
        self.batch = batch
        self.poll_interval = poll_interval
        self.retry_delay_ms = int(retry_delay * 1000)
        self.max_retry_delay_ms = int(max_retry_delay * 1000)
        self.max_outage_backoff = max_outage_backoff
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.audit = audit
        self.metrics = metrics
        self.stats = ForwarderStats()
        self.flow = FlowGate(flow or FlowControl(), store, self.targets)
        #: targets paused by a configuration error (a refused login, a missing module)
        self.pauses = TargetPauses(int(max_outage_backoff * 1000), None if metrics is None else metrics.observe_pause)
        #: the targets that take the batch's lease (ClaimTarget), found once: an isinstance of a
        #: runtime-checkable protocol inspects every member of it
        self._lease_takers = {kind for kind, target in self.targets.items() if isinstance(target, ClaimTarget)}
        self._buriers = {kind for kind, target in self.targets.items() if isinstance(target, BuryTarget)}
        self._stop = threading.Event()
        self._outage_backoff = 0.0
        #: server TIME at the last reading and time.monotonic() then, as one tuple: the lease
        #: heartbeat's thread reads the clock too
        self._clock: tuple[int, float] | None = None
        self._rng = random.Random()
        self._set_aside_until: dict[int, tuple[int, int]] = {}  # shard -> (server ms, back-off ms)
        lease_ms = store.config.lease_ms
        #: a batch is only published with at least this much of its lease left (else extended first)
        self.lease_margin_ms = max(100, lease_ms // 5)
        self._heartbeat = _Heartbeat(lease_ms, self.server_now_ms)
        self._bad_wakes = 0
        self._bad_wake_logged = 0.0
        #: envelope formats met that are newer than this forwarder reads: each is logged once
        self._newer_formats: set[int] = set()
        #: item kinds met with no target here: each is logged once
        self._missing_targets: set[str] = set()

    # -- one step ---------------------------------------------------------------------------

    def run_once(self) -> int:
        """Deliver what is due now, one batch per due shard per pass, until nothing is due.

        Returns how many items were claimed. Tests drive the forwarder through this.
        """
        return self._sweep(self._heads())

    def _heads(self) -> list[int | None]:
        """The store's heads; if they cannot be read as numbers (a score written straight into
        Redis), every shard reads as due, so each is tried and a bad one is set aside alone."""
        try:
            return self.store.heads()
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:
            log.error("cannot read the shards' heads (%s: %s); trying every shard", type(exc).__name__, exc)
            return [0] * self.store.shards

    def run_until_idle(self) -> ForwarderStats:
        """Burst mode (arq's ``run_check``): forward everything due now by this forwarder's
        clock, return when nothing is, with what this call did. No signals, sleep or pub/sub.

        A pass that settles nothing (every item claimed was released again: a broker outage)
        ends the call instead of claiming the same items in a loop; they wait for the next one.
        """
        before = self.stats.snapshot()
        while not self._stop.is_set():
            due = self._due(self._heads())
            settled = self.stats.settled()
            if not due or self._pass(due)[0] == 0 or self.stats.settled() == settled:
                break
        return self.stats.since(before)

    def _due(self, heads: list[int | None]) -> list[int]:
        """The shards due now and not set aside, from a random one on, so no shard goes first always."""
        now = self.server_now_ms()
        due = [s for s, head in enumerate(heads) if head is not None and head <= now and not self._aside(s, now)]
        start = self._rng.randrange(len(heads))
        due.sort(key=lambda s: (s - start) % len(heads))
        return due

    def _sweep(self, heads: list[int | None]) -> int:
        """:meth:`run_once` on heads already read, so the idle loop reads them once per wake."""
        due = self._due(heads)
        claimed = 0
        while due and not self._stop.is_set():
            got, due = self._pass(due)
            claimed += got
        return claimed

    def _pass(self, due: list[int]) -> tuple[int, list[int]]:
        """One batch from each shard of ``due``, all claimed in one round trip, published with one
        call per target, then all acked in one round trip: the items claimed, and the shards
        whose batch came back full (more may be due there).

        A publish and an ack round trip per shard made a pass over 16 shards cost ~7 ms, most of
        the lateness at a high rate. Every batch claimed is delivered, even after :meth:`stop`: they
        are in flight. A batch published late in the pass keeps its items ours by the lease
        check before its publish (:meth:`_still_ours` extends a lease near its end), and every
        batch published is held by the heartbeat until the pass's acks are in."""
        started = time.perf_counter()
        claims = self.store.claim_many(due, limit=self.batch)  # an outage raises: the loop backs off
        if self.metrics is not None:
            self.metrics.observe_claim(time.perf_counter() - started)
        done: list[Claim] = []
        prepared: list[_Published] = []
        with self._heartbeat.holding() as held:
            for shard, claim in zip(due, claims):
                if isinstance(claim, Exception):  # a key of another type, the server at maxmemory
                    self._set_aside(shard, claim, None)
                elif not claim.items:
                    done.append(claim)
                elif isinstance(p := _shard_step(partial(self._prepare, claim, held)), Exception):
                    self._set_aside(shard, p, claim)
                else:
                    prepared.append(p)
            errors = self._publish_all(prepared)
            published = [p for p in prepared if id(p) not in errors]
            settled = self._settle_all(published)
        for p in prepared:
            if id(p) in errors:
                self._set_aside(p.lease.shard, errors[id(p)], p.lease.claim)
        for p, error in zip(published, settled):
            if error is None:
                done.append(p.lease.claim)
            else:
                self._set_aside(p.lease.shard, error, p.lease.claim)
        for claim in done:
            self._set_aside_until.pop(claim.shard, None)
        still_due = [c.shard for c in done if len(c.items) == self.batch]
        return sum(len(c.items) for c in done), still_due

    def _set_aside(self, shard: int, exc: Exception, claim: Claim | None) -> None:
        """Set a shard aside after an error that retrying at once will not fix: a Redis error
        (a key of ours holding another type, the server at maxmemory, a missing ACL permission)
        or anything else raised while handling its data (a value that cannot be decoded, a
        target's bug).

        The other shards keep flowing; this one is tried again after a back-off that doubles up
        to ``max_outage_backoff`` (a failing store, like an unreachable one, is worth retrying
        soon: a cluster mid-failover answers CLUSTERDOWN or MOVED for a few seconds). Its items
        stay where they are: leases taken before the error expire and the items are claimed
        again, each claim counting an attempt, so an item that keeps failing this way ends in
        the dead letters. One log line per error, with the claim's ids when there was a claim.
        """
        _, previous = self._set_aside_until.get(shard, (0, 0))
        cap = int(self.max_outage_backoff * 1000)
        backoff = min(cap, max(min(cap, 1000), previous * 2))
        self._set_aside_until[shard] = (self.server_now_ms() + backoff, backoff)
        self.stats.errors += 1
        ids = [item.id for item in claim.items] if claim is not None else []
        log.error(
            "shard %d: %s: %s%s; trying it again in %.0f s",
            shard,
            type(exc).__name__,
            exc,
            f" (items {', '.join(map(repr, ids[:5]))}{', ...' if len(ids) > 5 else ''})" if ids else "",
            backoff / 1000,
        )

    def _aside(self, shard: int, now: int) -> bool:
        return self._set_aside_until.get(shard, (0, 0))[0] > now

    def deliver(self, claim: Claim) -> None:
        """Publish a claim's items, then ack, fail or release each as its target reports.

        Raises what handling the claim raised (a pass sets the shard aside for it)."""
        with self._heartbeat.holding() as held:
            p = self._prepare(claim, held)
            error = self._publish_all([p]).get(id(p))
            if error is None:
                (error,) = self._settle_all([p])
        if error is not None:
            raise error

    def _prepare(self, claim: Claim, held_list: list[_Held]) -> _Published:
        """A claim's items decoded and checked (lossless mode), ready to publish; its lease joins
        ``held_list`` (the heartbeat's) until settled."""
        started = time.perf_counter()
        groups: dict[str, list[Delivery]] = defaultdict(list)
        failures: list[FailedDelivery] = []
        labels: dict[str, Labels] = {}  # of each decoded item, for the metrics (only kept with metrics)
        decoded: dict[bytes, Envelope] = {}  # one queue's jobs often share an envelope: decoded once
        later: list[tuple[str, int]] = []
        for item in claim.items:
            envelope = decoded.get(item.envelope)
            if envelope is None:
                try:
                    envelope = decoded[item.envelope] = Envelope.decode(item.envelope)
                except NewerFormatError as exc:
                    later.append(self._leave_for_newer(item.id, exc, labels))
                    continue
                except EnvelopeError as exc:
                    failures.append(FailedDelivery(item.id, None, f"corrupt envelope: {exc}"))
                    continue
                except Exception as exc:  # whatever the bytes are, one item never fails the batch
                    failures.append(FailedDelivery(item.id, None, f"corrupt envelope: {type(exc).__name__}: {exc}"))
                    continue
            if self.metrics is not None:
                labels[item.id] = (envelope.target, envelope.destination)
            if envelope.target not in self.targets:
                later.append(self._leave_for_target(item.id, envelope.target))
                continue
            groups[envelope.target].append(Delivery(item.id, envelope, item.attempts, item.ready_ms))
        report = PublishReport()
        runs = self._runs(groups)
        ran = self.store.started(claim.shard, list(runs.values())) if runs else set()
        spent = self._never_started(claim, runs, ran, failures)
        if ran or spent:  # started earlier: done; or given up on: not published again
            groups = {kind: [d for d in ds if d.id not in ran and d.id not in spent] for kind, ds in groups.items()}
        keep = {i.id: self._window_ms(i.attempts) for i in claim.items if i.id in runs and i.id not in ran | spent}
        lease = Lease(self.store, claim, keep)
        held = _Held(lease, claim.deadline_ms)
        # held until the acks are in: a pause between publish and ack must not hand the batch over
        held_list.append(held)
        return _Published(held, report, failures, labels, later, ran, started, dict(groups))

    def _leave_for_newer(self, item_id: str, exc: NewerFormatError, labels: dict[str, Labels]) -> tuple[str, int]:
        """An item written by a newer delayq (a rolling upgrade, producers first): deferred
        (attempt not counted) for a newer forwarder, as ``(id, not-before ms)``; counted, and
        logged once per format. Dead-lettering it would lose it for the forwarder's age."""
        self.stats.newer_format += 1
        if self.metrics is not None:
            labels[item_id] = self.metrics.observe_newer_format(exc.version)
        if exc.version not in self._newer_formats:
            self._newer_formats.add(exc.version)
            log.warning(
                "item %r: %s; such items are left for a newer forwarder (deferred %g s per claim, not an "
                "attempt; logged once per format)",
                item_id,
                exc,
                NEWER_FORMAT_DELAY_MS / 1000,
            )
        return item_id, self.server_now_ms() + NEWER_FORMAT_DELAY_MS

    def _leave_for_target(self, item_id: str, kind: str) -> tuple[str, int]:
        """An item of a kind this forwarder has no target for (a Celery periodic entry claimed by
        one started without ``--celery-broker``): deferred like a newer format's, for a forwarder
        that has the target; counted, logged once per kind. A configuration, not an attempt."""
        self.stats.no_target += 1
        if self.metrics is not None:
            self.metrics.observe_no_target(kind)
        if kind not in self._missing_targets:
            self._missing_targets.add(kind)
            log.warning(
                "item %r: no %r target in forwarder %s (it has %s); such items are left for a forwarder with "
                "that target (deferred %g s per claim, not an attempt; logged once per kind): start one with it",
                item_id, kind, self.name, sorted(self.targets), NEWER_FORMAT_DELAY_MS / 1000,
            )  # fmt: skip
        return item_id, self.server_now_ms() + NEWER_FORMAT_DELAY_MS

    def _publish_all(self, prepared: list[_Published]) -> dict[int, Exception]:
        """Publish the prepared claims' items with one call per target (a round trip each, not
        one per shard), and hand each claim its part of the reports. One call per claim instead
        to a :class:`ClaimTarget` (it takes one lease) and under flow control (a queue's room
        counts the publishes before). Returns the errors raised, by ``id()`` of the claim (a
        call's error counts for every claim in it: their shards are set aside)."""
        errors: dict[int, Exception] = {}
        for kind in dict.fromkeys(kind for p in prepared for kind in p.groups):
            claims = [p for p in prepared if kind in p.groups and id(p) not in errors]
            together = kind not in self._lease_takers and not self.flow.control.active
            for call in [claims] if together else [[p] for p in claims]:
                error = _shard_step(partial(self._publish_call, kind, call))
                if isinstance(error, Exception):
                    errors.update((id(p), error) for p in call)
        for p in prepared:
            if p.report.failed:
                attempts = {item.id: item.attempts for item in p.lease.items}
                p.failures += [
                    FailedDelivery(f.id, None if f.permanent else self._retry_at(attempts[f.id]), f.error)
                    for f in p.report.failed
                    if not f.waits
                ]
                p.later += self._waiting(p, [f for f in p.report.failed if f.waits])
        return errors

    def _waiting(self, p: _Published, failures: list[DeliveryFailure]) -> list[tuple[str, int]]:
        """Failures that wait (a periodic entry whose run was refused), as (id, not-before ms):
        given back with no attempt counted, to be tried again after as long as the item has
        waited so far (between the retry delay and its cap: a back-off that doubles with no
        count kept), each logged."""
        if not failures:
            return []
        now, ready = self.server_now_ms(), {item.id: item.ready_ms for item in p.lease.items}
        later = []
        for f in failures:
            delay = min(self.max_retry_delay_ms, max(self.retry_delay_ms, now - ready[f.id]))
            log.error("periodic item %r could not be fired (%s); it waits %.0f s, no attempt counted", f.id, f.error,
                      delay / 1000)  # fmt: skip
            later.append((f.id, now + delay))
        return later

    def _window_ms(self, attempts: int) -> int:
        """Lossless mode's window for an item published on its ``attempts``-th claim: the window,
        doubled per earlier claim up to 64 times, so a worker fleet down for a while (a deploy, a
        crash) costs a few re-publishes per task, not one per window."""
        return self.keep_ms << min(MAX_WINDOW_DOUBLINGS, max(0, attempts - 1))

    def _runs(self, groups: Mapping[str, list[Delivery]]) -> dict[str, RunRef]:
        """Lossless mode: the run of each delivery whose target names it (id -> run)."""
        if not self.keep_ms:
            return {}
        runs: dict[str, RunRef] = {}
        for kind, deliveries in groups.items():
            target = self.targets[kind]
            if isinstance(target, RunTarget):
                runs.update((d.id, ref) for d in deliveries if (ref := target.run_of(d)) is not None)
        return runs

    def _never_started(
        self, claim: Claim, runs: Mapping[str, RunRef], ran: set[str], failures: list[FailedDelivery]
    ) -> set[str]:
        """Lossless mode: the kept items claimed ``max_attempts`` times with no start recorded,
        added to ``failures`` (dead letters) instead of being published once more. Each publish
        counts an attempt, so a task no worker ever starts (expired, unknown to the workers,
        workers without dedupe) is not published again forever."""
        limit = self.store.config.max_attempts
        spent = [i for i in claim.items if i.id in runs and i.id not in ran and 1 < limit <= i.attempts]
        failures += [
            FailedDelivery(
                item.id,
                None,
                f"lossless mode: claimed {item.attempts} times (each publish counts one) and no worker has recorded "
                "its start: do the workers run with delayq_dedupe? did the task expire, or is it unknown to them? "
                "(requeue it once fixed)",
            )
            for item in spent
        ]
        return {item.id for item in spent}

    def _admit(self, kind: str, deliveries: list[Delivery], later: list[tuple[str, int]]) -> list[Delivery]:
        """Flow control, queue by queue: the deliveries that may go now; the others are added
        to ``later`` as (id, not-before ms), to wait in the store."""
        if not self.flow.control.active:
            return deliveries
        now = self.server_now_ms()
        by_queue: dict[str, list[Delivery]] = defaultdict(list)
        for d in deliveries:
            by_queue[d.envelope.destination].append(d)
        go: list[Delivery] = []
        for queue, group in by_queue.items():
            admitted = self.flow.admit(kind, queue, group, now)
            if self.metrics is not None and queue in self.flow.state:
                self.metrics.set_backpressure(kind, queue, self.flow.state[queue])
            go += admitted.go
            later += admitted.later
        return go

    def _still_ours(self, held: _Held, deliveries: list[Delivery], report: PublishReport) -> list[Delivery]:
        """The deliveries that may be published now: those still under our lease with at least
        :attr:`lease_margin_ms` of it left.

        A batch whose deadline is near (a stall: a GC pause, SIGSTOP, a slow flow-control probe)
        is extended first; items that are no longer ours (another forwarder took them after our
        lease ran out) are dropped, not published: publishing them would duplicate them. If
        the extension itself fails, the deliveries are given back (released), not published.
        """
        if not deliveries:
            return deliveries
        if held.deadline_ms - self.lease_margin_ms <= self.server_now_ms():
            try:
                self._heartbeat.extend(held)
            except Exception as exc:
                log.warning(
                    "shard %d: lease near its end and cannot be extended (%s: %s); giving back %d items",
                    held.lease.shard,
                    type(exc).__name__,
                    exc,
                    len(deliveries),
                )
                report.unsent += [d.id for d in deliveries]
                return []
        if not held.lost:  # the usual case: nothing taken over, no look-up per item
            return deliveries
        lost = sum(d.id in held.lost for d in deliveries)
        if lost:
            log.warning(
                "shard %d: %d items were taken over after our lease ran out; not publishing them",
                held.lease.shard,
                lost,
            )
        return [d for d in deliveries if d.id not in held.lost]

    def _publish_call(self, kind: str, claims: list[_Published]) -> None:
        """One publish call to target ``kind`` for ``claims``, each one's deliveries admitted
        (flow control) and checked still ours just before it: items taken over after our lease
        ran out are not published again. While ``kind`` is paused (a configuration error), its
        items wait in the store until the pause ends, no attempt counted."""
        until = self.pauses.until(kind, self.server_now_ms())
        if until is not None:
            for p in claims:
                p.later += [(d.id, until) for d in p.groups[kind]]
            return
        call = [
            (p, go)
            for p in claims
            if (go := self._still_ours(p.held, self._admit(kind, p.groups[kind], p.later), p.report))
        ]
        if call:
            self._publish(kind, call)

    def _publish(self, kind: str, call: list[tuple[_Published, list[Delivery]]]) -> None:
        """One publish call to target ``kind`` of the deliveries of one or more claims (one for a
        :class:`ClaimTarget`), its report split back to the claims."""
        target = self.targets[kind]
        deliveries = [d for _, ds in call for d in ds]
        part = self._isolated(kind, deliveries, call[0][0].lease)
        self.flow.sent(target.kind, deliveries, part.published)
        now = self.server_now_ms()
        cause = None if part.broker_error is None else config_error(part.broker_error)
        if cause is not None:  # not an outage: pause the target, its items wait in the store
            until, unsent = self.pauses.pause(kind, cause, now), set(part.unsent)
            for p, ds in call:
                p.later += [(d.id, until) for d in ds if d.id in unsent]
            part = replace(part, unsent=[], broker_error=None)
        elif part.broker_error is None and (part.published or part.failed):
            self.pauses.worked(kind)
        if len(part.published) == len(deliveries):  # all of them (almost always): no lookup per item
            self.stats.lateness_ms.extend(now - d.ready_ms for d in deliveries)
        else:
            ready = {d.id: d.ready_ms for d in deliveries}
            self.stats.lateness_ms.extend(now - ready[i] for i in part.published)
        if self.metrics is not None:
            self.metrics.observe_published(deliveries, part.published, now)
        if self.audit is not None and part.published:
            self._audit(self.audit, deliveries, part.published, now)
        _split(part, call)

    def _isolated(self, kind: str, deliveries: list[Delivery], lease: Lease) -> PublishReport:
        """One call to target ``kind``; if it raises, each half again, down to single items, so
        an item whose handling raises (a target's bug, a value it did not foresee) fails alone
        with the error as its reason and the rest of the call is published. An outage or a
        configuration error raised is reported as such (``unsent``), not split.

        Items a target published before raising may be published again (at-least-once, same id)."""
        target = self.targets[kind]
        try:
            if kind in self._lease_takers:  # it may ack inside its own transaction
                return cast(ClaimTarget, target).publish_claimed(deliveries, lease)
            return target.publish_many(deliveries)
        except Exception as exc:
            if gives_back(exc):
                return PublishReport(unsent=[d.id for d in deliveries], broker_error=exc)
            if len(deliveries) == 1:
                log.error("target %r raised on item %r: %s: %s", kind, deliveries[0].id, type(exc).__name__, exc)
                why = f"target {kind!r} raised {type(exc).__name__}: {exc}"
                return PublishReport(failed=[DeliveryFailure(deliveries[0].id, why)])
            log.warning(
                "target %r raised on a call of %d items (%s: %s); calling again in halves to fail only the items "
                "that raise",
                kind,
                len(deliveries),
                type(exc).__name__,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        half = len(deliveries) // 2
        first, second = (self._isolated(kind, part, lease) for part in (deliveries[:half], deliveries[half:]))
        return PublishReport(
            published=first.published + second.published,
            failed=first.failed + second.failed,
            unsent=first.unsent + second.unsent,
            broker_error=first.broker_error or second.broker_error,
            acked=first.acked + second.acked,
        )

    def _audit(self, audit: AuditSink, deliveries: list[Delivery], published: list[str], now: int) -> None:
        sent, by = set(published), self.name
        records = [
            AuditRecord(FORWARDED, d.id, d.envelope.target, d.envelope.destination, d.ready_ms, now, d.attempts, by)
            for d in deliveries
            if d.id in sent
        ]
        try:
            audit.record(records)
        except Exception:  # an audit sink must never stop forwarding
            log.exception("audit sink %r failed; forwarding goes on", audit)

    def _settle_all(self, published: list[_Published]) -> list[Exception | None]:
        """Settle published claims: the acks of all in one round trip (the usual, only step),
        then the rest claim by claim. Returns each claim's error (its shard's), or None.

        Raises:
            redis.ConnectionError, redis.TimeoutError: the store is unreachable.
        """
        acks = self.store.ack_many([(p.lease.claim, p.to_ack()) for p in published])
        errors: list[Exception | None] = []
        for p, acked in zip(published, acks):
            self.stats.batches += 1
            self.stats.forwarded += len(p.report.published)
            errors.append(acked if isinstance(acked, Exception) else _shard_step(partial(self._settle, p, acked)))
        self._back_off_if_broker_down(published)
        return errors

    def _tell_buried(self, p: _Published, ids: tuple[str, ...]) -> None:
        """Tell each :class:`BuryTarget` which of its deliveries the store just dead-lettered."""
        dead, errors = set(ids), {f.id: f.error for f in p.failures}
        for kind in self._buriers & p.groups.keys():
            letters = [Buried(d, errors[d.id]) for d in p.groups[kind] if d.id in dead]
            if not letters:
                continue
            try:
                cast(BuryTarget, self.targets[kind]).buried(letters)
            except Exception:  # the dead letters are kept: this only mirrors them
                log.exception("target %r could not record %d dead letters on its side", kind, len(letters))

    def _back_off_if_broker_down(self, published: list[_Published]) -> None:
        """One pause per pass whose publishes met an unreachable broker, after every claim of
        it is settled (its unsent items released): one publish call carries many claims, and a
        pause per claim would hold the others' leases through each."""
        down = [p.report for p in published if p.report.broker_error is not None]
        if not down:
            self._outage_backoff = 0.0
            return
        self.stats.outages += 1
        released = sum(len(r.unsent) for r in down)
        self._outage(f"broker unreachable ({down[0].broker_error}); released {released} items")

    def _settle(self, p: _Published, acked: int) -> None:
        """The rest of a claim's settle once its acks are in: lossless keeps, failures,
        deferrals, releases, metrics."""
        lease, report, failures, labels, later = p.lease, p.report, p.failures, p.labels, p.later
        acked_report = self._keep(p, acked)
        retried = buried = released = 0
        if failures:
            counts = lease.fail(failures)
            retried, buried = counts.retried, counts.buried
            self.stats.retried += retried
            self.stats.dead += buried
            for f in failures:
                log.warning("item %r failed: %s", f.id, f.error)
            if counts.buried_ids and self._buriers:
                self._tell_buried(p, counts.buried_ids)
        deferred = lease.defer(later) if later else 0
        self.stats.deferred += deferred
        if report.unsent:
            released = lease.release(report.unsent)
            self.stats.released += released
        if self.metrics is not None:
            self.metrics.observe_settled(
                lease.claim,
                labels,
                acked_report,
                failures,
                acked=acked,
                retried=retried,
                buried=buried,
                released=released,
                deferred=[i for i, _ in later],
                deferred_count=deferred,
                max_attempts=self.store.config.max_attempts,
            )
        log.debug(
            "shard %d: claimed %d, published %d, failed %d, released %d, deferred %d in %.1f ms",
            lease.shard,
            len(lease.items),
            len(report.published),
            len(failures),
            len(report.unsent),
            len(later),
            (time.perf_counter() - p.started) * 1000,
        )

    def _keep(self, p: _Published, acked: int) -> PublishReport:
        """Count the ``acked`` published items (:meth:`_Published.to_ack`), keep the others
        (lossless mode: those in the lease's ``keep_windows``), and delete those found started
        (``ran``).

        Returns the report without the kept ids (what the metrics count as acked).
        """
        lease, report, ran = p.lease, p.report, p.ran
        keep = lease.keep_windows
        pre_acked = set(report.acked)  # a ClaimTarget acked (or kept) these in its transaction
        kept = [i for i in report.published if i in keep]
        n_kept = lease.keep({i: keep[i] for i in kept if i not in pre_acked}) + len(pre_acked & keep.keys())
        confirmed = lease.ack(sorted(ran)) if ran else 0
        self.stats.acked += len(pre_acked - keep.keys()) + acked + confirmed
        self.stats.kept += n_kept
        self.stats.confirmed += confirmed
        if self.metrics is not None and (kept or ran):
            self.metrics.observe_lossless(p.labels, kept=kept, found_started=sorted(ran))
        if not kept:
            return report
        return replace(
            report,
            published=[i for i in report.published if i not in keep],
            acked=[i for i in report.acked if i not in keep],
        )

    def _retry_at(self, attempts: int) -> int:
        delay = min(self.max_retry_delay_ms, self.retry_delay_ms << min(30, max(0, attempts - 1)))
        return self.server_now_ms() + delay

    def _outage(self, why: str) -> None:
        self._outage_backoff = min(self.max_outage_backoff, max(0.2, self._outage_backoff * 2))
        pause = self._outage_backoff * (0.5 + self._rng.random() / 2)
        log.warning("%s; retrying in %.1f s", why, pause)
        self._stop.wait(pause)

    # -- clock ------------------------------------------------------------------------------

    def server_now_ms(self) -> int:
        """The store's clock: Redis TIME, read every :data:`CLOCK_RESAMPLE_S` and advanced in
        between with ``time.monotonic()``.

        Not the local wall clock plus an offset: a step of the wall clock (NTP, an operator)
        would then make items late by the step, or make the forwarder claim items that are not
        due on the server (empty claims in a loop) until the next reading.
        """
        mono = time.monotonic()
        clock = self._clock
        if clock is None or mono - clock[1] > CLOCK_RESAMPLE_S:
            server = self.store.server_time_ms()
            after = time.monotonic()
            clock = self._clock = (server, (mono + after) / 2)
            mono = after
        return clock[0] + int((mono - clock[1]) * 1000)

    # -- the loop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its in-flight batch and return."""
        self._stop.set()

    def run(self, *, install_signals: bool = True, log_every: float = 10.0) -> ForwarderStats:
        """Forward until :meth:`stop` or SIGTERM/SIGINT; returns the totals.

        Sleeps until the earliest head of all shards (capped by ``poll_interval``) and wakes
        at once when a schedule makes some shard's head earlier.
        """
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        self.store.check_meta()  # a forwarder with the wrong shard count refuses to start
        self.check_targets()
        pubsub = self._subscribe()
        last_log = last_watch = time.monotonic()
        log.info(
            "forwarder %s started: %d shards, batch %d, targets %s",
            self.name,
            self.store.shards,
            self.batch,
            sorted(self.targets),
        )
        try:
            while not self._stop.is_set():
                try:
                    heads = self._heads()
                    if self._sweep(heads) == 0:  # nothing was claimed, so these heads still hold
                        pubsub = self._sleep(pubsub, heads)
                except _STORE_ERRORS as exc:  # never die of the store: back off, retry
                    self.stats.outages += 1
                    self._outage(f"delay store unreachable or failing ({type(exc).__name__}: {exc})")
                    pubsub = self._subscribe(pubsub)
                except Exception:  # a bug or a value no check foresaw: say so once, pause, go on
                    self.stats.errors += 1
                    log.exception("forwarder loop failed; going on in %.1f s", self.poll_interval)
                    self._stop.wait(self.poll_interval)
                if time.monotonic() - last_watch >= _META_WATCH_S:
                    last_watch = time.monotonic()
                    self._watch_meta()
                if time.monotonic() - last_log >= log_every:
                    last_log = time.monotonic()
                    self._log_summary()
        finally:
            self._heartbeat.close()
            self._log_summary()
            if pubsub is not None:
                pubsub.close()
        return self.stats

    def check_targets(self) -> None:
        """Connect and authenticate to every target that can (:class:`CheckedTarget`) before
        claiming anything.

        Raises:
            ConfigError: a target's configuration is wrong (a refused login or permission, an
                unknown vhost, a missing module): one line saying what to fix. A broker that is
                only unreachable is logged; its items wait in the store until it answers.
        """
        for kind, target in self.targets.items():
            if not isinstance(target, CheckedTarget):
                continue
            try:
                target.check()
            except Exception as exc:
                cause = config_error(exc)
                if cause is not None:
                    raise ConfigError(f"cannot forward to target {kind!r}: {config_fix(cause)}") from exc
                log.warning("target %r cannot be reached yet (%s: %s); forwarding starts", kind, type(exc).__name__,
                            exc)  # fmt: skip

    def _watch_meta(self) -> None:
        """Say loudly (an error line, a metric) when the store's metadata changed under this
        forwarder; it goes on with the layout it checked at start against the shard keys."""
        try:
            drift = self.store.meta_drift()
        except _STORE_ERRORS:
            return  # an outage: the loop reports it
        if drift is not None:
            self.stats.meta_alarms += 1
            if self.metrics is not None:
                self.metrics.meta_alarms.inc()
            log.error("store metadata changed: %s", drift)

    def _subscribe(self, old: Any = None) -> Any:
        if old is not None:
            old.close()
        try:
            return self.store.subscribe_wake()
        except CONNECTION_ERRORS as exc:
            log.warning(
                "cannot subscribe to %s (%s); polling every %.1f s", self.store.wake_channel, exc, self.poll_interval
            )
            return None

    def _sleep(self, pubsub: Any, heads: list[int | None]) -> Any:
        """Wait until the earliest head is due, a wake-up says an earlier one is, or the poll.

        A schedule after ``heads`` were read is not missed: its wake-up waits in ``pubsub``.
        """
        now = self.server_now_ms()
        aside = [until for until, _ in self._set_aside_until.values() if until > now]  # ended ones: no wake-up
        waiting = (h for s, h in enumerate(heads) if h is not None and not self._aside(s, now))
        wake_at = min([now + int(self.poll_interval * 1000), *waiting, *aside])
        while not self._stop.is_set():
            remaining = (wake_at - self.server_now_ms()) / 1000
            if remaining <= 0:
                break
            if pubsub is None:
                self._stop.wait(remaining)
                break
            try:
                # short slices, so stop() (a signal) is seen within 0.1 s, not after the poll
                message = pubsub.get_message(timeout=min(remaining, 0.1))
            except CONNECTION_ERRORS:
                return self._subscribe(pubsub)
            if message and message.get("type") == "message":
                wake_at = min(wake_at, self._wake_time(message.get("data"), wake_at))
        return pubsub

    def _wake_time(self, data: Any, default: int) -> int:
        """The ready time a wake-up announces, or ``default`` if it is not one.

        Anyone who may PUBLISH on the channel can send anything; what is not a plain integer
        of ms (text, a float, bytes, 5,000 digits) is ignored and logged at debug, at most once
        every few seconds.
        """
        text = data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)
        if 0 < len(text) <= 20 and text.lstrip("-").isdigit():
            return int(text)
        self._bad_wakes += 1
        if time.monotonic() - self._bad_wake_logged >= _BAD_WAKE_LOG_EVERY_S:
            self._bad_wake_logged = time.monotonic()
            log.debug("ignored %d wake-ups that are not ms times (last: %.40r)", self._bad_wakes, data)
            self._bad_wakes = 0
        return default

    def _log_summary(self) -> None:
        s = self.stats
        log.info(
            "forwarded %d, released %d, deferred %d%s, retried %d, dead %d, outages %d, errors %d%s; "
            "lateness p50 %s ms p99 %s ms",
            s.forwarded,
            s.released,
            s.deferred,
            f" (newer envelope format {s.newer_format})" if s.newer_format else "",
            s.retried,
            s.dead,
            s.outages,
            s.errors,
            f"; lossless: kept {s.kept}, found started {s.confirmed}" if self.keep_ms else "",
            s.percentile(0.5),
            s.percentile(0.99),
        )
        if paused := self.pauses.describe():  # a pause is logged once; this says it still holds
            log.warning("%s", paused)


def _split(part: PublishReport, call: list[tuple[_Published, list[Delivery]]]) -> None:
    """Add each id of ``part`` (one publish call's report) to the report of the claim it came
    from in ``call`` (its deferrals to the claim's); a broker error to each claim of the call."""
    owner = {d.id: p.report for p, ds in call for d in ds}
    if part.later:
        claim_of = {d.id: p for p, ds in call for d in ds}
        for i, not_before in part.later:
            claim_of[i].later.append((i, not_before))
    for i in part.published:
        owner[i].published.append(i)
    for f in part.failed:
        owner[f.id].failed.append(f)
    for i in part.unsent:
        owner[i].unsent.append(i)
    for i in part.acked:
        owner[i].acked.append(i)
    if part.broker_error is not None:
        for p, _ in call:
            p.report.broker_error = p.report.broker_error or part.broker_error


def _shard_step(step: Callable[[], T]) -> T | Exception:
    """``step()``'s result, or what it raised: an error of one shard's data (a bad value, a
    script error, a bug); an outage is raised, it is not one shard's."""
    try:
        return step()
    except CONNECTION_ERRORS:
        raise  # the store is unreachable, not this shard: the loop backs off
    except Exception as exc:  # anything from data (a bad value, a script error, a bug)
        return exc


class _Heartbeat:
    """Keeps batches' items ours from publish to ack: a thread of the forwarder looks at the
    batches in hand (a pass's, acked together at its end) every sixth of the lease, and extends
    a lease (``extend.lua``) once less than half of it is left. A batch acked sooner (almost
    all) costs nothing: no lock and no wake-up per batch.

    Why extend rather than give the batch back: a publish that runs long (a RabbitMQ memory
    alarm blocking confirms, a slow broker) has often reached the broker already; giving the
    batch back would let another forwarder publish it again. Extending keeps it exclusive as
    long as this forwarder is alive; a forwarder that is stopped (SIGSTOP, a long GC pause)
    stops extending too, so its items are taken over after the lease, and on waking it finds
    them gone (:meth:`Forwarder._still_ours`) and publishes nothing twice.
    """

    def __init__(self, lease_ms: int, now_ms: Callable[[], int]) -> None:
        self.lease_ms = lease_ms
        self.now_ms = now_ms
        self.every = lease_ms / 6000
        self._closed = threading.Event()
        self._held: list[_Held] = []
        self._thread: threading.Thread | None = None

    @contextmanager
    def holding(self) -> Iterator[list[_Held]]:
        """Extend each lease added to the list yielded while the block runs (if it runs long)."""
        if self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(target=self._run, name="delayq-lease-heartbeat", daemon=True)
            self._thread.start()
        held: list[_Held] = []
        self._held = held
        try:
            yield held
        finally:
            self._held = []

    def extend(self, held: _Held) -> None:
        """Extend every item of ``held`` still ours; the others are added to ``held.lost``."""
        extension = held.lease.extend(lease_ms=self.lease_ms)
        held.lost.update({item.id for item in held.lease.items} - set(extension.held))
        held.deadline_ms = extension.deadline_ms

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._closed.wait(self.every):
            for held in list(self._held):  # a copy: the forwarder appends to it meanwhile
                if held.deadline_ms - self.now_ms() > self.lease_ms // 2:
                    continue
                try:
                    self.extend(held)
                except Exception as exc:  # the publish goes on; the pre-publish check gives back what is lost
                    log.warning("shard %d: cannot extend a lease (%s: %s)", held.lease.shard, type(exc).__name__, exc)
