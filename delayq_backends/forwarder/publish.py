"""The publish stage: prepared claims' deliveries to their targets, one call per target."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from time import time_ns
from typing import TypeVar, cast

from ..models import DeliveryFailure, FailedDelivery
from ..outages import CONNECTION_ERRORS, config_error, gives_back
from ..pauses import TargetPauses
from ..store import Lease
from ..targets import ClaimTarget, Delivery, PublishReport
from .context import Context
from .heartbeat import Heartbeat, HeldLease
from .records import Prepared, Published, Sent

__all__ = ["Publisher", "shard_step"]

log = logging.getLogger("delayq.forwarder")

T = TypeVar("T")


@dataclass
class _Sending:
    """One claim while its publish calls run: what the targets reported so far (and the
    deliveries the hooks or a paused target hold back, in its ``later``)."""

    prepared: Prepared
    report: PublishReport = field(default_factory=PublishReport)


class Publisher:
    """Publishes prepared claims with one call per target (a round trip each, not one per shard).

    One call per claim instead to a :class:`~delayq_backends.targets.ClaimTarget` (it takes one
    lease, unless its ``takes_leases`` is False) and when a hook admits (a queue's room counts
    the publishes before). Each delivery is checked still ours just before its call: items
    taken over after our lease ran out are not published again. While a target is paused (a
    configuration error), its items wait in the store.
    """

    def __init__(
        self,
        ctx: Context,
        heartbeat: Heartbeat,
        pauses: TargetPauses,
        lease_margin_ms: int,
    ) -> None:
        self.ctx = ctx
        self.heartbeat = heartbeat
        self.pauses = pauses
        #: a batch is only published with at least this much of its lease left (else extended first)
        self.lease_margin_ms = lease_margin_ms
        #: the targets that take the batch's lease, found once: an isinstance of a
        #: runtime-checkable protocol inspects every member of it
        self._lease_takers = {kind for kind, target in ctx.targets.items() if isinstance(target, ClaimTarget)}

    def publish_all(self, prepared: Sequence[Prepared]) -> tuple[list[Published], dict[int, Exception]]:
        """The claims published, and the errors raised by index in ``prepared`` (a call's error
        counts for every claim in it: their shards are set aside)."""
        sending = [_Sending(p) for p in prepared]
        errors: dict[int, Exception] = {}
        one_by_one = any(hook.admits for hook in self.ctx.hooks)
        for kind in dict.fromkeys(kind for p in prepared for kind in p.groups):
            claims = [n for n, p in enumerate(prepared) if kind in p.groups and n not in errors]
            together = not self._takes_leases(kind) and not one_by_one
            for call in [claims] if together else [[n] for n in claims]:
                error = shard_step(partial(self._call, kind, [sending[n] for n in call]))
                if isinstance(error, Exception):
                    errors.update((n, error) for n in call)
        return [self._published(s) for n, s in enumerate(sending) if n not in errors], errors

    def _takes_leases(self, kind: str) -> bool:
        """Whether target ``kind`` is called per claim, with its lease: a :class:`ClaimTarget`,
        unless it says its broker makes no use of the lease (``takes_leases`` False: the Celery
        target on RabbitMQ, whose every call waits for the broker's confirms once)."""
        return kind in self._lease_takers and bool(getattr(self.ctx.targets[kind], "takes_leases", True))

    def _published(self, s: _Sending) -> Published:
        """The claim's record once published: target failures turned into retries or dead letters
        (or deferrals a hook takes over)."""
        failed = s.report.failed
        taken: set[str] = set()
        later = list(s.prepared.later) + s.report.later
        if failed:
            now = self.ctx.clock()
            for hook in self.ctx.hooks:
                verdict = hook.failed(s.prepared, failed, now)
                later += verdict.later
                taken |= {i for i, _ in verdict.later}
        attempts = {item.id: item.attempts for item in s.prepared.lease.items} if failed else {}
        failures = s.prepared.failures + tuple(
            FailedDelivery(f.id, None if f.permanent else self.ctx.retry_at(attempts[f.id]), f.error)
            for f in failed
            if f.id not in taken
        )
        return Published(s.prepared, s.report, failures, tuple(later))

    def _call(self, kind: str, claims: list[_Sending]) -> None:
        """One publish call to target ``kind`` for ``claims``, each one's deliveries admitted by
        the hooks and checked still ours just before it."""
        until = self.pauses.until(kind, self.ctx.clock())
        if until is not None:
            for s in claims:
                s.report.later += [(d.id, until) for d in s.prepared.groups[kind]]
            return
        call = [(s, go) for s in claims if (go := self._still_ours(s, self._admit(kind, s)))]
        if call:
            self._publish(kind, call)

    def _admit(self, kind: str, s: _Sending) -> list[Delivery]:
        go = s.prepared.groups[kind]
        for hook in self.ctx.hooks:
            if hook.admits and go:
                admitted = hook.admit(kind, go, self.ctx.clock())
                go = admitted.go
                s.report.later += admitted.later
        return go

    def _still_ours(self, s: _Sending, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries that may be published now: those still under our lease with at least
        :attr:`lease_margin_ms` of it left.

        A batch whose deadline is near (a stall: a GC pause, SIGSTOP, a slow flow-control probe)
        is extended first; items that are no longer ours (another forwarder took them after our
        lease ran out) are dropped, not published: publishing them would duplicate them. If
        the extension itself fails, the deliveries are given back (released), not published.
        """
        held: HeldLease = s.prepared.held
        if not deliveries:
            return deliveries
        if held.deadline_ms - self.lease_margin_ms <= self.ctx.clock():
            try:
                self.heartbeat.extend(held)
            except Exception as exc:
                log.warning(
                    "shard %d: lease near its end and cannot be extended (%s: %s); giving back %d items",
                    held.shard,
                    type(exc).__name__,
                    exc,
                    len(deliveries),
                )
                s.report.unsent += [d.id for d in deliveries]
                return []
        lost = held.lost
        if not lost:  # the usual case: nothing taken over, no look-up per item
            return deliveries
        if n := sum(d.id in lost for d in deliveries):
            log.warning("shard %d: %d items were taken over after our lease ran out; not publishing them", held.shard,
                        n)  # fmt: skip
        return [d for d in deliveries if d.id not in lost]

    def _publish(self, kind: str, call: list[tuple[_Sending, list[Delivery]]]) -> None:
        """One publish call to target ``kind`` of the deliveries of one or more claims (one for a
        :class:`ClaimTarget`), its report shown to the hooks and split back to the claims."""
        deliveries = [d for _, ds in call for d in ds]
        started = time_ns()
        part = self._isolated(kind, deliveries, call[0][0].prepared.lease)
        for hook in self.ctx.hooks:
            hook.sent(kind, deliveries, part.published)
        now = self.ctx.clock()
        part = self._paused(kind, part, now)
        sent = Sent(kind, deliveries, part, now, started)
        for hook in self.ctx.hooks:
            hook.reported(sent)
        part.split({d.id: s.report for s, ds in call for d in ds})

    def _paused(self, kind: str, part: PublishReport, now: int) -> PublishReport:
        """A call's report once its target is paused (a configuration error, not an outage: its
        unsent items wait in the store) or known to work again."""
        cause = None if part.broker_error is None else config_error(part.broker_error)
        if cause is not None:
            until = self.pauses.pause(kind, cause, now)
            return replace(part, unsent=[], broker_error=None, later=part.later + [(i, until) for i in part.unsent])
        if part.broker_error is None and (part.published or part.failed):
            self.pauses.worked(kind)
        return part

    def _isolated(self, kind: str, deliveries: list[Delivery], lease: Lease) -> PublishReport:
        """One call to target ``kind``; if it raises, each half again, down to single items, so
        an item whose handling raises (a target's bug, a value it did not foresee) fails alone
        with the error as its reason and the rest of the call is published. An outage or a
        configuration error raised is reported as such (``unsent``), not split.

        Items a target published before raising may be published again (at-least-once, same id)."""
        target = self.ctx.targets[kind]
        try:
            if self._takes_leases(kind):  # it may ack inside its own transaction
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
        return first.merge(second)


def shard_step(step: Callable[[], T]) -> T | Exception:
    """``step()``'s result, or what it raised: an error of one shard's data (a bad value, a
    script error, a bug); an outage is raised, it is not one shard's."""
    try:
        return step()
    except CONNECTION_ERRORS:
        raise  # the store is unreachable, not this shard: the loop backs off
    except Exception as exc:  # anything from data (a bad value, a script error, a bug)
        return exc
