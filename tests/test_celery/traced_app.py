"""``celery -A tests.test_celery.traced_app``: the tests' app with OpenTelemetry on (the SDK, and
Celery's own instrumentation), each finished span written as one JSON line to ``DQT_SPANS``.

The worker and the forwarder load it: their spans reach the test through that file."""

import os

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from tests.test_celery.tasks import app_from_env


def _line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


provider = TracerProvider()
# line-buffered: a span is in the file once it ended, for the test to read while we run
spans = open(os.environ["DQT_SPANS"], "a", buffering=1)  # noqa: SIM115 - open for the process's life
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=spans, formatter=_line)))
trace.set_tracer_provider(provider)
CeleryInstrumentor().instrument()

app = app_from_env()
