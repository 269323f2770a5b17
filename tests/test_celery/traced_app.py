"""``celery -A tests.test_celery.traced_app``: the tests' app with OpenTelemetry on (the SDK, and
Celery's own instrumentation), each finished span written as one JSON line to ``DQT_SPANS``.

The worker and the forwarder load it: their spans reach the test through that file."""

import os

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.helpers import json_lines_exporter
from tests.test_celery.tasks import app_from_env

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(json_lines_exporter(os.environ["DQT_SPANS"])))
trace.set_tracer_provider(provider)
CeleryInstrumentor().instrument()

app = app_from_env()
