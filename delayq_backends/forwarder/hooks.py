"""Hooks of the pass: features that act on some items at stage boundaries, not branches through it.

A hook sees each claim at these points of :class:`~.passes.Pass` and answers with a typed
:class:`~.records.Verdict` (or an :class:`~delayq_backends.flow.Admission`), which the pass applies:

- :meth:`PassHook.prepare`, once the claim is decoded: items to skip, fail, defer, or keep once published;
- :meth:`PassHook.admit`, just before each publish call: the deliveries that may go now (the others wait);
- :meth:`PassHook.sent`, just after it: what the target took;
- :meth:`PassHook.reported`, once the call's report is final: for observers (stats, metrics, audit, tracing);
- :meth:`PassHook.failed`, for the failures the targets reported: those the hook defers instead;
- :meth:`PassHook.settled`, once the claim's acks are in.

The next per-key feature, concurrency slots (at most N tasks of a key running), is one more hook:
``admit`` takes a slot per delivery whose key has one free (``take_key_tokens`` style, one round
trip per call) and defers the others to ``later``; ``sent`` gives back the slots of deliveries
the target did not take; the worker returns its slot when the task finishes. Set ``admits`` so
each claim is published by its own call, after the publishes its admit counted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from ..flow import Admission, FlowGate
from ..models import Claim, DeliveryFailure, FailedDelivery, RunRef
from ..store import DelayStore
from ..targets import Delivery, PublishReport, RunTarget, Target
from .records import Prepared, Published, Sent, Verdict
from .stats import ForwarderStats

if TYPE_CHECKING:
    from ..metrics import ForwarderMetrics

__all__ = ["FlowHook", "LosslessHook", "PassHook", "PeriodicHook"]

log = logging.getLogger("delayq.forwarder")

#: Lossless mode doubles the window per claim of an item, at most this often (64 windows).
MAX_WINDOW_DOUBLINGS = 6
_NOTHING = Verdict()


class PassHook(Protocol):
    """A feature of the pass; every method has a default that does nothing, so a hook defines
    only the stages it acts at."""

    #: whether :meth:`admit` may hold deliveries back: each claim is then published by its own
    #: call, so an admit counts the publishes before it
    admits: bool = False

    def prepare(self, claim: Claim, groups: Mapping[str, list[Delivery]]) -> Verdict:
        """The claim's deliveries per target kind, decoded; what to do with some of them."""
        return _NOTHING

    def admit(self, kind: str, deliveries: list[Delivery], now_ms: int) -> Admission:
        """Of ``deliveries`` about to be published to target ``kind``: those that may go now."""
        return Admission(deliveries, [])

    def sent(self, kind: str, deliveries: Sequence[Delivery], published: Sequence[str]) -> None:
        """One publish call's deliveries, and the ids of them the target took."""
        return None

    def reported(self, sent: Sent) -> None:
        """One publish call's final report (a paused target's items moved to ``later``)."""
        return None

    def failed(self, prepared: Prepared, failures: Sequence[DeliveryFailure], now_ms: int) -> Verdict:
        """Failures a target reported for the claim: the hook's :attr:`Verdict.later` takes some over."""
        return _NOTHING

    def settled(self, published: Published) -> None:
        """The claim's acks are in (its failures, deferrals and releases come next)."""
        return None


class FlowHook(PassHook):
    """Flow control: a queue at its depth cap or rate cap holds its deliveries back (they wait in
    the store), queue by queue; the others flow."""

    def __init__(self, gate: FlowGate, metrics: ForwarderMetrics | None) -> None:
        self.gate = gate
        self.metrics = metrics
        self.admits = gate.control.active

    def admit(self, kind: str, deliveries: list[Delivery], now_ms: int) -> Admission:
        if not self.admits:
            return Admission(deliveries, [])
        by_queue: dict[str, list[Delivery]] = defaultdict(list)
        for d in deliveries:
            by_queue[d.envelope.destination].append(d)
        go: list[Delivery] = []
        later: list[tuple[str, int]] = []
        for queue, group in by_queue.items():
            admitted = self.gate.admit(kind, queue, group, now_ms)
            if self.metrics is not None and queue in self.gate.state:
                self.metrics.set_backpressure(kind, queue, self.gate.state[queue])
            go += admitted.go
            later += admitted.later
        return Admission(go, later)

    def sent(self, kind: str, deliveries: Sequence[Delivery], published: Sequence[str]) -> None:
        self.gate.sent(kind, deliveries, published)


