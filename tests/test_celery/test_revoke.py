"""Revoke that always works: broadcast first, then the store; REVOKED in the result backend;
a store that is down said in words; nothing asked of a store under ``task_always_eager``.

The module's worker and forwarder run on RabbitMQ and on a Redis broker (``celery_env``); the
store-only checks need no worker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError

from bench.lib.proxy import TcpProxy
from delayq_backends.celery import StoreUnavailableError, forget_store, get, install, store_for
from delayq_backends.celery import revoke as delayq_revoke
from delayq_backends.celery.scheduled import ResultMark, revoke_everywhere
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.models import CancelOutcome
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, delayq_cli


@pytest.fixture
def lone_app(valkey_server: EmbeddedServer) -> Iterator[Celery]:
    """An app on the embedded Valkey (store, Redis broker, result backend) and no worker."""
    base = valkey_server.url.rsplit("/", 1)[0]
    app = Celery(f"revoke-{uuid.uuid4().hex[:6]}")
    app.conf.update(
        broker_url=f"{base}/1",
        result_backend=f"{base}/2",
        delayq_url=f"{base}/0",
        delayq_prefix=f"r{uuid.uuid4().hex[:10]}",
        delayq_shards=4,
        task_default_queue=f"q-{uuid.uuid4().hex[:8]}",
    )
    install(app)
    yield app
    forget_store(app)


def test_revoked_waiting_task_is_marked_revoked_without_any_worker(lone_app: Celery) -> None:
    """Celery 5.3-5.6.0 workers never mark a task they did not receive: the plugin does."""
    result = lone_app.send_task("t.later", countdown=3600)
    result.revoke()
    assert result.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        result.get(timeout=1)
    assert get(lone_app, result.id) is None


def test_a_finished_tasks_result_is_not_overwritten(lone_app: Celery) -> None:
    result = lone_app.send_task("t.later", countdown=3600)
    lone_app.backend.mark_as_done(result.id, 42)  # e.g. a run forced by hand
    lone_app.control.revoke(result.id)
    assert result.state == "SUCCESS" and result.get(timeout=1) == 42


def test_in_flight_outcome_is_reported_honestly(lone_app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    result = lone_app.send_task("t.soon", countdown=0.5)
    store = store_for(lone_app)
    wait_for(lambda: bool(store.claim(store.shard_of(result.id), limit=10).items), 5, "a forwarder-like claim")
    report = revoke_everywhere(lone_app, [result.id])
    (one,) = report.store
    assert one.outcome is CancelOutcome.IN_FLIGHT and one.may_still_run
    assert "may still run it once" in one.describe()
    assert result.state == "PENDING", "not marked REVOKED: it may still run"
    second = lone_app.send_task("t.soon", countdown=0.5)
    wait_for(lambda: bool(store.claim(store.shard_of(second.id), limit=10).items), 5, "a forwarder-like claim")
    with caplog.at_level(logging.WARNING, logger="delayq.celery"):
        lone_app.control.revoke(second.id)
    assert "was being forwarded" in caplog.text


def test_eager_app_without_a_store_revokes_without_asking_for_one() -> None:
    app = Celery("eager", broker="memory://")
    app.conf.task_always_eager = True
    install(app)

    @app.task(name="t.add")
    def add(a: int, b: int) -> int:
        return a + b

    assert add.apply_async((1, 2), countdown=60).get() == 3
    app.control.revoke("some-id")  # no delayq_url, a memory:// broker: nothing to look at
    add.AsyncResult("other-id").revoke()


def test_store_down_still_broadcasts_and_says_the_task_may_run(
    celery_env: CeleryEnv, app: Celery, valkey_server: EmbeddedServer
) -> None:
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    cut_off = celery_env.app()
    cut_off.conf.delayq_url = f"redis://127.0.0.1:{proxy.port}/0"
    try:
        waiting = cut_off.send_task("dqt.record", args=["never"], countdown=3600)
        proxy.cut()
        with pytest.raises(StoreUnavailableError) as raised:
            cut_off.control.revoke(waiting.id, terminate=True)
        said = str(raised.value)
        assert "broadcast went out" in said and "may still run" in said and f"delayq revoke {waiting.id}" in said
    finally:
        proxy.close()
        forget_store(cut_off)
    revoked = celery_env.inspect(app, timeout=5).revoked() or {}
    assert any(waiting.id in ids for ids in revoked.values()), f"the worker got the broadcast: {revoked}"
    assert get(app, waiting.id) is not None, "still in the store"

    done = delayq_cli(celery_env, "revoke", waiting.id)  # finish the job as the message says
    assert done.returncode == 0, done.stderr
    assert "removed from the delay store" in done.stdout
    assert get(app, waiting.id) is None
    wait_for(lambda: waiting.state == "REVOKED", 10, "the task to be marked REVOKED")


def test_delayq_revoke_command_reports_each_id(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    waiting = app.send_task("dqt.record", args=[tag], countdown=3600)
    shown = delayq_cli(celery_env, "revoke", waiting.id, "never-sent-id")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(waiting.id in line and "will not run" in line for line in lines), shown.stdout
    assert any("never-sent-id" in line and "not waiting" in line for line in lines), shown.stdout
    assert get(app, waiting.id) is None and waiting.state == "REVOKED"


def test_revoke_reaches_the_worker_and_the_store_in_one_call(celery_env: CeleryEnv, app: Celery) -> None:
    """The end-to-end case of users: the task never runs, the result says REVOKED."""
    tag = uuid.uuid4().hex[:6]
    doomed = app.send_task("dqt.record", args=[f"{tag}-doomed"], countdown=2)
    app.send_task("dqt.record", args=[f"{tag}-sentinel"], countdown=3)
    doomed.revoke()
    assert doomed.state == "REVOKED"
    wait_for(lambda: any(r["tag"] == f"{tag}-sentinel" for r in celery_env.records()), 30, "the sentinel to run")
    assert not any(r["tag"] == f"{tag}-doomed" for r in celery_env.records())


def test_revoke_function_reaches_a_worker_already_holding_the_task(celery_env: CeleryEnv, app: Celery) -> None:
    """Issue 22: ``revoke(app, id)`` changed only the store. A task sent with Celery's own eta
    (nearer than ``delayq_min_delay``, or from an app without the plugin) waits in the worker."""
    tag = uuid.uuid4().hex[:6]
    native = celery_env.native_app()
    held = native.send_task("dqt.record", args=[f"{tag}-held"], countdown=4)
    native.send_task("dqt.record", args=[f"{tag}-sentinel"], countdown=5)

    def holding() -> bool:
        scheduled = celery_env.inspect(app).scheduled() or {}
        return any(t["request"]["id"] == held.id for tasks in scheduled.values() for t in tasks)

    wait_for(holding, 20, "the worker to hold the eta task")
    assert delayq_revoke(app, held.id) is CancelOutcome.NOT_FOUND  # not in the store: the broadcast
    wait_for(lambda: any(r["tag"] == f"{tag}-sentinel" for r in celery_env.records()), 30, "the sentinel to run")
    assert not any(r["tag"] == f"{tag}-held" for r in celery_env.records()), "the worker ran a revoked task"


def test_revoke_function_under_eager_touches_no_store() -> None:
    """Issue 22: with ``task_always_eager`` it opened the store (ConfigError on a store that is down)."""
    app = Celery("eager-revoke", broker="memory://")
    app.conf.update(task_always_eager=True, delayq_url="redis://127.0.0.1:1/0")
    install(app)
    assert delayq_revoke(app, "some-id") is CancelOutcome.NOT_FOUND


def test_revoke_without_a_result_backend_says_the_state_stays_pending(lone_app: Celery) -> None:
    """Issue 22: ``delayq revoke`` said "marked REVOKED" when no result backend could hold it."""
    lone_app.conf.result_backend = None
    waiting = lone_app.send_task("t.later", countdown=3600)
    (one,) = revoke_everywhere(lone_app, [waiting.id]).store
    assert one.outcome is CancelOutcome.CANCELLED and one.mark is ResultMark.NO_BACKEND
    assert "marked REVOKED" not in one.describe() and "no result backend" in one.describe()
