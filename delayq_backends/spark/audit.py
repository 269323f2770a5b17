"""The audit pipeline: what was scheduled, forwarded and run, checked against each other in Spark.

Inputs are audit records (:class:`delayq_backends.audit.AuditRecord`, one schema for all three):
a snapshot of the store (``scheduled``, :func:`snapshot_records`), the forwarders' log
(``forwarded``) and the workers' log (``executed``). Out come lateness percentiles per stage,
queue and hour, and one table per kind of anomaly:

- ``never_forwarded``: scheduled, due more than ``grace_ms`` before ``as_of``, never forwarded;
- ``duplicate_forwards``: the same id and ready time forwarded more than once (a re-delivery);
- ``duplicate_executions``: the same id and attempt started more than once;
- ``early_executions``: started before its ready time;
- ``late_forwards``: forwarded more than ``late_ms`` after its ready time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass, fields

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..audit import EXECUTED, FORWARDED, AuditRecord
from ..errors import ConfigError
from ..store import DelayStore

__all__ = ["RECORD_SCHEMA", "AuditResult", "audit", "read_records", "records_frame", "snapshot_records"]

#: Event of the records a store snapshot yields.
SCHEDULED = "scheduled"

#: The schema of every audit input (the fields of :class:`AuditRecord`).
RECORD_SCHEMA = (
    "event string, id string, target string, queue string, ready_ms long, at_ms long, attempt long, by string"
)

#: Quantiles of the lateness tables, and their column names.
QUANTILES = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99}

Records = DataFrame | str | Sequence[str]


@dataclass(frozen=True)
class AuditResult:
    """The tables of one audit (Spark DataFrames, small enough to collect) and its parameters."""

    lateness: DataFrame
    overall: DataFrame
    never_forwarded: DataFrame
    duplicate_forwards: DataFrame
    duplicate_executions: DataFrame
    early_executions: DataFrame
    late_forwards: DataFrame
    as_of_ms: int
    late_ms: int

    #: The anomaly tables, in report order.
    ANOMALIES = ("never_forwarded", "duplicate_forwards", "duplicate_executions", "early_executions", "late_forwards")

    def tables(self) -> dict[str, DataFrame]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), DataFrame)}

    def anomaly_counts(self) -> dict[str, int]:
        """Rows of each anomaly table, counted in one Spark job."""
        tagged = [getattr(self, name).select(F.lit(name).alias("check")) for name in self.ANOMALIES]
        union = tagged[0]
        for more in tagged[1:]:
            union = union.unionByName(more)
        found = {row["check"]: row["count"] for row in union.groupBy("check").count().collect()}
        return {name: int(found.get(name, 0)) for name in self.ANOMALIES}


def snapshot_records(store: DelayStore) -> Iterator[AuditRecord]:
    """The store's scheduled items as ``scheduled`` records (``at_ms``: when the snapshot was read).

    Export one before the items fall due (``delayq spark export``): forwarded items leave the store.
    """
    from ..envelope import Envelope
    from ..errors import EnvelopeError

    now = store.clock()
    for item in store.scan():
        try:
            envelope = Envelope.decode(item.envelope)
            target, queue = envelope.target, envelope.destination
        except EnvelopeError:
            target, queue = "?", "?"
        yield AuditRecord(SCHEDULED, item.id, target, queue, item.ready_ms, now, item.attempts, "snapshot")


def read_records(spark: SparkSession, source: Records) -> DataFrame:
    """Audit records from JSON-lines files or directories (``--audit-dir``), or a DataFrame as is."""
    if isinstance(source, DataFrame):
        return source
    paths = [source] if isinstance(source, str) else list(source)
    if not paths:
        raise ConfigError("no audit input given: pass JSON-lines files or directories, or a DataFrame")
    return spark.read.schema(RECORD_SCHEMA).json(paths)


def records_frame(spark: SparkSession, records: Iterable[AuditRecord]) -> DataFrame:
    """A DataFrame of records held in memory (a snapshot, a stream read, a test's plants)."""
    return spark.createDataFrame([astuple(r) for r in records], RECORD_SCHEMA)


def audit(
    spark: SparkSession,
    *,
    forwarded: Records,
    scheduled: Records | None = None,
    executed: Records | None = None,
    as_of_ms: int | None = None,
    grace_ms: int = 60_000,
    late_ms: int = 30_000,
) -> AuditResult:
    """Check scheduled, forwarded and executed records against each other.

    Args:
        forwarded: the forwarders' records.
        scheduled: a store snapshot taken before the items fell due; without it nothing can be
            found missing.
        executed: the workers' records; without it only forwarding is checked.
        as_of_ms: the audit's "now" (default: the wall clock); items due after
            ``as_of_ms - grace_ms`` are not yet missing.
        late_ms: forwarding lateness above which a forward is listed as late.
    """
    as_of = as_of_ms if as_of_ms is not None else time.time_ns() // 1_000_000
    empty = spark.createDataFrame([], RECORD_SCHEMA)
    fwd = read_records(spark, forwarded).where(F.col("event") == FORWARDED)
    sched = read_records(spark, scheduled).where(F.col("event") == SCHEDULED) if scheduled is not None else empty
    exe = read_records(spark, executed).where(F.col("event") == EXECUTED) if executed is not None else empty
    # every table reads these again: keep them (audit logs are small next to Spark's memory)
    fwd, sched = fwd.cache(), sched.cache()
    exe = _with_ready(exe, fwd, sched).cache()
    stages = _lateness_rows(fwd, "forwarding").unionByName(_lateness_rows(exe, "execution"))
    due_before = as_of - grace_ms
    return AuditResult(
        lateness=_percentiles(stages, ["stage", "queue", "hour"]),
        overall=_percentiles(stages, ["stage"]),
        never_forwarded=sched.where(F.col("ready_ms") <= due_before)
        .join(fwd.select("id"), "id", "left_anti")
        .select("id", "target", "queue", "ready_ms"),
        duplicate_forwards=_repeated(fwd, ["id", "ready_ms"]),
        duplicate_executions=_repeated(exe, ["id", "attempt"]),
        early_executions=exe.where(F.col("at_ms") < F.col("ready_ms")).select(
            "id", "queue", "ready_ms", "at_ms", (F.col("ready_ms") - F.col("at_ms")).alias("early_ms"), "by"
        ),
        late_forwards=fwd.where(F.col("at_ms") - F.col("ready_ms") > late_ms).select(
            "id", "queue", "ready_ms", "at_ms", (F.col("at_ms") - F.col("ready_ms")).alias("late_ms"), "by"
        ),
        as_of_ms=as_of,
        late_ms=late_ms,
    )


def _with_ready(exe: DataFrame, fwd: DataFrame, sched: DataFrame) -> DataFrame:
    """Executions with a ready time: their own (Celery's eta), else the latest forward's, else
    the snapshot's (an RQ job carries none)."""
    known = (
        fwd.select("id", "ready_ms")
        .unionByName(sched.select("id", "ready_ms"))
        .groupBy("id")
        .agg(F.max("ready_ms").alias("known_ready_ms"))
    )
    return (
        exe.join(known, "id", "left")
        .withColumn("ready_ms", F.coalesce(F.col("ready_ms"), F.col("known_ready_ms")))
        .drop("known_ready_ms")
    )


def _lateness_rows(records: DataFrame, stage: str) -> DataFrame:
    return records.where(F.col("ready_ms").isNotNull()).select(
        F.lit(stage).alias("stage"),
        "queue",
        F.date_trunc("hour", F.timestamp_millis(F.col("ready_ms"))).alias("hour"),
        (F.col("at_ms") - F.col("ready_ms")).alias("lateness_ms"),
    )


def _percentiles(rows: DataFrame, keys: list[str]) -> DataFrame:
    quantiles = F.percentile_approx("lateness_ms", list(QUANTILES.values()), 10_000)
    return (
        rows.groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("count"), quantiles.alias("q"), F.max("lateness_ms").alias("max_ms"))
        .select(*keys, "count", *(F.col("q")[i].alias(name) for i, name in enumerate(QUANTILES)), "max_ms")
        .orderBy(*keys)
    )


def _repeated(records: DataFrame, keys: Sequence[str]) -> DataFrame:
    return (
        records.groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("times"), F.collect_set("by").alias("by"), F.min("queue").alias("queue"))
        .where(F.col("times") > 1)
    )
