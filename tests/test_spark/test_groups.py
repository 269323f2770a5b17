"""Bulk scheduling with ``group_col``: each row's groups (a key, a struct, or an array of up to 3)
are stored with it, where its worker reads them too (the Celery header, the RQ job's meta), as
the adapters store ``delayq_group``; a bad group rejects its row with the reason.

Real Valkey, local Spark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from pyspark.sql import DataFrame, SparkSession
from rq.job import Job

from delayq_backends import DelayStore, Envelope, ScheduleCounts, ScheduledItem
from delayq_backends.celery import GROUP_HEADER, StoredMessage
from delayq_backends.cli import main
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Group, groups_of
from delayq_backends.spark import CeleryTask, ListTarget, RQJob, schedule_dataframe
from tests.harness import make_store

pytestmark = pytest.mark.spark

SHARDS = 4
AT = "2030-01-01T09:00:00Z"


@pytest.fixture
def store(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    s = make_store(valkey_url, prefix, shards=SHARDS)
    yield s
    s.client.close()


def load(df: DataFrame, url: str, prefix: str, target: Any) -> Any:
    return schedule_dataframe(
        df, url=url, prefix=prefix, shards=SHARDS, target=target, id_col="job_id", ready_at_col="at", group_col="grp"
    )


def stored(store: DelayStore, item_id: str) -> ScheduledItem:
    item = store.get(item_id)
    assert item is not None, f"{item_id} is not stored"
    return item


def stored_groups(store: DelayStore, item_id: str) -> tuple[Group, ...]:
    return groups_of(Envelope.decode(stored(store, item_id).envelope))


def test_a_group_column_of_keys_structs_or_arrays_groups_each_row(
    spark: SparkSession, valkey_url: str, store: DelayStore, prefix: str
) -> None:
    target = ListTarget(body_col="body", list_key=f"{prefix}:list")
    keys = spark.createDataFrame(
        [("k", AT, "x", "tenant-7"), ("none", AT, "x", None), ("bad-key", AT, "x", "t}:batch")],
        "job_id string, at string, body string, grp string",
    )
    structs = spark.createDataFrame(
        [
            ("s", AT, "x", ("t-7", 2, "10/s", None, None)),
            ("s-cost", AT, "x", ("api", None, None, 3.0, 5)),
            ("bad-limit", AT, "x", ("t", 0, None, None, None)),
            ("bad-rate", AT, "x", ("t", None, "10/day", None, None)),
        ],
        "job_id string, at string, body string, grp struct<key:string,limit:int,rate:string,weight:double,cost:int>",
    )
    arrays = spark.createDataFrame(
        [
            ("a", AT, "x", ["tenant-7", "api"]),
            ("too-many", AT, "x", ["a", "b", "c", "d"]),
            ("twice", AT, "x", ["a", "a"]),
        ],
        "job_id string, at string, body string, grp array<string>",
    )
    results = [load(df, valkey_url, prefix, target) for df in (keys, structs, arrays)]
    assert [r.counts for r in results] == [ScheduleCounts(added=2), ScheduleCounts(added=2), ScheduleCounts(added=1)]
    rejects = {r["id"]: (r["error"], r["reason"]) for result in results for r in result.rejects.collect()}
    assert {i: e for i, (e, _) in rejects.items()} == dict.fromkeys(
        ("bad-key", "bad-limit", "bad-rate", "too-many", "twice"), "InvalidGroupError"
    )
    assert "limit" in rejects["bad-limit"][1] and "at most 3" in rejects["too-many"][1]
    assert {i: stored_groups(store, i) for i in ("k", "none", "s", "s-cost", "a")} == {
        "k": (Group("tenant-7"),),
        "none": (),
        "s": (Group("t-7", 2, "10/s"),),
        "s-cost": (Group("api", weight=3.0, cost=5),),
        "a": (Group("tenant-7"), Group("api")),
    }


def test_celery_and_rq_rows_carry_their_groups_where_the_worker_reads_them(
    spark: SparkSession, valkey_server: EmbeddedServer, store: DelayStore, prefix: str
) -> None:
    j1, j2 = f"{prefix}-j1", f"{prefix}-j2"  # RQ's job hashes outlive the test's prefix: ids of its own
    rows = spark.createDataFrame(
        [(j1, AT, ["x"], [("tenant-7", 2)]), (j2, AT, ["y"], None)],
        "job_id string, at string, args array<string>, grp array<struct<key:string,limit:int>>",
    )
    base = valkey_server.url.rsplit("/", 1)[0]
    celery = CeleryTask("dqt.record", broker_url=f"{base}/1", args_col="args", queue=f"{prefix}-q")
    assert load(rows, valkey_server.url, prefix, celery).counts == ScheduleCounts(added=2)
    messages = {i: StoredMessage.from_envelope(Envelope.decode(stored(store, i).envelope)) for i in (j1, j2)}
    assert messages[j1].headers[GROUP_HEADER] == [{"key": "tenant-7", "limit": 2}]
    assert GROUP_HEADER not in messages[j2].headers
    assert stored_groups(store, j1) == (Group("tenant-7", 2),)
    assert messages[j1].body == messages[j2].body.replace(b'"y"', b'"x"')  # the rest as without a group

    other = f"{prefix}r"
    rq = RQJob("tests.test_rq.jobs.record", redis_url=valkey_server.url, queue=f"{prefix}-rq", args_col="args")
    assert load(rows, valkey_server.url, other, rq).counts == ScheduleCounts(added=2)
    conn = redis.Redis.from_url(valkey_server.url)
    jobs = {i: Job.fetch(i, connection=conn) for i in (j1, j2)}
    assert jobs[j1].meta["delayq_group"] == [{"key": "tenant-7", "limit": 2}]
    assert "delayq_group" not in jobs[j2].meta
    rq_store = make_store(valkey_server.url, other, shards=SHARDS)
    assert stored_groups(rq_store, j1) == (Group("tenant-7", 2),) and stored_groups(rq_store, j2) == ()
    conn.delete(*(job.key for job in jobs.values()))


def test_cli_group_col(spark: SparkSession, valkey_url: str, store: DelayStore, prefix: str, tmp_path: Path) -> None:
    source = str(tmp_path / "rows.parquet")
    rows = [("c1", AT, "x", "tenant-7"), ("c2", AT, "y", None), ("bad", AT, "z", "")]
    spark.createDataFrame(rows, "job_id string, at string, body string, tenant string").write.parquet(source)
    done = CliRunner().invoke(
        main,
        ["spark", "schedule", source, "--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS),
         "--id-col", "job_id", "--ready-col", "at", "--list-key", "L", "--body-col", "body", "--group-col", "tenant"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "added 2, replaced 0, kept 0, rejected 1" in done.output and "printable text" in done.output
    assert stored_groups(store, "c1") == (Group("tenant-7"),) and stored_groups(store, "c2") == ()
