"""Tracing's switch and its edges (docs/tracing.md): off without a tracer provider or without
opentelemetry, decided once when the forwarder is built; a stored trace context that is garbage
links to nothing; a tracer that raises never stops forwarding. The end-to-end traces are in
tests/test_celery/test_tracing.py and tests/test_rq/test_tracing.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider

from delayq_backends import DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.forwarder.tracing import SPAN_NAME, ForwardTracer
from delayq_backends.targets import RedisListTarget
from delayq_backends.tracing import TRACE_META, context_links, current_carrier, tracer
from tests.harness import ROOT, Launcher, checkout_env, make_store
from tests.helpers import memory_tracing, wait_for

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def store(valkey_url: str, prefix: str) -> DelayStore:
    """One server: tracing does not depend on the store's kind."""
    return make_store(valkey_url, prefix)


@pytest.fixture
def out(valkey_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(valkey_url)
    yield client
    client.close()


def envelope(key: str, trace: Any = None) -> Envelope:
    return Envelope("list", key, b"x", meta={} if trace is None else {TRACE_META: trace})


def test_tracing_is_off_without_a_tracer_provider(store: DelayStore, out: redis.Redis) -> None:
    """The API's default provider makes spans that go nowhere: the forwarder makes none, and has
    no tracing hook (tracing then costs nothing per publish call)."""

    def tracers(forwarder: Forwarder) -> list[ForwardTracer]:
        return [h for h in forwarder.pass_.ctx.hooks if isinstance(h, ForwardTracer)]

    assert tracer() is None and current_carrier() is None
    assert tracers(Forwarder(store, [RedisListTarget(out)])) == []
    provider, _ = memory_tracing()
    assert len(tracers(Forwarder(store, [RedisListTarget(out)], tracer_provider=provider))) == 1


@pytest.mark.parametrize(
    "carrier",
    [
        None,
        "00-abc",
        {},
        {"traceparent": 7},
        {"traceparent": "garbage"},
        {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
    ],
)
def test_a_garbage_trace_context_links_to_nothing(carrier: Any) -> None:
    assert context_links(carrier) == []


def test_an_item_with_a_garbage_context_is_forwarded_with_an_unlinked_span(
    store: DelayStore, out: redis.Redis, prefix: str
) -> None:
    provider, exporter = memory_tracing()
    key = f"{prefix}:out"
    store.schedule("good", 1, envelope(key, {"traceparent": GOOD}))
    store.schedule("junk", 1, envelope(key, {"traceparent": ["not", "a", "string"]}))
    assert Forwarder(store, [RedisListTarget(out)], tracer_provider=provider).run_once() == 2
    assert out.llen(key) == 2
    links = {s.attributes["delayq.item.id"]: s.links for s in exporter.get_finished_spans() if s.name == SPAN_NAME}
    assert [f"{link.context.span_id:016x}" for link in links["good"]] == ["b7ad6b7169203331"]
    assert links["junk"] == ()


class _Broken:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter bug")


class _BrokenProvider(TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _Broken()


def test_a_tracer_that_raises_never_stops_forwarding(
    store: DelayStore, out: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"{prefix}:out"
    fwd = Forwarder(store, [RedisListTarget(out)], tracer_provider=_BrokenProvider(), batch=1)
    for i in range(3):
        store.schedule(f"i{i}", 1, envelope(key, {"traceparent": GOOD}))
    with caplog.at_level(logging.ERROR, "delayq.forwarder"):
        assert fwd.run_once() == 3
    assert out.llen(key) == 3 and fwd.stats.acked == 3
    # logged once, not once per call
    assert [r.getMessage() for r in caplog.records].count(
        "tracing: the forward's spans could not be made; forwarding goes on"
    ) == 1


def test_without_opentelemetry_tracing_is_off_and_nothing_else_changes() -> None:
    """Where the extra is not installed: every module imports, and tracing says off."""
    code = """
import json, sys
from delayq_backends.tracing import context_links, current_carrier, tracer
from delayq_backends.forwarder.tracing import ForwardTracer
import delayq_backends.rq, delayq_backends.celery
carrier = {"traceparent": sys.argv[1]}
print(json.dumps([tracer(), current_carrier(), context_links(carrier), ForwardTracer.start({})]))
"""
    env = checkout_env(DELAYQ_TEST_BLOCK="opentelemetry")
    env["PYTHONPATH"] = f"{ROOT / 'tests' / 'blocked'}:{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-c", code, GOOD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [None, None, [], None]
    blocked = subprocess.run(
        [sys.executable, "-c", "import opentelemetry"], env=env, capture_output=True, text=True, timeout=60
    )
    assert blocked.returncode != 0  # the block works: the check above ran without opentelemetry


def test_delayq_forward_under_opentelemetry_instrument_links_its_spans(
    store: DelayStore, out: redis.Redis, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    """The plain CLI's way in (docs/tracing.md): ``opentelemetry-instrument delayq forward`` with
    the console exporter; the forward's span, in the process's output, links to the stored context."""
    key = f"{prefix}:out"
    store.schedule("one", 1, envelope(key, {"traceparent": GOOD}))
    log = tmp_path / "forward.log"
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    env["OTEL_BSP_SCHEDULE_DELAY"] = "50"  # export within 50 ms, not 5 s
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    args = [instrument, sys.executable, "-m", "delayq_backends.cli", "forward", "--url", store.config.url]
    procs.start([*args, "--prefix", prefix, "--shards", str(store.shards)], env=checkout_env(**env), log=log)
    wait_for(lambda: out.llen(key) == 1, 30, "the item forwarded")
    wait_for(lambda: '"name": "delayq.forward"' in log.read_text(), 30, "the forward's span exported")
    text = log.read_text()
    assert '"trace_id": "0x0af7651916cd43dd8448eb211c80319c"' in text and '"span_id": "0xb7ad6b7169203331"' in text
