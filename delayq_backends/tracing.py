"""OpenTelemetry across the wait: the W3C trace context a delayed item carries from its producer.

A delayed task's trace would otherwise stop at ``apply_async``/``enqueue_at`` and start again, unrelated,
when a worker runs it minutes later. The producer's context travels with the item (Celery: the
``traceparent``/``tracestate`` headers opentelemetry-instrumentation-celery writes, stored and
forwarded unchanged; RQ: the same fields in ``job.meta`` and in the item's envelope meta, written
by :func:`current_carrier` at ``schedule_job``), so the forward's span links to it and the worker's
span continues it.

The extra (``pip install delayq_backends[otel]``) is optional. Without opentelemetry, or with no
tracer provider configured (the API's no-op default), :func:`tracer` returns None, once, at start:
the forwarder's hot path then tests one attribute for None per publish call and does nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: tracing is off
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Tracer, TracerProvider

__all__ = ["FIELDS", "SCOPE", "TRACE_META", "context_links", "current_carrier", "remote_context", "tracer"]

#: The envelope meta field (and, for RQ, the ``job.meta`` fields) holding the producer's context.
TRACE_META = "trace"
#: The W3C trace context fields carried: https://www.w3.org/TR/trace-context/
FIELDS = ("traceparent", "tracestate")
#: The instrumentation scope of delayq's spans.
SCOPE = "delayq_backends"

_W3C = None if _trace is None else TraceContextTextMapPropagator()


def tracer(provider: TracerProvider | None = None) -> Tracer | None:
    """The tracer for delayq's spans, or None when tracing is off: opentelemetry is not installed,
    or neither ``provider`` nor a global tracer provider is configured (the API's default makes
    spans that go nowhere, at a cost per item). Call it once, at start, not per item."""
    if _trace is None:
        return None
    if provider is None:
        provider = _trace.get_tracer_provider()
    if isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer(SCOPE)


def current_carrier() -> dict[str, str] | None:
    """The current span's context as W3C fields (``traceparent``, and ``tracestate`` when set), or
    None when there is no valid current span (or no opentelemetry): nothing to carry."""
    if _W3C is None or not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier or None


def remote_context(carrier: Any) -> Context | None:
    """The context of the remote span in ``carrier`` (a mapping holding W3C fields), to start a span
    under; None when it holds no valid one: absent, malformed, or written by another tool. Never
    raises on bad data."""
    if _W3C is None or not isinstance(carrier, Mapping) or not isinstance(carrier.get("traceparent"), str):
        return None
    context = _W3C.extract({k: v for k in FIELDS if isinstance(v := carrier.get(k), str)})
    return context if _trace.get_current_span(context).get_span_context().is_valid else None


def context_links(carrier: Any) -> list[Link]:
    """A link to the remote span in ``carrier`` (:func:`remote_context`), or none."""
    context = remote_context(carrier)
    return [] if context is None else [_trace.Link(_trace.get_current_span(context).get_span_context())]
