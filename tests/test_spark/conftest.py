"""Spark for the tests: one local session (``local[2]``, no UI, 2 shuffle partitions), and a
standalone cluster (a master and two workers, ``spark://``) for the tests that need executors in
their own JVMs.

Both are session-scoped, since starting them costs seconds; each test uses its own store prefix
and queue names instead. Without Java the Spark tests skip, and fail instead when
``DELAYQ_REQUIRE_SPARK=1`` (CI sets it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from delayq_backends.spark.session import local_session
from tests.test_spark.standalone import SparkStandalone


def require_java() -> None:
    """Skip without Java, or fail when DELAYQ_REQUIRE_SPARK=1."""
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        message = "the Spark tests need Java 17+ (Spark 4): install a JDK or set JAVA_HOME"
        if os.environ.get("DELAYQ_REQUIRE_SPARK") == "1":
            pytest.fail(f"{message}; DELAYQ_REQUIRE_SPARK=1 requires them")
        pytest.skip(message)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    require_java()
    session = local_session("local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_standalone() -> Iterator[SparkStandalone]:
    """A running standalone cluster on loopback: its ``url`` is the ``spark://`` master URL."""
    require_java()
    with SparkStandalone(workers=2, cores=1, memory="1g") as cluster:
        yield cluster
