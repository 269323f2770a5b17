"""Traces across the wait on RQ: ``enqueue_in`` under a span carries its context in the job's meta
and envelope, the forward's span links to it, and :class:`TracedJobs` runs the job in the
producer's trace (docs/tracing.md). An in-process forwarder and ``SimpleWorker`` (the slot and
dedupe workers mix it in), spans in memory; and a real, forking ``rq worker``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from rq.job import Job

from delayq_backends import DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.forwarder.tracing import SPAN_NAME
from delayq_backends.rq import DedupeSimpleWorker, Queue, RQTarget, Scheduler, SlotSimpleWorker
from delayq_backends.tracing import TRACE_META
from tests.harness.rq import Processes
from tests.helpers import memory_tracing, wait_for


@pytest.fixture
def tracing() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider, exporter = memory_tracing()
    yield provider, exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def forward_and_run(queue: Queue, rq_store: DelayStore, conn: redis.Redis, provider: TracerProvider) -> None:
    """Forward what is due (the forward's spans to ``provider``), then run the queue to its end in
    a slot worker tracing to ``provider``."""
    forwarder = Forwarder(rq_store, [RQTarget(conn)], tracer_provider=provider)
    wait_for(lambda: forwarder.run_once() == 1, 5, "the job forwarded")

    class Worker(SlotSimpleWorker):
        tracer_provider = provider

    Worker([queue], connection=conn).work(burst=True)


@pytest.mark.parametrize("worker", [SlotSimpleWorker, DedupeSimpleWorker])
def test_a_delayed_job_is_one_trace_producer_forward_worker(
    queue: Queue,
    rq_store: DelayStore,
    conn: redis.Redis,
    tracing: tuple[TracerProvider, InMemorySpanExporter],
    worker: type[SlotSimpleWorker],
) -> None:
    provider, exporter = tracing
    with provider.get_tracer("test").start_as_current_span("request") as request:
        job = queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.record", "traced")
    producer = request.get_span_context()
    stored = Job.fetch(job.id, connection=conn).meta
    assert stored["traceparent"].startswith(f"00-{producer.trace_id:032x}-{producer.span_id:016x}-")
    item = rq_store.get(job.id)
    assert item is not None and Envelope.decode(item.envelope).meta[TRACE_META] == {
        "traceparent": stored["traceparent"]
    }

    forwarder = Forwarder(rq_store, [RQTarget(conn)], tracer_provider=provider)
    wait_for(lambda: forwarder.run_once() == 1, 5, "the job forwarded")
    (forward,) = named(exporter, SPAN_NAME)
    assert forward.parent is None and forward.context.trace_id != producer.trace_id  # a root of its own
    assert [(link.context.trace_id, link.context.span_id) for link in forward.links] == [
        (producer.trace_id, producer.span_id)
    ]
    assert forward.kind == SpanKind.PRODUCER
    assert forward.attributes is not None
    assert forward.attributes["delayq.item.id"] == job.id and forward.attributes["delayq.kind"] == "rq"
    assert forward.attributes["messaging.destination.name"] == queue.name

    traced = type("Traced", (worker,), {"tracer_provider": provider})
    traced([queue], connection=conn).work(burst=True)
    (run,) = named(exporter, "run/tests.test_rq.jobs.record")
    assert run.context.trace_id == producer.trace_id
    assert run.parent is not None and run.parent.span_id == producer.span_id
    assert run.kind == SpanKind.CONSUMER and run.status.status_code != StatusCode.ERROR


def test_a_job_scheduled_outside_a_span_carries_nothing_and_starts_its_own_trace(
    queue: Queue, rq_store: DelayStore, conn: redis.Redis, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracing
    job = queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.record", "untraced")
    assert "traceparent" not in Job.fetch(job.id, connection=conn).meta
    item = rq_store.get(job.id)
    assert item is not None and item.envelope == queue.envelope_bytes()  # the queue's shared envelope, as before
    forward_and_run(queue, rq_store, conn, provider)
    (forward,) = named(exporter, SPAN_NAME)
    assert forward.links == ()
    (run,) = named(exporter, "run/tests.test_rq.jobs.record")
    assert run.parent is None


def test_a_failed_run_is_an_error_span(
    queue: Queue, rq_store: DelayStore, conn: redis.Redis, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracing
    with provider.get_tracer("test").start_as_current_span("request"):
        queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.always_fails", "failing")
    forward_and_run(queue, rq_store, conn, provider)
    (run,) = named(exporter, "run/tests.test_rq.jobs.always_fails")
    assert run.status.status_code == StatusCode.ERROR


def test_a_forking_rq_worker_runs_the_job_in_the_producers_trace(
    queue: Queue,
    rq_store: DelayStore,
    conn: redis.Redis,
    tracing: tuple[TracerProvider, InMemorySpanExporter],
    processes: Processes,
    tmp_path: Path,
) -> None:
    """A real ``rq worker`` (forking: the job runs in a work horse that RQ ends with ``os._exit``)."""
    provider, _ = tracing
    with provider.get_tracer("test").start_as_current_span("request") as request:
        job = queue.enqueue_in(timedelta(0), "tests.test_rq.jobs.record", "forked")
    producer = request.get_span_context()
    forwarder = Forwarder(rq_store, [RQTarget(conn)], tracer_provider=provider)
    wait_for(lambda: forwarder.run_once() == 1, 5, "the job forwarded")
    spans = tmp_path / "spans.jsonl"
    processes.env["DQT_SPANS"] = str(spans)
    worker = processes.worker(
        queue.name, burst=True, extra=("--worker-class", "tests.test_rq.traced_worker.TracedWorker")
    )
    assert worker.wait(timeout=60) == 0
    [run] = [json.loads(line) for line in spans.read_text().splitlines() if job.id in line]
    assert run["name"] == "run/tests.test_rq.jobs.record"
    assert run["context"]["trace_id"] == f"0x{producer.trace_id:032x}"
    assert run["parent_id"] == f"0x{producer.span_id:016x}"


def test_a_scheduler_one_off_job_carries_the_context_and_a_repeating_one_does_not(
    conn: redis.Redis, rq_store: DelayStore, prefix: str, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A repeating job's runs share its id and meta: a producer's context there would make every
    run, for ever, part of the trace of the request that set the schedule up."""
    provider, _ = tracing
    scheduler = Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store)
    with provider.get_tracer("test").start_as_current_span("request"):
        once = scheduler.enqueue_in(timedelta(minutes=5), "tests.test_rq.jobs.record", "once")
        cron = scheduler.cron("*/5 * * * *", "tests.test_rq.jobs.record", args=["cron"])
        every = scheduler.schedule(datetime.now(timezone.utc), "tests.test_rq.jobs.record", args=["every"], interval=60)
    assert "traceparent" in Job.fetch(once.id, connection=conn).meta
    for job in (cron, every):
        assert "traceparent" not in Job.fetch(job.id, connection=conn).meta
        item = rq_store.get(job.id)
        assert item is not None and TRACE_META not in Envelope.decode(item.envelope).meta
