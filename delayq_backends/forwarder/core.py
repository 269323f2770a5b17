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
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..audit import AuditSink
from ..flow import FlowGate
from ..models import Claim
from ..pauses import TargetPauses
from ..store import DelayStore
from ..targets import Target
from ..timeutil import Clock
from .backoff import OutageBackoff, ShardBackoff
from .context import Context
from .groups import GroupHook, ReleaseStep
from .heartbeat import Heartbeat
from .hooks import FlowHook, LosslessHook, PassHook, PeriodicHook
from .loop import Loop, check_targets
from .observers import AuditHook, MetricsHook, StatsHook
from .overlap import Sweeper
from .parking import ParkedRecheck
from .passes import Pass
from .prepare import Preparer
from .publish import Publisher
from .settings import ForwarderSettings
from .settle import Settler
from .stats import ForwarderStats
from .tracing import ForwardTracer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from ..metrics import ForwarderMetrics

__all__ = ["Forwarder"]

log = logging.getLogger("delayq.forwarder")


class Forwarder:
    """Moves due items from a :class:`DelayStore` to their targets.

    Built as ``Forwarder(store, targets, settings)`` or ``Forwarder(store, targets, batch=...,
    ...)``: the keywords are the fields of :class:`ForwarderSettings` (validated there), plus
    ``audit`` (where to log one record per forwarded item; it must not block, and its failures
    are logged, never raised) and ``metrics`` (Prometheus metrics to update), off by default;
    ``tracer_provider`` is where the forward's spans go (docs/tracing.md), by default
    OpenTelemetry's global one when configured.

    It reads the store's clock (``store.clock``, the one its leases, periodic firing and targets
    read too: a test's fake clock is given to the store, never here) and composes a
    :class:`Heartbeat`, the :class:`Pass` (with its hooks: periodic waits, flow control, lossless
    mode, concurrency slots), the :class:`Sweeper` that overlaps claims with publishes, and the
    :class:`Loop`.
    """

    def __init__(
        self,
        store: DelayStore,
        targets: Mapping[str, Target] | Sequence[Target],
        settings: ForwarderSettings | None = None,
        *,
        audit: AuditSink | None = None,
        metrics: ForwarderMetrics | None = None,
        tracer_provider: TracerProvider | None = None,
        **kwargs: Any,
    ) -> None:
        if settings is None:
            settings = ForwarderSettings(**kwargs)
        elif kwargs:
            settings = replace(settings, **kwargs)
        if not isinstance(targets, Mapping):
            targets = {t.kind: t for t in targets}
        self.settings = settings
        self.store = store
        # a dict as given, not copied: the testing helper's knows every kind
        self.targets = targets if isinstance(targets, dict) else dict(targets)
        self.batch = settings.batch
        self.name = settings.name or f"{socket.gethostname()}:{os.getpid()}"
        self.audit = audit
        self.metrics = metrics
        self.stats = ForwarderStats()
        self.clock: Clock = store.clock
        self.flow = FlowGate(settings.flow, store, self.targets)
        max_backoff_ms = int(settings.max_outage_backoff * 1000)
        #: targets paused by a configuration error (a refused login, a missing module)
        self.pauses = TargetPauses(max_backoff_ms, None if metrics is None else metrics.observe_pause)
        self._stop = threading.Event()
        self.shards = ShardBackoff(max_backoff_ms, self.clock, self.stats)
        self.outages = OutageBackoff(settings.max_outage_backoff, self._stop)
        lease_ms = store.config.lease_ms
        self.heartbeat = Heartbeat(lease_ms, self.clock)
        retry_ms, max_retry_ms = int(settings.retry_delay * 1000), int(settings.max_retry_delay * 1000)
        hooks: list[PassHook] = [PeriodicHook(retry_ms, max_retry_ms), FlowHook(self.flow, metrics)]
        if settings.keep_ms:
            hooks.append(LosslessHook(settings.keep_ms, store, self.targets, self.stats, metrics))
        #: last: only what every other hook let go takes a slot of its group
        self.slots = GroupHook(store, self.targets, int(settings.slot_start_window * 1000), self.stats)
        hooks.append(self.slots)
        hooks.append(StatsHook(self.stats))  # the observers of each publish call
        hooks += [MetricsHook(metrics)] if metrics is not None else []
        hooks += [AuditHook(audit, self.name)] if audit is not None else []
        hooks += [tracer] if (tracer := ForwardTracer.start(self.targets, tracer_provider)) is not None else []
        self.lines = ReleaseStep(store, self.slots, self.clock, self.stats, settings.batch)
        ctx = Context(store, self.targets, hooks, self.clock, self.stats, metrics, self.name, retry_ms, max_retry_ms)
        publisher = Publisher(ctx, self.heartbeat, self.pauses, max(100, lease_ms // 5))
        stages = (Preparer(ctx), publisher, Settler(ctx))
        self.pass_ = Pass(ctx, settings.batch, self.heartbeat, stages, self.shards, self.outages, self.lines)
        self.sweeper = Sweeper(self.pass_, self._stop, settings.overlap)
        backoffs = (self.shards, self.outages)
        self.recheck = ParkedRecheck(ctx)
        self.loop = Loop(
            ctx, self._sweep, backoffs, self.pauses, settings.poll_interval, self._stop,
            meta_watch=settings.meta_watch, recheck=self.recheck, lines=self.lines,
        )  # fmt: skip

    def server_now_ms(self) -> int:
        """The store's clock (:class:`~delayq_backends.timeutil.ServerClock`, or a test's fake one)."""
        return self.clock()

    # -- one step ---------------------------------------------------------------------------

    def run_once(self) -> int:
        """Deliver what is due now, one batch per due shard per pass, until nothing is due.

        Returns how many items were claimed. Tests drive the forwarder through this.
        """
        return self._sweep(self.loop.heads())

    def _sweep(self, heads: list[int | None]) -> int:
        claimed = self.sweeper.sweep(self.shards.due(heads))
        self.slots.fold(self.clock())
        return claimed

    def run_until_idle(self) -> ForwarderStats:
        """Burst mode (arq's ``run_check``): forward everything due now by this forwarder's
        clock, return when nothing is, with what this call did. No signals, sleep or pub/sub.

        A pass that settles nothing (every item claimed was released again: a broker outage)
        ends the call instead of claiming the same items in a loop; they wait for the next one.
        """
        before = self.stats.snapshot()
        while self.recheck.run():  # parked items it can deliver now, whose look is due
            pass
        while not self._stop.is_set():
            due = self.shards.due(self.loop.heads())
            settled = self.stats.settled()
            if not due or self.pass_.run(due)[0] == 0 or self.stats.settled() == settled:
                break
        return self.stats.since(before)

    def deliver(self, claim: Claim) -> None:
        """Publish a claim's items, then ack, fail or release each as its target reports.

        Raises what handling the claim raised (a pass sets the shard aside for it)."""
        self.pass_.deliver_one(claim)

    # -- the loop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its in-flight batches and return."""
        self._stop.set()

    def run(self, *, install_signals: bool = True, log_every: float = 10.0) -> ForwarderStats:
        """Forward until :meth:`stop` or SIGTERM/SIGINT; returns the totals (:class:`Loop`)."""
        self.store.check_meta()  # a forwarder with the wrong shard count refuses to start
        self.check_targets()
        log.info(
            "forwarder %s started: %d shards, batch %d, targets %s",
            self.name,
            self.store.shards,
            self.batch,
            sorted(self.targets),
        )
        try:
            self.loop.run(install_signals=install_signals, log_every=log_every, summary=self._log_summary)
        finally:
            self.sweeper.close()
            self.heartbeat.close()
            self._log_summary()
        return self.stats

    def check_targets(self) -> None:
        """Connect and authenticate to every target that can before claiming anything
        (:func:`~.loop.check_targets`)."""
        check_targets(self.targets)

    def _log_summary(self) -> None:
        self.loop.log_summary(bool(self.settings.keep_ms))
