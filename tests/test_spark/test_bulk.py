"""Bulk scheduling from a DataFrame: every row stored once, exactly as the adapters store a call.

Real Valkey, local Spark. Celery messages are compared with what the plugin stores for the same
``send_task(eta=…)``; RQ jobs with what ``Queue.enqueue_at`` saves, and are moved by the real RQ
target.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from rq.job import Job, JobStatus

from delayq_backends import DelayStore, Envelope, ScheduleCounts
from delayq_backends.celery import StoredMessage, forget_store, install
from delayq_backends.cli import main
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from delayq_backends.spark import CeleryTask, ListTarget, RQJob, schedule_dataframe
from delayq_backends.timeutil import from_ms, now_ms
from tests.harness import make_store

pytestmark = pytest.mark.spark

N = 10_000
SHARDS = 4
TASK = "dqt.remind"


def reminders(spark: SparkSession, tag: str, base_ms: int, n: int = N) -> DataFrame:
    """``n`` rows: id ``<tag>-<i>``, ready at ``base_ms + 7 i`` ms, args ``[str(i), "ü"]``, kwargs ``{"n": i}``."""
    return spark.range(n).select(
        F.concat(F.lit(f"{tag}-"), F.col("id").cast("string")).alias("job_id"),
        F.timestamp_millis(F.lit(base_ms) + F.col("id") * 7).alias("at"),
        F.array(F.col("id").cast("string"), F.lit("ü")).alias("args"),
        F.create_map(F.lit("n"), F.col("id")).alias("kwargs"),
    )


def expected(tag: str, base_ms: int, n: int = N) -> dict[str, tuple[int, int]]:
    return {f"{tag}-{i}": (i, base_ms + 7 * i) for i in range(n)}


def stored(store: DelayStore) -> dict[str, Any]:
    items = list(store.scan())
    assert len(items) == len({i.id for i in items}), "each id is stored once"
    return {i.id: i for i in items}


@pytest.fixture
def store(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    s = make_store(valkey_url, prefix, shards=SHARDS)
    yield s
    s.client.close()


def run(df: DataFrame, valkey_url: str, prefix: str, target: Any, mode: str) -> Any:
    return schedule_dataframe(
        df, url=valkey_url, prefix=prefix, shards=SHARDS, target=target, id_col="job_id", ready_at_col="at", mode=mode
    )


# -- Celery -------------------------------------------------------------------------------------


def plugin_app(valkey_server: EmbeddedServer, prefix: str, queue: str) -> Celery:
    """An app with the plugin installed, as a producer would use it."""
    app = Celery("dqt-bulk", set_as_current=False)
    base = valkey_server.url.rsplit("/", 1)[0]
    app.conf.update(
        broker_url=f"{base}/1", delayq_url=valkey_server.url, delayq_prefix=prefix, delayq_shards=SHARDS,
        task_default_queue=queue,
    )  # fmt: skip
    install(app)
    return app


def test_celery_rows_are_stored_once_as_apply_async_stores_them(
    spark: SparkSession, valkey_server: EmbeddedServer, store: DelayStore, prefix: str
) -> None:
    tag, queue = uuid.uuid4().hex[:8], f"q-{prefix}"
    broker = f"{valkey_server.url.rsplit('/', 1)[0]}/1"
    target = CeleryTask(TASK, broker_url=broker, args_col="args", kwargs_col="kwargs", queue=queue)
    base = now_ms() + 3_600_000
    first = run(reminders(spark, tag, base), valkey_server.url, prefix, target, "keep")
    assert (first.counts, first.rejected) == (ScheduleCounts(added=N), 0)

    items = stored(store)
    assert set(items) == set(expected(tag, base))
    for item_id, (i, ready) in expected(tag, base).items():
        message = StoredMessage.from_envelope(Envelope.decode(items[item_id].envelope))
        assert items[item_id].ready_ms == ready
        assert (message.task_id, message.task, message.routing_key) == (item_id, TASK, queue)
        assert message.eta == from_ms(ready)
        assert json.loads(message.body)[:2] == [[str(i), "ü"], {"n": i}]

    # the same call through the plugin's apply_async path (another prefix): the same message
    other = f"{prefix}x"
    app = plugin_app(valkey_server, other, queue)
    item_id, (i, ready) = f"{tag}-42", expected(tag, base)[f"{tag}-42"]
    app.send_task(TASK, args=[str(i), "ü"], kwargs={"n": i}, eta=from_ms(ready), task_id=item_id, queue=queue)
    reference = make_store(valkey_server.url, other, shards=SHARDS).get(item_id)
    forget_store(app)
    assert reference is not None and reference.ready_ms == ready
    ours = StoredMessage.from_envelope(Envelope.decode(items[item_id].envelope))
    theirs = StoredMessage.from_envelope(Envelope.decode(reference.envelope))
    assert {k: v for k, v in ours.headers.items() if k != "origin"} == {
        k: v for k, v in theirs.headers.items() if k != "origin"
    }
    assert (ours.body, ours.exchange, ours.routing_key, ours.declare) == (
        theirs.body,
        theirs.exchange,
        theirs.routing_key,
        theirs.declare,
    )
    # reply_to is each app's own thread oid, as with any two producers
    assert {k: v for k, v in ours.properties.items() if k != "reply_to"} == {
        k: v for k, v in theirs.properties.items() if k != "reply_to"
    }

    # a re-run keeps every schedule; a replace moves every one (and its eta header)
    later = base + 60_000
    again = run(reminders(spark, tag, later), valkey_server.url, prefix, target, "keep")
    assert again.counts == ScheduleCounts(kept=N)
    assert {k: v.ready_ms for k, v in stored(store).items()} == {k: r for k, (_, r) in expected(tag, base).items()}
    moved = run(reminders(spark, tag, later), valkey_server.url, prefix, target, "replace")
    assert moved.counts == ScheduleCounts(replaced=N)
    after = stored(store)
    assert {k: v.ready_ms for k, v in after.items()} == {k: r for k, (_, r) in expected(tag, later).items()}
    sample = StoredMessage.from_envelope(Envelope.decode(after[f"{tag}-7"].envelope))
    assert sample.eta == from_ms(later + 49)


# -- RQ -----------------------------------------------------------------------------------------


def job_fields(job: Job) -> dict[str, Any]:
    """What a worker reads of a job, without what differs per creation (ids, timestamps)."""
    return {
        "func": job.func_name,
        "args": job.args,
        "kwargs": job.kwargs,
        "origin": job.origin,
        "status": job.get_status(refresh=False),
        "timeout": job.timeout,
        "result_ttl": job.result_ttl,
        "ttl": job.ttl,
    }


def test_rq_rows_are_saved_and_stored_as_enqueue_at_does_and_forwarded(
    spark: SparkSession, valkey_url: str, store: DelayStore, prefix: str
) -> None:
    tag, queue_name = uuid.uuid4().hex[:8], f"{prefix}-rq"
    conn = redis.Redis.from_url(valkey_url)
    target = RQJob("tests.test_rq.jobs.record", redis_url=valkey_url, queue=queue_name, args_col="args",
                   kwargs_col="kwargs")  # fmt: skip
    base = now_ms() + 3_600_000
    first = run(reminders(spark, tag, base), valkey_url, prefix, target, "keep")
    assert (first.counts, first.rejected) == (ScheduleCounts(added=N), 0)

    queue = Queue(queue_name, connection=conn, delay_store=store)
    items = stored(store)
    assert {k: v.ready_ms for k, v in items.items()} == {k: r for k, (_, r) in expected(tag, base).items()}
    assert {i.envelope for i in items.values()} == {queue.envelope().encode()}
    jobs = Job.fetch_many(list(items), connection=conn)
    assert all(job is not None for job in jobs), "every job hash is saved"
    by_id = {job.id: job for job in jobs if job is not None}
    for item_id, (i, _) in expected(tag, base).items():
        assert (by_id[item_id].args, by_id[item_id].kwargs) == ((str(i), "ü"), {"n": i})

    # the same job through Queue.enqueue_at: the same fields, and nothing in RQ's own registry that
    # an RQ scheduler would move (its entries are mirrors, beyond any "now")
    ready = datetime.fromtimestamp(base / 1000, tz=timezone.utc)
    reference = queue.enqueue_at(ready, "tests.test_rq.jobs.record", "0", "ü", n=0)
    assert job_fields(by_id[f"{tag}-0"]) == job_fields(Job.fetch(reference.id, connection=conn))
    assert job_fields(by_id[f"{tag}-0"])["status"] == JobStatus.SCHEDULED
    assert conn.zcount(f"rq:scheduled:{queue_name}", 0, time.time() + 10**9) == 0

    again = run(reminders(spark, tag, base + 60_000), valkey_url, prefix, target, "keep")
    assert again.counts == ScheduleCounts(kept=N)
    assert {k: v.ready_ms for k, v in stored(store).items() if k != reference.id} == {
        k: r for k, (_, r) in expected(tag, base).items()
    }
    moved = run(reminders(spark, tag, base + 60_000), valkey_url, prefix, target, "replace")
    assert moved.counts == ScheduleCounts(replaced=N)

    # the real RQ target moves bulk-scheduled jobs into their queue when due
    due = [f"{tag}-{i}" for i in range(5)]
    for item_id in due:  # due at the epoch: due on any clock (timedelta(0) raced the forwarder's by a ms)
        assert store.reschedule(item_id, 0)
    Forwarder(store, [RQTarget(conn)]).run_once()
    assert set(due) <= set(queue.job_ids)
    assert {Job.fetch(i, connection=conn).get_status() for i in due} == {JobStatus.QUEUED}
    conn.close()


# -- rejects ------------------------------------------------------------------------------------


def test_bad_rows_are_rejected_with_their_reason_and_good_rows_scheduled(
    spark: SparkSession, valkey_url: str, store: DelayStore, prefix: str
) -> None:
    big = "x" * (1024 * 1024 + 1)
    rows = [
        ("ok-1", "2030-01-01T09:00:00+01:00", "fine"),
        ("ok-2", "2030-01-01T08:00:00Z", "fine"),
        (None, "2030-01-01T09:00:00+00:00", "no id"),
        ("no-time", None, "x"),
        ("garbled", "next tuesday", "x"),
        ("naive", "2030-01-01T09:00:00", "x"),
        ("huge", "2030-01-01T09:00:00+00:00", big),
    ]
    df = spark.createDataFrame(rows, "job_id string, at string, body string")
    # epoch seconds are numbers; epoch milliseconds passed as seconds lie past year 9999
    numbers = spark.createDataFrame([("millis", 1893488400000.0, "x")], "job_id string, at double, body string")
    target = ListTarget(body_col="body", list_key=f"{prefix}:list")
    result = run(df, valkey_url, prefix, target, "keep")
    by_number = run(numbers, valkey_url, prefix, target, "keep")

    assert result.counts == ScheduleCounts(added=2)
    assert set(stored(store)) == {"ok-1", "ok-2"}
    assert stored(store)["ok-2"].ready_ms == stored(store)["ok-1"].ready_ms
    reasons = {r["id"]: (r["error"], r["reason"]) for r in result.rejects.collect()}
    assert result.rejected == len(reasons) == 5
    assert reasons[None][0] == "InvalidIdError"
    assert reasons["no-time"][0] == "InvalidTimeError" and "null" in reasons["no-time"][1]
    assert reasons["garbled"][0] == "InvalidTimeError" and "cannot parse" in reasons["garbled"][1]
    assert reasons["naive"][0] == "InvalidTimeError" and "naive" in reasons["naive"][1]
    assert reasons["huge"][0] == "PayloadTooLargeError" and "max_payload_bytes" in reasons["huge"][1]
    (number,) = by_number.rejects.collect()
    assert by_number.counts == ScheduleCounts() and number["error"] == "InvalidTimeError"
    assert "milliseconds" in number["reason"]

    # a TIMESTAMP_NTZ column holds wall-clock times with no zone: naive, so each row is refused
    ntz = spark.createDataFrame([("ntz", datetime(2030, 1, 1, 9), "x")], "job_id string, at timestamp_ntz, body string")
    (naive,) = run(ntz, valkey_url, prefix, target, "keep").rejects.collect()
    assert naive["error"] == "InvalidTimeError" and "naive" in naive["reason"]


# -- the command line ---------------------------------------------------------------------------


def test_cli_schedules_a_parquet_dataset_and_writes_rejects(
    spark: SparkSession, valkey_url: str, store: DelayStore, prefix: str, tmp_path: Path
) -> None:
    rows = [(f"cli-{i}", f"2030-01-01T09:00:{i:02d}+00:00", f"body {i}") for i in range(50)] + [("bad", "soon", "x")]
    source = str(tmp_path / "rows.parquet")
    spark.createDataFrame(rows, "job_id string, at string, body string").write.parquet(source)
    runner = CliRunner()
    common = ["spark", "schedule", source, "--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS),
              "--id-col", "job_id", "--ready-col", "at"]  # fmt: skip
    both = runner.invoke(main, [*common, "--list-key", "L", "--body-col", "body", "--rq-func", "f"])
    assert both.exit_code == 2 and "choose one target" in both.output
    done = runner.invoke(main, [*common, "--list-key", "L", "--body-col", "body", "--rejects", str(tmp_path / "rej")])
    assert done.exit_code == 0, done.output
    assert "added 50, replaced 0, kept 0, rejected 1" in done.output
    assert {i.id for i in stored(store).values()} == {f"cli-{i}" for i in range(50)}
    (reject,) = spark.read.parquet(str(tmp_path / "rej")).collect()
    assert (reject["id"], reject["error"]) == ("bad", "InvalidTimeError")


def test_rank_column_gives_rows_their_rank_and_bad_ranks_are_rejected(
    spark: SparkSession, valkey_url: str, store: DelayStore, prefix: str
) -> None:
    rows = [("high", 9), ("plain", 0), ("null", None), ("negative", -1), ("too-high", 256)]
    df = spark.createDataFrame(
        [(i, "2030-01-01T09:00:00Z", "x", r) for i, r in rows], "job_id string, at string, body string, prio int"
    )
    target = ListTarget(body_col="body", list_key=f"{prefix}:list")
    result = schedule_dataframe(
        df, url=valkey_url, prefix=prefix, shards=SHARDS, target=target, id_col="job_id", ready_at_col="at",
        rank_col="prio",
    )  # fmt: skip
    assert result.counts == ScheduleCounts(added=3)
    assert {i: store.rank(i) for i in ("high", "plain", "null")} == {"high": 9, "plain": 0, "null": 0}
    assert {r["id"]: r["error"] for r in result.rejects.collect()} == {
        "negative": "InvalidRankError",
        "too-high": "InvalidRankError",
    }
