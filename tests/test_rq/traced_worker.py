"""``rq worker --worker-class tests.test_rq.traced_worker.TracedWorker``: the forking slot worker
with OpenTelemetry on, its spans appended as JSON lines to ``DQT_SPANS`` through the SDK's batch
processor (so a work horse that did not flush before RQ's ``os._exit`` would lose them)."""

import os

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from delayq_backends.rq import SlotWorker
from tests.helpers import json_lines_exporter

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(json_lines_exporter(os.environ["DQT_SPANS"])))


class TracedWorker(SlotWorker):
    tracer_provider = provider
