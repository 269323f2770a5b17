"""The audit log: files and streams hold every record, and a failing or slow log never touches
forwarding."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.audit import AuditLog, AuditRecord, JsonLinesAudit, RedisStreamAudit, read_stream
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from tests.harness import make_store

pytestmark = pytest.mark.spark


def records(n: int, start: int = 0) -> list[AuditRecord]:
    return [AuditRecord("forwarded", f"i{k}", "list", "L", 1000 + k, 2000 + k, 1, "f") for k in range(start, start + n)]


def read_dir(directory: Path) -> list[dict[str, object]]:
    return [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_json_lines_rotate_and_keep_every_record(tmp_path: Path) -> None:
    log = JsonLinesAudit(tmp_path, stem="forwarded", max_bytes=2_000)
    for k in range(0, 300, 30):
        log.record(records(30, k))
    assert log.flush(10)
    log.close()
    files = list(tmp_path.glob("forwarded-*.jsonl"))
    assert len(files) > 3, "rotated at max_bytes"
    assert sorted(r["id"] for r in read_dir(tmp_path)) == sorted(f"i{k}" for k in range(300))
    assert read_dir(tmp_path)[0] == records(1)[0].__dict__


def test_stream_is_bounded_and_reads_back(valkey_url: str, prefix: str) -> None:
    log = RedisStreamAudit(valkey_url, f"{prefix}:audit", maxlen=100, background=False)
    for k in range(0, 1000, 50):
        log.record(records(50, k))
    client = redis.Redis.from_url(valkey_url)
    length = client.xlen(f"{prefix}:audit")
    assert 100 <= length < 400, "trimmed to about maxlen"
    back = list(read_stream(client, f"{prefix}:audit", batch=7))
    assert back == records(length, 1000 - length)
    log.close()
    client.close()


class Broken(AuditLog):
    def write(self, records: Sequence[AuditRecord]) -> None:
        raise OSError("disk full")


class Slow(AuditLog):
    def write(self, records: Sequence[AuditRecord]) -> None:
        time.sleep(2)


class Raising:
    def record(self, records: Sequence[AuditRecord]) -> None:
        raise RuntimeError("bug in a sink")

    def close(self) -> None:
        """Nothing to release."""


def schedule_due(store: DelayStore, n: int, key: str) -> None:
    store.schedule_many((f"d{k}", 0.001 * k, RedisListTarget.envelope(key, b"%d" % k)) for k in range(n))


@pytest.fixture
def store(valkey_url: str, prefix: str) -> DelayStore:
    return make_store(valkey_url, prefix, shards=4)


def test_forwarder_logs_one_record_per_forwarded_item(store: DelayStore, prefix: str, tmp_path: Path) -> None:
    log = JsonLinesAudit(tmp_path, stem="forwarded")
    schedule_due(store, 500, f"{prefix}:out")
    forwarder = Forwarder(store, [RedisListTarget(store.client)], audit=log, name="fw-1")  # type: ignore[arg-type]
    before = store.server_time_ms()
    assert forwarder.run_once() == 500
    assert log.flush(10)
    rows = read_dir(tmp_path)
    assert sorted(r["id"] for r in rows) == sorted(f"d{k}" for k in range(500))
    ready = {f"d{k}": k for k in range(500)}
    for r in rows:
        assert (r["event"], r["target"], r["queue"], r["attempt"], r["by"]) == (
            "forwarded",
            "list",
            f"{prefix}:out",
            1,
            "fw-1",
        )
        assert r["ready_ms"] == ready[str(r["id"])] and r["at_ms"] >= before
    log.close()


@pytest.mark.parametrize("sink", [Broken(), Raising(), Slow(max_pending=1)], ids=["failing", "raising", "slow"])
def test_a_failing_or_slow_audit_never_touches_forwarding(store: DelayStore, prefix: str, sink: object) -> None:
    schedule_due(store, 300, f"{prefix}:out")
    # batch 10: a pass (4 shards) makes one audit call, so 8 calls, more than a slow sink holds
    forwarder = Forwarder(store, [RedisListTarget(store.client)], batch=10, audit=sink)  # type: ignore[arg-type]
    started = time.monotonic()
    assert forwarder.run_once() == 300
    assert time.monotonic() - started < 1.5, "the 2 s writes happen off the forwarding thread"
    assert store.client.llen(f"{prefix}:out") == 300
    assert forwarder.stats.acked == 300 and sum(s.scheduled for s in store.stats()) == 0
    # what could not be written is counted
    if isinstance(sink, Broken):
        assert sink.flush(10) and sink.failed == 300
    if isinstance(sink, Slow):
        assert sink.dropped > 0
