"""Traces across the wait on Celery: a delayed task's producer span, the forward's span linked to
it, and the worker's run in the producer's trace (docs/tracing.md).

The producer is this process (the SDK's in-memory exporter, Celery's instrumentation); a real
``celery worker`` and a real ``celery -A … delayq forward`` load :mod:`tests.test_celery.traced_app`,
which writes their spans to a file. A Redis broker: the propagation is in the message's headers,
the same on any broker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from delayq_backends.celery import forget_store
from delayq_backends.celery.message import StoredMessage
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder.tracing import SPAN_NAME
from delayq_backends.testing import TestingForwarder
from delayq_backends.tracing import FIELDS as TRACE_FIELDS
from tests.helpers import memory_tracing, wait_for
from tests.test_celery.conftest import broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, watched
from tests.test_celery.test_periodic import Harness


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans") / "spans.jsonl"


@pytest.fixture(scope="module")
def traced_env(
    request: pytest.FixtureRequest,
    valkey_server: EmbeddedServer,
    tmp_path_factory: pytest.TempPathFactory,
    spans_file: Path,
) -> Iterator[CeleryEnv]:
    """A worker and a forwarder (``celery -A … delayq forward``) with tracing on, spans to ``spans_file``."""
    env = new_env("redis", broker_url_for("redis", request, valkey_server), valkey_server)
    env.app_module = "tests.test_celery.traced_app"
    tmp = tmp_path_factory.mktemp("celery-traced")
    with pytest.MonkeyPatch.context() as mp, watched(env):
        mp.setenv("DQT_SPANS", str(spans_file))
        env.start_worker(tmp)
        env.start_forwarder(tmp, via_celery=True)
        yield env


@pytest.fixture
def producer_spans() -> Iterator[InMemorySpanExporter]:
    """Celery's instrumentation in this process, its spans kept in memory; removed after the test."""
    provider, exporter = memory_tracing()
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def span_where(path: Path, predicate: Any, what: str, env: CeleryEnv) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [s for s in read_spans(path) if predicate(s)]
        return bool(found)

    wait_for(seen, 30, f"{what}:\n{env.tail()}")
    assert len(found) == 1, found
    return found[0]


def test_a_delayed_task_is_one_trace_producer_forward_worker(
    traced_env: CeleryEnv, producer_spans: InMemorySpanExporter, spans_file: Path
) -> None:
    app: Celery = traced_env.app()
    try:
        task_id = str(uuid.uuid4())
        app.send_task("dqt.record", args=["traced"], countdown=1, task_id=task_id)
    finally:
        forget_store(app)
    (producer,) = [s for s in producer_spans.get_finished_spans() if s.name == "apply_async/dqt.record"]
    trace_id, span_id = f"0x{producer.context.trace_id:032x}", f"0x{producer.context.span_id:016x}"

    forward = span_where(
        spans_file,
        lambda s: s["name"] == SPAN_NAME and s["attributes"].get("delayq.item.id") == task_id,
        "the forward's span",
        traced_env,
    )
    # a root of its own, linked to the producer's span: the forward is not part of the request
    assert forward["parent_id"] is None
    assert forward["context"]["trace_id"] != trace_id
    assert [(link["context"]["trace_id"], link["context"]["span_id"]) for link in forward["links"]] == [
        (trace_id, span_id)
    ]
    assert forward["kind"] == "SpanKind.PRODUCER"
    assert forward["attributes"]["delayq.kind"] == "celery"
    assert forward["attributes"]["messaging.destination.name"] == traced_env.queue
    assert 0 <= forward["attributes"]["delayq.lateness_ms"] < 10_000

    # the worker's run continues the producer's trace: the headers were stored and forwarded unchanged
    run = span_where(
        spans_file,
        lambda s: s["name"] == "run/dqt.record" and s["attributes"].get("messaging.message.id") == task_id,
        "the worker's span",
        traced_env,
    )
    assert run["context"]["trace_id"] == trace_id
    assert run["parent_id"] == span_id


def test_a_periodic_run_starts_its_own_trace_even_when_synced_under_one(producer_spans: InMemorySpanExporter) -> None:
    """The entry's message is captured through Celery's sender, where the instrumentation writes
    the sync's context: kept, every run would continue the sync's trace, and each sync (a new
    context) would count as a change of the entry."""
    h = Harness(datetime(2026, 5, 4, 12, tzinfo=timezone.utc), {"a": {"task": "t.a", "schedule": 60.0}})
    provider, forwarded = memory_tracing()
    h.forwarder = TestingForwarder(h.store, [h.sent, h.periodic], tracer_provider=provider)
    assert h.sync().added == ["a"]
    assert h.sync().unchanged == ["a"]
    assert any(s.name == "apply_async/t.a" for s in producer_spans.get_finished_spans())  # captured under a span
    h.fire_next("a")
    [run] = [StoredMessage.from_envelope(d.envelope) for d in h.sent.delivered]
    assert run.task == "t.a" and not set(TRACE_FIELDS) & set(run.headers)
    (forward,) = forwarded.get_finished_spans()  # the run's forward: linked to nothing
    assert forward.attributes is not None and forward.attributes["delayq.kind"] == "celery-periodic"
    assert forward.links == ()
