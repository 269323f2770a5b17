"""``BeatLazyFunc`` arguments with real processes: ``celery -A … delayq forward`` evaluates
``time.time()`` at each send, and a real worker on a Redis broker sees a fresh value per run;
``delayq forward --celery-broker`` (no app) never sends the entry and logs the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq_backends.celery import forget_store, store_for
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.periodic import ops
from tests.helpers import wait_for
from tests.test_celery.conftest import broker_url_for
from tests.test_celery.harness import CeleryEnv, delayq_cli, new_env, running


@pytest.fixture
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path) -> Iterator[CeleryEnv]:
    env = new_env("redis", broker_url_for("redis", request, valkey_server), valkey_server)
    env.app_module = "tests.test_celery.lazy_app"
    with running(env, tmp_path, via_celery=True):
        yield env


def _runs(env: CeleryEnv) -> list[dict[str, Any]]:
    return [r for r in env.records() if r["tag"] == "lazy"]


def test_each_run_sees_the_time_of_its_own_send(env: CeleryEnv) -> None:
    wait_for(lambda: len(_runs(env)) >= 3, 20, "three runs of the lazy entry")
    runs = _runs(env)[:3]
    sent = [r["kwargs"]["at"] for r in runs]
    assert len(set(sent)) == 3 and sent == sorted(sent), "a fresh value per run"
    for run, at in zip(runs, sent):
        assert isinstance(at, float)
        assert 0 <= run["started_ms"] - at * 1000 < 2000, "evaluated at its send, not at the sync"


def test_a_forwarder_without_the_app_never_sends_it_and_logs_the_fix(
    request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    env = new_env("redis", broker_url_for("redis", request, valkey_server), valkey_server)
    env.app_module = "tests.test_celery.lazy_app"
    with running(env, tmp_path):  # `delayq forward --celery-broker`: no app, no user code
        synced = delayq_cli(env, "periodic", "sync")
        assert synced.returncode == 0, synced.stderr
        log = tmp_path / "forwarder.log"
        fix = "run `celery -A proj delayq forward` to fire it"
        wait_for(lambda: log.read_text().count(fix) >= 2, 20, "two refused firings, logged with the fix")
        assert _runs(env) == [], "never sent with unevaluated arguments"
        app = env.app()
        try:
            status = ops.get(store_for(app), "lazy")
        finally:
            forget_store(app)
        assert status is not None and status.state != "missing", "waiting, not dead-lettered"
