"""The pytest plugin of the harness (loaded by ``tests/conftest.py``): server, store and
process fixtures shared by every test package."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from delayq_backends import DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer
from tests.harness.launch import Launcher
from tests.harness.rq import Processes
from tests.harness.servers import (
    AMQP_URL,
    SYNC_AT_ONCE,
    SYSTEM_REDIS,
    amqp_problem,
    delete_prefix,
    flush_scripts,
    make_store,
    reachable,
)

BACKENDS = ["valkey", "redis", pytest.param("cluster", marks=pytest.mark.cluster)]


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(masters=3, replicas=1, args=SYNC_AT_ONCE) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def system_redis_url() -> str:
    if not reachable(SYSTEM_REDIS):
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


#: the shared servers a test's keys are deleted from, named by the fixtures that give their URL
SHARED_SERVERS = ("valkey_url", "server_url", "system_redis_url")


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A key prefix of the test's own. Afterwards its keys are deleted from every shared server
    the test asked for, so whatever made them (``make_store``, a forwarder process) cleans up."""
    name = f"t{uuid.uuid4().hex[:12]}"
    urls = [str(request.getfixturevalue(f)) for f in SHARED_SERVERS if f in request.fixturenames]
    yield name
    for url in urls:
        client = connect(url)
        try:
            delete_prefix(client, name)
        finally:
            client.close()


@pytest.fixture
def store(server_url: str, prefix: str) -> Iterator[DelayStore]:
    """A store with a fresh prefix on each real server kind, its scripts flushed first (on the
    worker's own servers) so the NOSCRIPT reload path runs too (the ``prefix`` fixture deletes its keys)."""
    s = make_store(server_url, prefix, shards=4)
    flush_scripts(s.client, server_url)
    yield s
    s.client.close()


@pytest.fixture
def vstore(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    """A 4-shard store on the embedded Valkey, for the CLI tests that drive it through DELAYQ_* env vars."""
    s = make_store(valkey_url, prefix, shards=4)
    yield s
    s.client.close()


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    problem = amqp_problem(AMQP_URL)
    if problem:
        message = f"RabbitMQ at {AMQP_URL} is not reachable ({problem})"
        if os.environ.get("DELAYQ_REQUIRE_RABBITMQ") == "1":
            pytest.fail(f"{message}, and DELAYQ_REQUIRE_RABBITMQ=1 requires it")
        pytest.skip(message)
    return AMQP_URL


@pytest.fixture
def procs() -> Iterator[Launcher]:
    """The test's subprocesses: each is killed (resumed first if stopped) at teardown."""
    launcher = Launcher()
    yield launcher
    launcher.stop_all()


@pytest.fixture
def processes(valkey_url: str, prefix: str, procs: Launcher) -> Processes:
    """Real `rq worker` and `delayq forward` processes on the embedded Valkey, stopped at teardown."""
    return Processes(procs, valkey_url, prefix)
