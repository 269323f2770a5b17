"""Bulk scheduling from a Spark DataFrame: one row, one delayed job, written by the executors.

Each partition opens its own store connection and target writer, checks every row, and sends
the good ones in pipelined :meth:`DelayStore.schedule_checked` batches; bad rows come back with
their reason. Rows cross into Python as Arrow batches (``mapInArrow``), which costs far less per
row than pickled ``Row`` objects. Ids make it idempotent: running the same job again (after a
failure, or a retried Spark task) stores each id once, keeping (``keep``) or moving
(``replace``) what is already there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..config import Config
from ..connection import connect
from ..envelope import parse_groups
from ..errors import ConfigError, DelayqError, InvalidTimeError
from ..keys import normalize_id
from ..models import ScheduleCounts, ScheduleItem
from ..store import DelayStore, check_rank
from ..timeutil import When, parse_iso, to_ms
from .rows import Accepted, RowKind, RowWriter

__all__ = ["BulkResult", "schedule_dataframe"]

#: Rows per ``schedule_checked`` call on an executor (it pipelines 500 per shard and script call).
DEFAULT_BATCH = 5000

_OUT = pa.schema(
    [
        ("kind", pa.string()),
        ("id", pa.string()),
        ("ready_at", pa.string()),
        ("error", pa.string()),
        ("reason", pa.string()),
        ("added", pa.int64()),
        ("replaced", pa.int64()),
        ("kept", pa.int64()),
    ]
)
_OUT_DDL = "kind string, id string, ready_at string, error string, reason string, added long, replaced long, kept long"


@dataclass(frozen=True)
class BulkResult:
    """What :func:`schedule_dataframe` did.

    Attributes:
        counts: ids newly added, replaced (``replace``) and kept as they were (``keep``).
        rejected: rows not scheduled.
        rejects: those rows: ``id``, ``ready_at`` (as text), ``error`` (the error class) and ``reason``.
    """

    counts: ScheduleCounts
    rejected: int
    rejects: DataFrame

    @property
    def scheduled(self) -> int:
        """Rows now in the store (added + replaced + kept)."""
        return self.counts.total


def schedule_dataframe(
    df: DataFrame,
    *,
    url: str,
    target: RowKind,
    id_col: str,
    ready_at_col: str,
    prefix: str = "delayq",
    shards: int = 16,
    mode: str = "keep",
    batch: int = DEFAULT_BATCH,
    rank_col: str | None = None,
    group_col: str | None = None,
) -> BulkResult:
    """Schedule one delayed job per row of ``df``, from the executors.

    Args:
        df: the rows.
        url, prefix, shards: the delay store.
        target: a :class:`~delayq_backends.spark.CeleryTask`, :class:`~delayq_backends.spark.RQJob`
            or :class:`~delayq_backends.spark.ListTarget`.
        id_col: the item (task/job) id: text, unique per job. The same id scheduled again is kept
            or replaced, never duplicated.
        ready_at_col: when: a timestamp, ISO 8601 text with an offset, or epoch seconds.
        mode: ``keep`` (ids already scheduled stay as they are) or ``replace`` (they move).
        batch: rows per ``schedule_checked`` call on an executor.
        rank_col: an integer column of store ranks (0..255, higher is forwarded first under a
            backlog; null means 0); without it every row has rank 0. A bad rank rejects the row.
        group_col: a column of each row's groups (see :class:`~delayq_backends.envelope.Group`):
            a string (the group's key), a struct with ``key`` and any of ``limit``, ``rate``,
            ``weight``, ``cost`` (a null field is unset), or an array of up to 3 of either; null
            means no group. A bad group rejects the row (``InvalidGroupError``, saying why).

    Raises:
        ConfigError: a missing column, a naive timestamp column type, or a bad option.
    """
    if mode not in ("keep", "replace"):
        raise ConfigError(f"mode={mode!r}: use 'keep' (re-runs leave scheduled ids alone) or 'replace'")
    if batch < 1:
        raise ConfigError(f"batch={batch}: use a positive number of rows per store call")
    config = Config(url=url, prefix=prefix, shards=shards)
    _check_layout(config)
    rank = F.lit(0) if rank_col is None else F.col(_field(df, rank_col).name)
    group = F.lit(None) if group_col is None else F.col(_field(df, group_col).name)
    rows = df.select(
        F.col(id_col).cast("string"), _ready_column(df, ready_at_col), rank, group, *_target_columns(df, target)
    )
    run = _partition_runner(config, target, mode, batch)
    out = rows.mapInArrow(run, _OUT_DDL).localCheckpoint(eager=True)  # run once; rejects read from here
    totals = out.groupBy().agg(*(F.sum(c).alias(c) for c in ("added", "replaced", "kept"))).first()
    assert totals is not None  # a global aggregate always has its one row
    counts = ScheduleCounts(*(int(totals[c] or 0) for c in ("added", "replaced", "kept")))
    rejects = out.where(F.col("kind") == "reject").select("id", "ready_at", "error", "reason")
    return BulkResult(counts=counts, rejected=rejects.count(), rejects=rejects)


def _check_layout(config: Config) -> None:
    """Record or check the shard count on the driver, so a wrong one fails once, before any task."""
    store = DelayStore(connect(config.url), config)
    try:
        store.check_meta()
    finally:
        store.close()


def _ready_column(df: DataFrame, name: str) -> Any:
    """The ready time as the executors read it: an instant type becomes epoch seconds (exact to
    the microsecond); text and numbers pass as they are, a naive ``TIMESTAMP_NTZ`` too (rejected)."""
    kind = _field(df, name).dataType
    if isinstance(kind, T.TimestampType):
        return (F.unix_micros(F.col(name)) / F.lit(1_000_000)).alias(name)
    return F.col(name)


def _target_columns(df: DataFrame, target: RowKind) -> list[Any]:
    for name in target.columns:
        _field(df, name)
    return [F.col(c) if c is not None else F.lit(None).alias(f"_unused_{i}") for i, c in enumerate(target.columns)]


def _field(df: DataFrame, name: str | None) -> Any:
    if name is None:
        return None
    for f in df.schema.fields:
        if f.name == name:
            return f
    raise ConfigError(f"column {name!r} is not in the DataFrame (it has {df.columns}): pass an existing column")


def _partition_runner(
    config: Config, target: RowKind, mode: str, batch: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each partition runs (shipped to executors: it closes over plain values only)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = DelayStore(connect(config.url), config)
        writer = target.open(store)
        try:
            loader = _Loader(store, writer, mode, batch)
            for record_batch in batches:
                columns = [record_batch.column(i).to_pylist() for i in range(record_batch.num_columns)]
                rejects = loader.add_rows(zip(*columns)) if columns else []
                if rejects:
                    yield _rejects_batch(rejects)
            loader.send()
            c = loader.counts
            yield pa.RecordBatch.from_pylist(
                [{"kind": "counts", "added": c.added, "replaced": c.replaced, "kept": c.kept}], schema=_OUT
            )
        finally:
            writer.close()
            store.close()

    return run


class _Loader:
    """One partition's rows: checked one by one, sent in batches."""

    def __init__(self, store: DelayStore, writer: RowWriter, mode: str, batch: int) -> None:
        self.store = store
        self.writer = writer
        self.mode = mode
        self.batch = batch
        self.pending: list[Accepted] = []
        self.ranks: list[int] = []  # of the pending rows, in step
        self.counts = ScheduleCounts()

    def add_rows(self, rows: Iterator[tuple[Any, ...]]) -> list[tuple[Any, Any, DelayqError]]:
        rejects = []
        for raw_id, when, raw_rank, groups, *values in rows:
            try:
                item_id = normalize_id(raw_id)
                ready_ms = to_ms(_when(when))
                rank = check_rank(0 if raw_rank is None else raw_rank)
                data, keep = self.writer.prepare(
                    item_id, ready_ms, values, () if groups is None else parse_groups(groups)
                )
                data = self.store.check_payload(item_id, data)
            except DelayqError as exc:
                rejects.append((raw_id, when, exc))
                continue
            self.pending.append((item_id, ready_ms, data, keep))
            self.ranks.append(rank)
            if len(self.pending) >= self.batch:
                self.send()
        return rejects

    def send(self) -> None:
        if not self.pending:
            return
        self.writer.flush(self.pending)
        items = [
            ScheduleItem(item_id, ready_ms, data, rank)
            for (item_id, ready_ms, data, _), rank in zip(self.pending, self.ranks)
        ]
        self.counts += self.store.schedule_checked(items, mode=self.mode)
        self.pending, self.ranks = [], []


def _when(value: Any) -> When:
    """A row's ready time as :func:`to_ms` takes it; text is ISO 8601 (a ``Z`` suffix is UTC)."""
    if value is None:
        raise InvalidTimeError("the ready time is null: fill it, or filter such rows out first")
    if isinstance(value, str):
        # a naive time parses here and is refused by to_ms, with the same message as a naive datetime
        return parse_iso(value, zone_required=False)
    return value  # type: ignore[no-any-return]


def _rejects_batch(rejects: list[tuple[Any, Any, DelayqError]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "kind": "reject",
                "id": None if raw_id is None else str(raw_id),
                "ready_at": None if when is None else str(when),
                "error": type(exc).__name__,
                "reason": str(exc),
            }
            for raw_id, when, exc in rejects
        ],
        schema=_OUT,
    )
