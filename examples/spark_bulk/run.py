"""100k reminders from a DataFrame to a Celery worker, then an audit of what happened.

1. generate a DataFrame of reminders due over the next minute and schedule them with Spark;
2. take a snapshot of the store (what was scheduled);
3. run ``delayq forward`` and a ``celery worker``, both writing the audit log, until all ran;
4. audit the logs with Spark and write the report (Parquet, lateness.png, report.md).

Run ``python run.py`` (an embedded Valkey is started) or ``python run.py --url redis://…``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import webbrowser
from contextlib import ExitStack
from pathlib import Path

import redis
from pyspark.sql import functions as F

from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.spark import CeleryTask, schedule_dataframe
from delayq_backends.spark.audit import audit, records_frame, snapshot_records
from delayq_backends.spark.report import write_report
from delayq_backends.spark.session import local_session
from delayq_backends.timeutil import now_ms

HERE = Path(__file__).resolve().parent
PREFIX = "reminders"


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="Redis/Valkey for the store and the broker [embedded]")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--spread", type=float, default=60.0, help="seconds over which reminders fall due")
    parser.add_argument("--out", default=str(HERE / "out"))
    parser.add_argument("--open", action="store_true", help="open the report when done")
    args = parser.parse_args()
    out = Path(args.out)
    with ExitStack() as stack:
        url = args.url or stack.enter_context(EmbeddedServer()).url
        base = url.rsplit("/", 1)[0]
        env = {**os.environ, "DELAYQ_URL": f"{base}/0", "CELERY_BROKER_URL": f"{base}/1",
               "DELAYQ_PREFIX": PREFIX, "DELAYQ_AUDIT_DIR": str(out / "audit")}  # fmt: skip
        store = DelayStore(connect(f"{base}/0"), Config(prefix=PREFIX))
        sent = redis.Redis.from_url(f"{base}/0")
        sent.delete("reminders:sent")

        spark = local_session()
        lead_ms = 30_000  # time to schedule and snapshot before the first one is due
        start_ms = now_ms() + lead_ms
        step = args.spread * 1000 / args.rows
        df = spark.range(args.rows).select(
            F.concat(F.lit("reminder-"), F.col("id").cast("string")).alias("reminder_id"),
            F.timestamp_millis((F.lit(start_ms) + F.col("id") * step).cast("long")).alias("send_at"),
            F.array(F.col("id"), F.lit(0)).alias("args"),
        )
        target = CeleryTask("reminders.send", broker_url=env["CELERY_BROKER_URL"], args_col="args", queue="reminders")
        result = schedule_dataframe(
            df, url=f"{base}/0", prefix=PREFIX, id_col="reminder_id", ready_at_col="send_at", target=target
        )
        print(f"scheduled: {result.counts}, rejected {result.rejected}")
        scheduled = list(snapshot_records(store))
        print(
            f"snapshot: {len(scheduled)} scheduled; {max(0, start_ms - now_ms()) / 1000:.1f} s before the first is due"
        )

        out.mkdir(parents=True, exist_ok=True)
        procs = [
            start([sys.executable, "-m", "delayq_backends.cli", "forward", "--prefix", PREFIX, "--url", f"{base}/0",
                   "--celery-broker", env["CELERY_BROKER_URL"]], env, out / "forwarder.log"),
            start([sys.executable, "-m", "celery", "-A", "reminders", "worker", "-P", "threads", "-c", "8",
                   "-Q", "reminders", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"],
                  env, out / "worker.log"),
        ]  # fmt: skip
        deadline = time.monotonic() + lead_ms / 1000 + args.spread + 600
        while int(sent.get("reminders:sent") or 0) < args.rows and time.monotonic() < deadline:
            print(f"\rsent {int(sent.get('reminders:sent') or 0):,} of {args.rows:,}", end="", flush=True)
            time.sleep(1)
        print(f"\rsent {int(sent.get('reminders:sent') or 0):,} of {args.rows:,}")
        time.sleep(2)  # the last audit records are written by background threads
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)

        report = audit(
            spark,
            scheduled=records_frame(spark, scheduled),
            forwarded=str(out / "audit"),
            executed=str(out / "audit"),
        )
        paths = write_report(report, out / "report")
        print(paths["markdown"].read_text())
        if args.open:
            webbrowser.open(paths["png"].as_uri())
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
