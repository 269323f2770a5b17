"""The forward's spans: one ``delayq.forward`` span per item published, linked to its producer.

Made only when tracing is on (:func:`~delayq_backends.tracing.tracer` found a tracer provider at
start); otherwise the forwarder has no such hook and skips this module entirely. Each span covers the
publish call that sent its item and is a root (the forward is not part of the producer's request:
it runs minutes later, for many producers at once), with a LINK to the producer's span read from
the stored item: the target's ``trace_carrier(delivery)`` where it has one (the Celery target reads
its stored headers), else the envelope meta's ``trace`` field (the RQ queue writes it). A periodic
entry's run has no producer: its span links to nothing, and its worker's run starts its own trace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from time import time_ns
from typing import TYPE_CHECKING, Any

from ..targets import Delivery, Target
from ..tracing import TRACE_META, context_links, tracer
from .hooks import PassHook
from .records import Sent

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

__all__ = ["SPAN_NAME", "ForwardTracer"]

log = logging.getLogger("delayq.forwarder")

SPAN_NAME = "delayq.forward"

#: What a target offers to read the producer's W3C fields from one of its items.
Carrier = Callable[[Delivery], Any]


def envelope_carrier(delivery: Delivery) -> Any:
    """The producer's W3C fields kept in the envelope meta (:data:`~delayq_backends.tracing.TRACE_META`)."""
    return delivery.envelope.meta.get(TRACE_META)


class ForwardTracer(PassHook):
    """Makes the forward's spans; built by :meth:`start`, which says None when tracing is off."""

    def __init__(self, tracer: Tracer, carriers: Mapping[str, Carrier]) -> None:
        from opentelemetry.context import Context  # tracing is on: opentelemetry is installed
        from opentelemetry.trace import SpanKind

        self.tracer = tracer
        self.carriers = carriers
        #: the parent of every forward span: none (a root; its links say where the item came from)
        self._root = Context()
        self._kind = SpanKind.PRODUCER
        self._failing = False

    @classmethod
    def start(cls, targets: Mapping[str, Target], provider: TracerProvider | None = None) -> ForwardTracer | None:
        """The forward's tracer, or None when tracing is off (no opentelemetry, no tracer provider):
        decided once, here, so a forwarder without tracing pays nothing per item."""
        found = tracer(provider)
        if found is None:
            return None
        carriers = {kind: getattr(target, "trace_carrier", envelope_carrier) for kind, target in targets.items()}
        return cls(found, carriers)

    def reported(self, sent: Sent) -> None:
        """One span per published item of a publish call. A failure here is logged (once until it
        works again), never raised: tracing must not stop forwarding."""
        if not sent.report.published:
            return
        try:
            self._spans(sent.kind, sent.deliveries, sent.report.published, sent.now_ms, sent.started_ns)
        except Exception:
            if not self._failing:
                log.exception("tracing: the forward's spans could not be made; forwarding goes on")
            self._failing = True
        else:
            self._failing = False

    def _spans(
        self, kind: str, deliveries: Sequence[Delivery], published: Sequence[str], now_ms: int, started_ns: int
    ) -> None:
        carrier, ended, sent = self.carriers.get(kind, envelope_carrier), time_ns(), set(published)
        for d in deliveries:
            if d.id not in sent:
                continue
            attributes: dict[str, str | int] = {
                "delayq.item.id": d.id,
                "delayq.kind": kind,
                "messaging.destination.name": d.envelope.destination,
                "delayq.lateness_ms": now_ms - d.ready_ms,
                "delayq.attempts": d.attempts,
            }
            span = self.tracer.start_span(
                SPAN_NAME,
                context=self._root,
                kind=self._kind,
                links=context_links(carrier(d)),
                attributes=attributes,
                start_time=started_ns,
            )
            span.end(end_time=ended)
