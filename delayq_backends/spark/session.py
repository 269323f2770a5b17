"""A local SparkSession for the CLI, the benchmark, the example and the tests.

On a cluster, pass your own session instead: every pipeline takes DataFrames.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["local_session"]


def local_session(master: str = "local[2]", *, shuffle_partitions: int = 4) -> SparkSession:
    """A small local session: no UI, few shuffle partitions, UTC, and (unless ``PYSPARK_PYTHON``
    says otherwise) this interpreter on the workers.

    The workers must run the interpreter that has delayq_backends installed; Spark's default
    (``python3`` on PATH) may lack it.
    """
    # PySpark starts its workers with PYSPARK_PYTHON (default: ``python3`` on PATH)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("delayq")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
