"""Worker-side dedupe (``delayq_dedupe``) with real ``celery worker`` processes and real brokers.

Each test runs with dedupe on and off: off, the duplicate runs (so the test can fail); on, it
is dropped, and the worker's log says so.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from delayq_backends.embedded import EmbeddedServer
from tests.helpers import wait_for
from tests.test_celery.harness import ROOT, CeleryEnv, new_env, watched
from tests.test_celery.tasks import make_app


@pytest.fixture(params=[True, False], ids=["dedupe", "no-dedupe"])
def dedupe(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def _env(kind: str, broker: str, valkey: EmbeddedServer, dedupe: bool) -> CeleryEnv:
    env = new_env(kind, broker, valkey)
    env.dedupe = dedupe
    return env


def in_memory_app(valkey_server: EmbeddedServer, prefix: str) -> Celery:
    """An app with dedupe on, its broker and results in memory, its store on the Valkey."""
    return make_app(
        broker="memory://",
        store=valkey_server.url,
        prefix=prefix,
        queue="q",
        sink="s",
        backend="cache+memory://",
        records=valkey_server.url,
        dedupe=True,
    )


@pytest.fixture
def redis_env(valkey_server: EmbeddedServer, tmp_path: Path, dedupe: bool) -> Iterator[CeleryEnv]:
    """A worker on a Redis broker (the embedded Valkey's db 1), no forwarder."""
    with watched(_env("redis", f"{valkey_server.url.rsplit('/', 1)[0]}/1", valkey_server, dedupe)) as env:
        env.start_worker(tmp_path)
        yield env


@pytest.fixture
def rabbit_env(valkey_server: EmbeddedServer, rabbitmq_url: str, tmp_path: Path, dedupe: bool) -> Iterator[CeleryEnv]:
    """A worker on RabbitMQ; the test starts the forwarders."""
    with watched(_env("rabbitmq", rabbitmq_url, valkey_server, dedupe)) as env:
        env.start_worker(tmp_path)
        yield env


def runs_of(env: CeleryEnv, task_id: str) -> list[dict[str, Any]]:
    return [r for r in env.records() if r["id"] == task_id]


def drop_logged(env: CeleryEnv, task_id: str) -> bool:
    return any(f"[{task_id}] run 0 was started before" in log.read_text(errors="replace") for log in env.launcher.logs)


def settle(env: CeleryEnv, task_id: str, dedupe: bool) -> list[dict[str, Any]]:
    """Wait until the worker ran the first delivery and either dropped (dedupe) or ran the
    second; then the records of ``task_id``."""
    if dedupe:
        wait_for(lambda: drop_logged(env, task_id) and len(runs_of(env, task_id)) >= 1, 60, "the drop to be logged")
    else:
        wait_for(lambda: len(runs_of(env, task_id)) >= 2, 60, "both deliveries to run")
    return runs_of(env, task_id)


def test_the_same_task_delivered_twice_runs_once(redis_env: CeleryEnv, dedupe: bool) -> None:
    app = redis_env.app()
    task_id = str(uuid.uuid4())
    for _ in range(2):  # two messages of one task id and run, as a forwarder crash leaves them
        app.send_task("dqt.record", args=["twice"], task_id=task_id, queue=redis_env.queue)
    runs = settle(redis_env, task_id, dedupe)
    assert len(runs) == (1 if dedupe else 2)
    if dedupe:  # the first run's result stays: the dropped delivery stores none
        assert app.AsyncResult(task_id).get(timeout=10) == "twice"


def test_a_retry_still_runs(redis_env: CeleryEnv, tmp_path: Path) -> None:
    """``self.retry()`` republishes the id with retries + 1: a new run, never a duplicate."""
    redis_env.start_forwarder(tmp_path)  # the retries' countdowns wait in the store
    app = redis_env.app()
    result = app.send_task("dqt.flaky", args=["retry", 2, 0.1], queue=redis_env.queue)
    assert result.get(timeout=60) == "retry"
    assert sorted(r["retries"] for r in runs_of(redis_env, result.id)) == [0, 1, 2]


def test_a_store_out_of_reach_runs_the_task(valkey_server: EmbeddedServer, tmp_path: Path) -> None:
    """At-least-once: a worker that cannot record the start runs the task anyway, and says so."""
    env = _env("redis", f"{valkey_server.url.rsplit('/', 1)[0]}/1", valkey_server, True)
    env.store = "redis://127.0.0.1:1/0"  # nothing listens there
    try:
        env.start_worker(tmp_path)
        result = env.app().send_task("dqt.record", args=["unchecked"], queue=env.queue)
        wait_for(lambda: len(runs_of(env, result.id)) == 1, 60, "the task to run")
        wait_for(lambda: "runs unchecked (at-least-once)" in env.launcher.logs[0].read_text(), 10, "the warning")
    finally:
        env.stop()


def crash_between_publish_and_ack(env: CeleryEnv, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the test-only forwarder that SIGKILLs itself after the broker confirmed its publish."""
    log = tmp_path / "crashing-forwarder.log"
    env.launcher.logs.append(log)
    with log.open("wb") as out:
        return subprocess.run(
            [sys.executable, "-m", "tests.test_celery.crash_forwarder", env.store, env.prefix, env.broker],
            cwd=ROOT,
            env=env.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=90,
        )


def test_forwarder_killed_between_publish_and_ack_on_rabbitmq_runs_once(
    rabbit_env: CeleryEnv, tmp_path: Path, dedupe: bool
) -> None:
    app = rabbit_env.app()
    result = app.send_task("dqt.record", args=["crash"], countdown=1, queue=rabbit_env.queue)
    store = redis.Redis.from_url(rabbit_env.store)

    crashed = crash_between_publish_and_ack(rabbit_env, tmp_path)
    assert crashed.returncode == -9, rabbit_env.tail()
    wait_for(lambda: len(runs_of(rabbit_env, result.id)) == 1, 60, "the first delivery to run")
    assert any(store.scan_iter(f"{rabbit_env.prefix}:*:items")), "the crash left the item unacked in the store"

    rabbit_env.start_forwarder(tmp_path)  # claims it again once the dead forwarder's lease ends
    runs = settle(rabbit_env, result.id, dedupe)
    assert len(runs) == (1 if dedupe else 2)
    wait_for(lambda: not any(store.hlen(k) for k in store.scan_iter(f"{rabbit_env.prefix}:*:items")), 30, "the ack")


def test_dedupe_task_becomes_the_base_of_later_tasks(valkey_server: EmbeddedServer) -> None:
    from delayq_backends.celery import DedupeTask

    def app_of(dedupe: bool) -> Any:
        return make_app(
            broker="memory://",
            store=valkey_server.url,
            prefix="dqt-base",
            queue="q",
            sink="s",
            backend="cache+memory://",
            records=valkey_server.url,
            dedupe=dedupe,
        )

    assert isinstance(app_of(True).tasks["dqt.record"], DedupeTask)
    assert not isinstance(app_of(False).tasks["dqt.record"], DedupeTask)


@pytest.mark.parametrize(
    ("name", "value"), [("delayq_dedupe", "yes"), ("delayq_dedupe_ttl", 0), ("delayq_dedupe_ttl", True)]
)
def test_a_bad_dedupe_setting_is_refused_by_name(name: str, value: Any) -> None:

    from delayq_backends.celery import CelerySettings
    from delayq_backends.errors import ConfigError

    app = Celery("bad", broker="redis://127.0.0.1:1/0")
    app.conf[name] = value
    with pytest.raises(ConfigError, match=name):
        CelerySettings.of(app)


def test_should_run_decides_by_run_and_lets_a_broker_redelivery_through(
    valkey_server: EmbeddedServer, prefix: str
) -> None:
    """The decision alone, on a real server: first start runs, a second start of the same run is
    dropped, the next run (a retry) runs, and a broker re-delivery of an acks_late task runs
    without touching the record (Celery's at-least-once for a worker that died mid-task)."""
    from types import SimpleNamespace

    from delayq_backends.celery import forget_store
    from delayq_backends.celery.dedupe import guard_for, should_run

    app = in_memory_app(valkey_server, prefix)
    task_id = str(uuid.uuid4())

    def request(retries: int, redelivered: bool = False) -> SimpleNamespace:
        return SimpleNamespace(
            id=task_id, task="dqt.record", retries=retries, delivery_info={"redelivered": redelivered}, is_eager=False
        )

    try:
        assert should_run(app, request(0), acks_late=False)
        assert not should_run(app, request(0), acks_late=False)
        assert should_run(app, request(0, redelivered=True), acks_late=True)
        assert not should_run(app, request(0, redelivered=True), acks_late=False)  # acked early: not Celery's
        assert should_run(app, request(1), acks_late=False)
        guard = guard_for(app)
        assert guard is not None
        key = guard.key(task_id, 1)
        assert 0 < redis.Redis.from_url(valkey_server.url).pttl(key) <= 86400 * 1000
    finally:
        forget_store(app)


def test_eager_runs_and_uncovered_tasks_are_named_at_worker_start(
    valkey_server: EmbeddedServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from celery import Task

    from delayq_backends.celery.dedupe import _check_tasks

    app = in_memory_app(valkey_server, prefix)

    @app.task(base=Task, name="dqt.own_base", shared=False)
    def own_base() -> str:
        return "ran"

    task_id = str(uuid.uuid4())
    for _ in range(2):  # eager: nothing is recorded, both run
        assert app.tasks["dqt.record"].apply(args=["eager"], task_id=task_id).get() == "eager"
    assert not list(redis.Redis.from_url(valkey_server.url).scan_iter(f"{prefix}:*started*"))
    with caplog.at_level("ERROR", logger="delayq.celery.dedupe"):
        _check_tasks(SimpleNamespace(app=app))
    assert "['dqt.own_base'] do not derive from DedupeTask" in caplog.text


def test_a_bad_dedupe_setting_is_logged_at_worker_start(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from delayq_backends.celery.dedupe import _check_tasks

    app = Celery("bad", broker="redis://127.0.0.1:1/0")
    app.conf.delayq_dedupe = "yes"
    with caplog.at_level("ERROR", logger="delayq.celery.dedupe"):
        _check_tasks(SimpleNamespace(app=app))
    assert "delayq_dedupe='yes': use True or False" in caplog.text
