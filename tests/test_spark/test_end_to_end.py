"""From a DataFrame to a worker and back into an audit: rows scheduled by Spark are forwarded by a
real ``delayq forward`` and run by a real ``celery worker`` (Redis broker), both writing the audit
log; the audit of those logs finds every job on time and no anomaly."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from delayq_backends.embedded import EmbeddedServer
from delayq_backends.spark import BulkResult, CeleryTask, schedule_dataframe
from delayq_backends.spark.audit import audit, records_frame, snapshot_records
from delayq_backends.timeutil import now_ms
from tests.harness import make_store
from tests.helpers import wait_for
from tests.test_celery.conftest import broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, running

pytestmark = pytest.mark.spark

N = 300
LEAD_MS = 10_000  # time to schedule and take the snapshot before the first item is due


@pytest.fixture
def celery_env(
    request: pytest.FixtureRequest,
    valkey_server: EmbeddedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[CeleryEnv]:
    """A worker recording task starts and a forwarder recording forwards, to one audit directory."""
    monkeypatch.setenv("DELAYQ_AUDIT_DIR", str(tmp_path / "audit"))
    env = new_env("redis", broker_url_for("redis", request, valkey_server), valkey_server)
    env.app_module = "tests.test_spark.worker_app"
    with running(env, tmp_path):
        yield env


def audit_lines(directory: Path, event: str) -> list[dict[str, object]]:
    lines = (line for f in directory.glob("*.jsonl") for line in f.read_text().splitlines())
    return [r for r in map(json.loads, lines) if r["event"] == event]


def test_spark_rows_run_once_on_time_and_audit_clean(
    spark: SparkSession, celery_env: CeleryEnv, tmp_path: Path
) -> None:
    env, tag, logs = celery_env, f"spark-{uuid.uuid4().hex[:6]}", tmp_path / "audit"
    target = CeleryTask("dqt.record", broker_url=env.broker, args_col="args", queue=env.queue)

    def schedule(prefix: str, start: int) -> BulkResult:
        df = spark.range(N).select(
            F.concat(F.lit(f"{tag}-"), F.col("id").cast("string")).alias("task_id"),
            F.timestamp_millis(F.lit(start) + F.col("id") * 10).alias("ready_at"),
            F.array(F.lit(tag), F.col("id").cast("string")).alias("args"),
        )
        return schedule_dataframe(
            df, url=env.store, prefix=prefix, shards=4, target=target, id_col="task_id", ready_at_col="ready_at"
        )

    schedule(f"{env.prefix}-warm-up", now_ms() + 3_600_000)  # a cold JVM's first job can take seconds
    start = now_ms() + LEAD_MS
    result = schedule(env.prefix, start)
    assert (result.counts.added, result.rejected) == (N, 0)
    snapshot = list(snapshot_records(make_store(env.store, env.prefix, shards=4)))
    assert now_ms() < start, f"scheduling took over {LEAD_MS} ms: the snapshot may miss forwarded items"
    assert len(snapshot) == N

    wait_for(lambda: len([r for r in env.records() if r["tag"] == tag]) >= N, 60, f"{N} runs:\n{env.tail()}")
    runs = Counter(r["id"] for r in env.records() if r["tag"] == tag)
    assert set(runs) == {f"{tag}-{i}" for i in range(N)} and max(runs.values()) == 1
    wait_for(lambda: len(audit_lines(logs, "forwarded")) >= N, 10, "the forwarder's audit records")
    wait_for(lambda: len([r for r in audit_lines(logs, "executed") if r["id"] in runs]) >= N, 10, "the worker's")

    report = audit(spark, scheduled=records_frame(spark, snapshot), forwarded=str(logs), executed=str(logs))
    assert report.anomaly_counts() == dict.fromkeys(report.ANOMALIES, 0)
    overall = {r["stage"]: r["count"] for r in report.overall.collect()}
    assert overall == {"forwarding": N, "execution": N}
