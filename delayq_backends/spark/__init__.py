"""Spark pipelines: bulk scheduling from a DataFrame, and audits of what was scheduled, forwarded
and run.

- :func:`schedule_dataframe`: one delayed Celery task, RQ job or Redis-list item per row, written
  by the executors in pipelined batches; idempotent by id; bad rows come back with their reason.
- :func:`audit`: lateness percentiles per queue and hour, and the anomalies (never forwarded,
  forwarded or run twice, run early), as Parquet tables and a PNG/Markdown report.

Install with ``pip install "delayq_backends[spark]"``.
"""

from ..errors import MissingExtraError

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(f"delayq_backends.spark needs pyspark and pyarrow ({exc})", "spark") from exc

from .audit import AuditResult, audit, read_records, records_frame, snapshot_records
from .bulk import BulkResult, schedule_dataframe
from .rows import CeleryTask, ListTarget, RowError, RQJob
from .session import local_session

# the report (matplotlib) is imported where it is used: delayq_backends.spark.report.write_report
__all__ = [
    "AuditResult",
    "BulkResult",
    "CeleryTask",
    "ListTarget",
    "RQJob",
    "RowError",
    "audit",
    "local_session",
    "read_records",
    "records_frame",
    "schedule_dataframe",
    "snapshot_records",
]
