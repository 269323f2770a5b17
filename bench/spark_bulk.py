#!/usr/bin/env python
"""Spark benchmark: bulk scheduling from Parquet with Spark, against one Python process, against
Celery's own ``apply_async(eta=…)``, side by side in one run.

Run ``python bench/spark_bulk.py`` (1M rows, about 5 min on 2 cores), or ``--rows 200000`` for a
quicker look.
It starts its own Valkey (delay store and Celery's Redis broker), writes the rows to Parquet
once, and measures, in rows per second:

- Spark start-up (session and first job), reported apart from the rates;
- ``schedule_dataframe`` with Spark ``local[2]`` from Parquet, to a Redis list and to a Celery task
  (the message template per partition), and a second, idempotent ``keep`` run;
- a plain Python loop doing the same per-row work (the same target writers) and ``schedule_many``
  in batches of 5,000, in one process: to a Redis list (all rows) and to Celery (a sample);
- native Celery ``apply_async(eta=…)`` onto the Redis broker, one call per row (a sample: it is
  ~100x slower, so all rows would take tens of minutes).

JSON goes to stdout, progress to stderr, and a dated section is appended to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import redis

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from lib.report import RESULTS_PATH, code_digest, distribution, log, write_results  # noqa: E402

from delayq_backends import Config, DelayStore  # noqa: E402
from delayq_backends.connection import connect  # noqa: E402
from delayq_backends.embedded import EmbeddedServer  # noqa: E402
from delayq_backends.models import ScheduleCounts  # noqa: E402
from delayq_backends.spark import CeleryTask, ListTarget, schedule_dataframe  # noqa: E402
from delayq_backends.spark.rows import RowKind  # noqa: E402
from delayq_backends.spark.session import local_session  # noqa: E402
from delayq_backends.timeutil import now_ms  # noqa: E402

SHARDS = 16
TASK = "bench.remind"
QUEUE = "bench-reminders"
BATCH = 5000


def write_rows(spark: Any, rows: int, path: str) -> int:
    """``rows`` reminders due over the next day, as Parquet; returns the first ready ms."""
    from pyspark.sql import functions as F

    start = now_ms() + 3_600_000
    spark.range(rows).select(
        F.concat(F.lit("r-"), F.col("id").cast("string")).alias("id"),
        F.timestamp_millis(F.lit(start) + F.col("id") * 86).alias("ready_at"),
        F.array(F.col("id").cast("string"), F.lit("reminder")).alias("args"),
        F.to_json(F.struct(F.col("id").alias("user"))).alias("body"),
    ).repartition(4).write.mode("overwrite").parquet(path)
    return start


def spark_run(spark: Any, path: str, url: str, prefix: str, target: RowKind, mode: str = "keep") -> dict[str, Any]:
    df = spark.read.parquet(path)
    started = time.perf_counter()
    result = schedule_dataframe(
        df, url=url, prefix=prefix, shards=SHARDS, target=target, id_col="id", ready_at_col="ready_at", mode=mode
    )
    seconds = time.perf_counter() - started
    rows = result.counts.total + result.rejected
    return {"rows": rows, "seconds": round(seconds, 2), "rate": round(rows / seconds), "counts": result.counts.__dict__}


def loop_run(path: str, url: str, prefix: str, target: RowKind, limit: int | None) -> dict[str, Any]:
    """The executors' per-row work in one Python process: the target's writer and ``schedule_many``."""
    table = pq.read_table(path)
    if limit is not None:
        table = table.slice(0, limit)
    ids = table.column("id").to_pylist()
    ready = [int(t.timestamp() * 1000) for t in table.column("ready_at").to_pylist()]
    values = list(zip(*(table.column(c).to_pylist() for c in target.columns if c is not None)))
    store = DelayStore(connect(url), Config(url=url, prefix=prefix, shards=SHARDS))
    writer = target.open(store)
    counts = ScheduleCounts()
    started = time.perf_counter()
    for i in range(0, len(ids), BATCH):
        entries = []
        for item_id, ms, row in zip(ids[i : i + BATCH], ready[i : i + BATCH], values[i : i + BATCH]):
            data, _ = writer.prepare(item_id, ms, row)
            entries.append((item_id, ms / 1000, data))
        counts += store.schedule_many(entries, mode="keep")  # checks every entry, as a caller would
    seconds = time.perf_counter() - started
    writer.close()
    store.client.close()
    rate = round(len(ids) / seconds)
    return {"rows": len(ids), "seconds": round(seconds, 2), "rate": rate, "counts": counts.__dict__}


def native_run(broker: str, path: str, sample: int) -> dict[str, Any]:
    """Celery's own ``apply_async(eta=…)`` per row (no plugin), onto the Redis broker."""
    from celery import Celery

    app = Celery("bench-native", set_as_current=False)
    app.conf.update(broker_url=broker, task_default_queue=QUEUE)

    @app.task(name=TASK)
    def remind(*args: Any) -> None:
        """Never runs here: only sent."""

    table = pq.read_table(path).slice(0, sample)
    rows = zip(table.column("args").to_pylist(), table.column("ready_at").to_pylist())
    per_call_us = []
    started = time.perf_counter()
    for args, ready in rows:
        t = time.perf_counter()
        remind.apply_async(args, eta=ready.replace(tzinfo=timezone.utc) if ready.tzinfo is None else ready)
        per_call_us.append((time.perf_counter() - t) * 1e6)
    seconds = time.perf_counter() - started
    app.close()
    return {"rows": sample, "seconds": round(seconds, 2), "rate": round(sample / seconds),
            "per_call_us": distribution(per_call_us)}  # fmt: skip


