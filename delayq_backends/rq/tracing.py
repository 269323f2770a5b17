"""A worker-side span per RQ job run, continuing the trace of the code that scheduled it.

RQ has no trace propagation of its own. :meth:`Queue.schedule_job <delayq_backends.rq.Queue.schedule_job>`
(``enqueue_at``, ``enqueue_in``, a Scheduler's one-off jobs) keeps the producer's W3C context in
``job.meta["traceparent"]``/``["tracestate"]``; :class:`TracedJobs`, mixed into a worker class
before RQ's (the slot and dedupe workers have it), runs each job in a ``run/<function>`` span
whose parent is that context, so the producer's span, the forward's (linked to it) and the run
are one story. A job without one (enqueued directly, a repeating job's runs) starts its own trace.

Off (no opentelemetry, no tracer provider) it is decided once per worker: a job then runs as
without the mixin. See docs/tracing.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rq.job import Job

from ..tracing import remote_context, tracer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["TracedJobs"]


class TracedJobs:
    """Runs each job in a span under its producer's context (``job.meta``), mixed into a worker
    class before RQ's. In a forking worker the span is flushed before the work horse exits (RQ
    ends it with ``os._exit``, which would drop spans still buffered)."""

    #: where the spans go; None: OpenTelemetry's global tracer provider, when one is configured
    tracer_provider: TracerProvider | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._job_tracer = tracer(self.tracer_provider)
        self._tracing_pid = os.getpid()

    def perform_job(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> Any:
        if self._job_tracer is None:
            return super().perform_job(job, queue, *args, **kwargs)  # type: ignore[misc]
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attributes = {
            "messaging.system": "rq",
            "messaging.message.id": job.id,
            "messaging.destination.name": queue.name,
            "rq.job.func_name": str(job.func_name),
        }
        name = f"run/{job.func_name}"
        context = remote_context(job.meta)
        with self._job_tracer.start_as_current_span(
            name, context=context, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            done = super().perform_job(job, queue, *args, **kwargs)  # type: ignore[misc]
            if done is False:  # RQ caught the job's exception and handled the failure
                span.set_status(Status(StatusCode.ERROR, "the job failed"))
        if os.getpid() != self._tracing_pid:  # the work horse: RQ ends it with os._exit
            provider = self.tracer_provider or _global_provider()
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                flush()
        return done


def _global_provider() -> Any:
    from opentelemetry import trace

    return trace.get_tracer_provider()
