"""Small helpers shared by the tests (``wait_for`` is the benches' too, from bench/lib)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from bench.lib.waiting import wait_for

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from delayq_backends import DelayStore

__all__ = [
    "PAST",
    "group_running",
    "hold_in_groups",
    "json_lines_exporter",
    "max_overlap",
    "memory_tracing",
    "ms_at_or_after",
    "wait_for",
]

#: A ready time long gone, for items a single claim must find due. Not "now" (``timedelta(0)``,
#: ``countdown=0``): ready times round up to the next millisecond, so an item scheduled in the
#: claim's own millisecond is not due yet for it, and an exact count comes out one short.
PAST = datetime(2020, 1, 1, tzinfo=timezone.utc)


def memory_tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider of its own (not the global one: other tests stay untraced) whose spans
    are kept in memory as they end."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def json_lines_exporter(path: str) -> SpanExporter:
    """An exporter appending each span to ``path`` as one JSON line (the SDK's ``to_json``), line
    buffered: how a worker or forwarder subprocess hands its spans to the test."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    def line(span: ReadableSpan) -> str:
        return span.to_json(indent=None) + "\n"

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    return ConsoleSpanExporter(out=out, formatter=line)


def ms_at_or_after(when: datetime) -> int:
    """The first epoch millisecond not before ``when``: the store rounds ready times up, never to
    the nearest ms (which could be up to 0.5 ms early). Exact integer arithmetic, no float."""
    micros = (when - datetime(1970, 1, 1, tzinfo=timezone.utc)) // (datetime.resolution)
    return -(-micros // 1000)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most of the (start, end) ``intervals`` open at one moment: an end before a start at the
    same instant (the slot tests: tasks of one key running at once, by their own clocks)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def hold_in_groups(store: DelayStore, keys: Sequence[str], member: str, token: str) -> None:
    """Take a slot for ``member`` in each group of ``keys`` with one token, held a minute for its
    worker's start: as a forwarder releases an item of several groups (the worker reports its
    start and end to each with the one token its message carries)."""
    from delayq_backends.scripts.store import SlotTake
    from delayq_backends.store import MAX_HOLD_MS

    now = store.script_now(None)
    calls = [
        SlotTake.call(store.group_keys(k), [(member, 0, token, 1)], limit=0, hold_ms=60_000, wait_ms=60_000,
                      cap_ms=MAX_HOLD_MS, now=now)
        for k in keys
    ]  # fmt: skip
    for key, reply in zip(keys, store.run_each(calls)):
        assert not isinstance(reply, Exception) and reply.places == (-1,), f"group {key}: {reply}"


def group_running(store: DelayStore, key: str) -> int:
    """Items holding a slot of group ``key``, the workers' reports read first (as a take reads them)."""
    from delayq_backends.store import SlotAsk

    grant = store.take_slots({key: SlotAsk(0, [])}, hold_ms=60_000, wait_ms=60_000, mode="join")[key]
    assert not isinstance(grant, Exception), grant
    return grant.running