class PeriodicHook(PassHook):
    """Periodic entries: a run the broker refused (a failure that ``waits``) is given back with
    no attempt counted, to be tried again after as long as the item has waited so far (between
    the retry delay and its cap: a back-off that doubles with no count kept), so a schedule never
    ends in the dead letters because its broker failed for a while."""

    def __init__(self, retry_delay_ms: int, max_retry_delay_ms: int) -> None:
        self.retry_delay_ms = retry_delay_ms
        self.max_retry_delay_ms = max_retry_delay_ms

    def failed(self, prepared: Prepared, failures: Sequence[DeliveryFailure], now_ms: int) -> Verdict:
        waiting = [f for f in failures if f.waits]
        if not waiting:
            return _NOTHING
        ready = {item.id: item.ready_ms for item in prepared.lease.items}
        later = []
        for f in waiting:
            delay = min(self.max_retry_delay_ms, max(self.retry_delay_ms, now_ms - ready[f.id]))
            log.error("periodic item %r could not be fired (%s); it waits %.0f s, no attempt counted", f.id, f.error,
                      delay / 1000)  # fmt: skip
            later.append((f.id, now_ms + delay))
        return Verdict(later=tuple(later))


class LosslessHook(PassHook):
    """Lossless mode (needs workers with dedupe on): each published item whose target names its
    run (:class:`~delayq_backends.targets.RunTarget`: Celery tasks) is kept in the store for a
    window instead of deleted. When it comes due again, it is deleted if its run's "started"
    record exists, else published again (the window doubles per claim of the item, up to 64
    windows), so a message the broker lost becomes a late run. An item claimed ``max_attempts``
    times with no start recorded goes to the dead letters instead of being published once more."""

    def __init__(
        self,
        keep_ms: int,
        store: DelayStore,
        targets: Mapping[str, Target],
        stats: ForwarderStats,
        metrics: ForwarderMetrics | None,
    ) -> None:
        self.keep_ms = keep_ms
        self.store = store
        self.run_targets = {kind: t for kind, t in targets.items() if isinstance(t, RunTarget)}
        self.stats = stats
        self.metrics = metrics

    def prepare(self, claim: Claim, groups: Mapping[str, list[Delivery]]) -> Verdict:
        runs: dict[str, RunRef] = {}
        for kind, deliveries in groups.items():
            if (target := self.run_targets.get(kind)) is not None:
                runs.update((d.id, ref) for d in deliveries if (ref := target.run_of(d)) is not None)
        if not runs:
            return _NOTHING
        ran = self.store.started(claim.shard, list(runs.values()))
        spent = self._never_started(claim, runs, ran)
        gone = ran | {f.id for f in spent}
        keep = {i.id: self._window_ms(i.attempts) for i in claim.items if i.id in runs and i.id not in gone}
        return Verdict(skip=frozenset(ran), failures=spent, keep=keep)

    def _window_ms(self, attempts: int) -> int:
        """The window for an item published on its ``attempts``-th claim: doubled per earlier
        claim up to 64 times, so a worker fleet down for a while (a deploy, a crash) costs a few
        re-publishes per task, not one per window."""
        return self.keep_ms << min(MAX_WINDOW_DOUBLINGS, max(0, attempts - 1))

    def _never_started(self, claim: Claim, runs: Mapping[str, RunRef], ran: set[str]) -> tuple[FailedDelivery, ...]:
        """The items claimed ``max_attempts`` times with no start recorded, as failures for the
        dead letters. Each publish counts an attempt, so a task no worker ever starts (expired,
        unknown to the workers, workers without dedupe) is not published again forever."""
        limit = self.store.config.max_attempts
        return tuple(
            FailedDelivery(
                item.id,
                None,
                f"lossless mode: claimed {item.attempts} times (each publish counts one) and no worker has recorded "
                "its start: do the workers run with delayq_dedupe? did the task expire, or is it unknown to them? "
                "(requeue it once fixed)",
            )
            for item in claim.items
            if item.id in runs and item.id not in ran and 1 < limit <= item.attempts
        )

    def settled(self, published: Published) -> None:
        """Keep the published items of the lease's ``keep_windows`` (those a ClaimTarget acked in
        its transaction are kept already), and delete those found started."""
        lease, report, ran = published.lease, published.report, published.prepared.skipped
        keep = lease.keep_windows
        pre_acked = set(report.acked)
        kept = [i for i in report.published if i in keep]
        n_kept = lease.keep({i: keep[i] for i in kept if i not in pre_acked}) + len(pre_acked & keep.keys())
        confirmed = lease.ack(sorted(ran)) if ran else 0
        self.stats.acked += confirmed
        self.stats.kept += n_kept
        self.stats.confirmed += confirmed
        if self.metrics is not None and (kept or ran):
            self.metrics.observe_lossless(published.prepared.labels, kept=kept, found_started=sorted(ran))


def without_kept(report: PublishReport, keep: Mapping[str, int]) -> PublishReport:
    """``report`` without the kept ids: what the metrics count as acked."""
    if not keep or not any(i in keep for i in report.published):
        return report
    return replace(
        report,
        published=[i for i in report.published if i not in keep],
        acked=[i for i in report.acked if i not in keep],
    )