def timed(what: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    log(f"{what} ...")
    result = work()
    log(f"{what}: {result['rate']:,} rows/s ({result['rows']:,} rows in {result['seconds']} s)")
    return result


def run(rows: int, loop_celery_rows: int, native_rows: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "code": code_digest(),
        "rows": rows,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    tmp = tempfile.mkdtemp(prefix="dq-spark-bench-")
    path = f"{tmp}/reminders.parquet"
    with EmbeddedServer() as valkey:
        url, broker = valkey.url, f"{valkey.url.rsplit('/', 1)[0]}/1"
        started = time.perf_counter()
        spark = local_session("local[2]")
        spark.range(1).count()
        report["spark_startup_s"] = round(time.perf_counter() - started, 2)
        log(f"Spark up in {report['spark_startup_s']} s; writing {rows:,} rows to Parquet")
        write_rows(spark, rows, path)
        to_list = ListTarget(body_col="body", list_key="bench:out")
        to_celery = CeleryTask(TASK, broker_url=broker, args_col="args", queue=QUEUE)
        results: dict[str, Any] = {}
        results["spark_list"] = timed("Spark -> list", lambda: spark_run(spark, path, url, "s-list", to_list))
        results["spark_celery"] = timed("Spark -> Celery", lambda: spark_run(spark, path, url, "s-cel", to_celery))
        results["spark_celery_rerun_keep"] = timed(
            "Spark -> Celery, re-run (keep)", lambda: spark_run(spark, path, url, "s-cel", to_celery)
        )
        results["loop_list"] = timed("loop -> list", lambda: loop_run(path, url, "l-list", to_list, None))
        results["loop_celery"] = timed(
            "loop -> Celery", lambda: loop_run(path, url, "l-cel", to_celery, loop_celery_rows)
        )
        results["native_apply_async"] = timed("apply_async(eta)", lambda: native_run(broker, path, native_rows))
        redis.Redis.from_url(broker).delete(QUEUE)
        spark.stop()
    report["results"] = results
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


LABELS = {
    "spark_list": "Spark `local[2]` from Parquet → list target",
    "spark_celery": "Spark `local[2]` from Parquet → Celery task",
    "spark_celery_rerun_keep": "same, re-run (`keep`: every id already there)",
    "loop_list": "Python loop, same writer + `schedule_many` → list",
    "loop_celery": "Python loop, same writer + `schedule_many` → Celery",
    "native_apply_async": "native Celery `apply_async(eta=…)`, Redis broker",
}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"## Spark bulk scheduling, {report['started']} (`bench/spark_bulk.py`, {report['rows']:,} rows)", "",
        f"Code digest {report['code']}; load average {report['loadavg_start']} at start, {report['loadavg_end']} at "
        "end (2 cores shared with other work). Spark start-up (session + first job): "
        f"{report['spark_startup_s']} s, not in the rates below.", "",
        "| path | rows | seconds | rows/s |", "|---|---:|---:|---:|",
    ]  # fmt: skip
    for key, label in LABELS.items():
        r = report["results"][key]
        lines.append(f"| {label} | {r['rows']:,} | {r['seconds']} | {r['rate']:,} |")
    native = report["results"]["native_apply_async"]["per_call_us"]
    lines += [
        "",
        f"Samples: the Celery loop and `apply_async` ran on the first rows only (as listed). "
        f"`apply_async` per call: p50 {native['p50']:.0f} / p99 {native['p99']:.0f} / max {native['max']:.0f} µs.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the Parquet file (Spark and list loop)")
    parser.add_argument("--loop-sample", type=int, default=200_000, help="rows of the Python loop to Celery")
    parser.add_argument("--native-sample", type=int, default=20_000, help="rows sent with apply_async(eta=…)")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    report = run(args.rows, min(args.rows, args.loop_sample), min(args.rows, args.native_sample))
    print(json.dumps(report, indent=2))
    if args.no_results:
        return 0
    write_results(RESULTS_PATH, markdown(report))
    log(f"appended to {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
