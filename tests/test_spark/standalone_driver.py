"""The driver of the Spark standalone test, run as its own process (``python -m``) so its
``spark://`` session does not collide with the session-wide ``local[2]`` one in the pytest process.

It starts one session (a JVM and two executors take tens of seconds on a busy machine, so it is
started once) and then answers JSON requests, one per line on stdin, with one JSON line on stdout:

- ``{"command": "schedule", "url", "prefix", "shards", "tag", "n", "ready_ms", "list_key",
  "snapshot"}``: ``schedule_dataframe`` of list items into the store, from the executors, then
  a snapshot of the store written as audit records to ``snapshot``;
- ``{"command": "audit", "snapshot", "forwarded": [dirs], "as_of_ms"}``: the audit of the
  snapshot against each directory of forwarder records.

An error is answered as ``{"error": "<traceback>"}``. It exits at the end of stdin.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from delayq_backends.spark import ListTarget, schedule_dataframe
from delayq_backends.spark.audit import audit, snapshot_records
from tests.harness import make_store

ROOT = Path(__file__).resolve().parents[2]


def session(master: str) -> SparkSession:
    """A driver on ``master`` whose executors (one core, 512 MB each) run this interpreter and this tree."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName("delayq-standalone-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        # the first job waits until both executors have registered (up to a minute)
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "60s")
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _executor_jvm(_: Any) -> tuple[int, bool]:
    """Run in a Python worker: the pid of the JVM above it, and whether it is an executor."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as stat:
            ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/cmdline", "rb") as cmdline:
            args = cmdline.read()
        if b"java" in args.split(b"\0")[0]:
            return ppid, b"CoarseGrainedExecutorBackend" in args
        pid = ppid
    return 0, False


def schedule(spark: SparkSession, args: Any) -> dict[str, Any]:
    started = time.monotonic()
    jvms = sorted(set(spark.sparkContext.parallelize(range(16), 16).map(_executor_jvm).collect()))
    df = (
        spark.range(args.n)
        .repartition(4)
        .select(
            F.concat(F.lit(f"{args.tag}-"), F.col("id").cast("string")).alias("job_id"),
            F.timestamp_millis(F.lit(args.ready_ms) + F.col("id")).alias("at"),
            F.concat(F.lit("body-"), F.col("id").cast("string")).alias("body"),
        )
    )
    result = schedule_dataframe(
        df,
        url=args.url,
        prefix=args.prefix,
        shards=args.shards,
        target=ListTarget(body_col="body", list_key=args.list_key),
        id_col="job_id",
        ready_at_col="at",
    )
    store = make_store(args.url, args.prefix, shards=args.shards)
    with open(args.snapshot, "w", encoding="utf-8") as out:
        out.writelines(record.to_json() + "\n" for record in snapshot_records(store))
    return {
        "added": result.counts.added,
        "scheduled": result.scheduled,
        "rejected": result.rejected,
        "executor_jvms": jvms,
        "driver_pid": os.getpid(),
        "master": spark.sparkContext.master,
        "seconds": round(time.monotonic() - started, 1),
    }


def audit_dirs(spark: SparkSession, args: Any) -> dict[str, Any]:
    reports = {}
    for directory in args.forwarded:
        result = audit(
            spark, scheduled=args.snapshot, forwarded=directory, as_of_ms=args.as_of_ms, grace_ms=0, late_ms=600_000
        )
        overall = {row["stage"]: row["count"] for row in result.overall.collect()}
        reports[directory] = {"anomalies": result.anomaly_counts(), "overall": overall}
    return reports


def main() -> None:
    spark = session(sys.argv[1])
    commands = {"schedule": schedule, "audit": audit_dirs}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = commands[request.pop("command")](spark, SimpleNamespace(**request))
        except Exception:
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
