"""RQ in the audit: the forwarder records a scheduled job it moves, a real ``rq worker`` with the
audit worker class records its start, and the audit joins the two (an RQ job carries no ready
time of its own)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from delayq_backends import Config, DelayStore
from delayq_backends.audit import JsonLinesAudit
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from delayq_backends.spark.audit import audit
from tests.harness import Launcher
from tests.harness.rq import Processes
from tests.helpers import wait_for

pytestmark = pytest.mark.spark


def test_rq_job_is_forwarded_run_and_audited(
    spark: SparkSession, valkey_url: str, prefix: str, tmp_path: Path, procs: Launcher
) -> None:
    conn = redis.Redis.from_url(valkey_url)
    store = DelayStore(conn, Config(prefix=prefix, shards=4))
    queue = Queue(f"{prefix}-q", connection=conn, delay_store=store)
    job = queue.enqueue_in(timedelta(milliseconds=200), "tests.test_rq.jobs.record", "audited")
    log = JsonLinesAudit(tmp_path, stem="forwarded")
    forwarder = Forwarder(store, [RQTarget(conn)], audit=log)
    wait_for(lambda: forwarder.run_once() == 1, 10, "the job to fall due and be moved")
    assert log.flush(10)

    processes = Processes(procs, valkey_url, prefix)
    processes.env["DELAYQ_AUDIT_DIR"] = str(tmp_path)
    worker = processes.start(
        "-m", "rq.cli", "worker", "-u", valkey_url, "--burst", "--queue-class", "delayq_backends.rq.Queue",
        "--worker-class", "delayq_backends.rq.audit.AuditWorker", queue.name,
    )  # fmt: skip
    try:
        assert worker.wait(timeout=60) == 0
    finally:
        processes.stop_all()
    records = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    executed = [r for r in records if r["event"] == "executed"]
    assert [(r["id"], r["target"], r["queue"], r["ready_ms"]) for r in executed] == [(job.id, "rq", queue.name, None)]

    result = audit(spark, forwarded=str(tmp_path), executed=str(tmp_path))
    assert result.anomaly_counts() == dict.fromkeys(result.ANOMALIES, 0)
    assert {r["stage"]: r["count"] for r in result.overall.collect()} == {"forwarding": 1, "execution": 1}
    log.close()
    conn.close()
