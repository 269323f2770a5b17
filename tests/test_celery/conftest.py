"""Real brokers (RabbitMQ, a Redis broker on the embedded Valkey), real ``celery worker`` and
``delayq forward`` subprocesses, and a sink of execution records.

RabbitMQ is the system one at 127.0.0.1:5672 (``DELAYQ_TEST_AMQP_URL`` overrides it). Its tests
skip when it is down, and fail instead when ``DELAYQ_REQUIRE_RABBITMQ=1`` (CI sets it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from delayq_backends.celery import forget_store
from delayq_backends.embedded import EmbeddedServer
from tests.test_celery.harness import CeleryEnv, new_env, running

BROKERS = ["redis", "rabbitmq"]
#: a Redis broker in the store's own database: the exactly-once hand-off (a module that runs it
#: too parametrizes ``celery_env`` with it)
HANDOFF = "redis-handoff"


def broker_url_for(kind: str, request: pytest.FixtureRequest, valkey: EmbeddedServer) -> str:
    if kind == "rabbitmq":
        return str(request.getfixturevalue("rabbitmq_url"))
    return f"{valkey.url.rsplit('/', 1)[0]}/{0 if kind == HANDOFF else 1}"


@pytest.fixture(scope="module", params=BROKERS)
def celery_env(
    request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryEnv]:
    """A running worker and forwarder on each broker in turn, shared by a module's tests."""
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    tmp = tmp_path_factory.mktemp(f"celery-{request.param}")
    # the Redis-broker runs start their forwarder through `celery -A … delayq forward`
    with running(env, tmp, via_celery=request.param != "rabbitmq"):  # deletes a RabbitMQ queue at the end
        yield env


@pytest.fixture(scope="module")
def app(celery_env: CeleryEnv) -> Iterator[Celery]:
    app = celery_env.app()
    yield app
    forget_store(app)
