"""One local Spark session for every Spark test (``local[2]``, no UI, 2 shuffle partitions).

Starting a session costs seconds, so it is session-scoped; each test uses its own store prefix
and queue names instead of a fresh session. Without Java the Spark tests skip, and fail instead
when ``DELAYQ_REQUIRE_SPARK=1`` (CI sets it).
"""

from __future__ import annotations

import os
import shutil
from typing import Iterator

import pytest
from pyspark.sql import SparkSession

from delayq_backends.spark.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        message = "the Spark tests need Java 17+ (Spark 4): install a JDK or set JAVA_HOME"
        if os.environ.get("DELAYQ_REQUIRE_SPARK") == "1":
            pytest.fail(f"{message}; DELAYQ_REQUIRE_SPARK=1 requires them")
        pytest.skip(message)
    session = local_session("local[2]", shuffle_partitions=2)
    yield session
    session.stop()
