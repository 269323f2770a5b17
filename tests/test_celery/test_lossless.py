"""Lossless mode (``delayq forward --lossless``) with real ``celery worker`` processes with
dedupe on, on RabbitMQ and on kombu's Redis transport on the store's own server (the exactly-once
hand-off, which then keeps the item inside its MULTI/EXEC).

A lost message is simulated by purging the broker queue right after the forwarder published
it (no worker consumes yet): with lossless mode the task runs once, after the window; without,
the store has already forgotten it and it is lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from delayq_backends import DelayStore
from delayq_backends.embedded import EmbeddedServer
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, new_env, watched
from tests.test_celery.test_dedupe import crash_between_publish_and_ack, drop_logged, runs_of

WINDOW = ["--lossless", "--lossless-window", "3"]


@pytest.fixture(params=["rabbitmq", "redis"])
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    """Workers with dedupe on; the test starts worker and forwarder. ``redis``: the broker is the
    store's own database, so the forwarder hands off (publish + keep) in one transaction."""
    if request.param == "rabbitmq":
        broker = request.getfixturevalue("rabbitmq_url")
    else:
        broker = f"{valkey_server.url.rsplit('/', 1)[0]}/0"
    env = new_env(request.param, broker, valkey_server)
    env.dedupe = True
    with watched(env):
        yield env


def store_of(env: CeleryEnv) -> DelayStore:
    return DelayStore.from_url(env.store, prefix=env.prefix, shards=4)


def purge(env: CeleryEnv) -> int:
    """Drop every message waiting in the env's broker queue (kombu's queue_purge: RabbitMQ's
    purge, or the Redis transport's lists with their priority sub-lists); how many there were."""
    with Connection(env.broker, connect_timeout=4) as conn:
        return int(conn.default_channel.queue_purge(env.queue) or 0)


def forwarder_log(env: CeleryEnv) -> str:
    return "".join(log.read_text(errors="replace") for log in env.launcher.logs if log.name.startswith("forwarder"))


@pytest.mark.parametrize("lossless", [True, False], ids=["lossless", "plain"])
def test_a_message_the_broker_lost_runs_once_after_the_window(env: CeleryEnv, tmp_path: Path, lossless: bool) -> None:
    store = store_of(env)
    env.start_forwarder(tmp_path, extra=WINDOW if lossless else [])
    result = env.app().send_task("dqt.record", args=["lost"], countdown=0.5, queue=env.queue)

    def published() -> bool:
        item = store.get(result.id)
        return item is not None and item.awaiting_start if lossless else item is None

    wait_for(published, 30, "the forwarder to publish the task")
    assert purge(env) == 1, "the broker held the published message"  # ... and now lost it
    if not lossless:
        assert store.get(result.id) is None  # acked at publish: nothing left to send again
        return
    env.start_worker(tmp_path)
    wait_for(lambda: len(runs_of(env, result.id)) == 1, 60, "the re-published task to run")
    wait_for(lambda: store.get(result.id) is None, 30, "the forwarder to find it started and delete it")
    assert len(runs_of(env, result.id)) == 1  # a copy published again while the worker was still
    # starting (a slow machine) reaches it too, and its dedupe drops it


def test_a_started_task_is_deleted_not_published_again(env: CeleryEnv, tmp_path: Path) -> None:
    store = store_of(env)
    env.start_worker(tmp_path)
    env.start_forwarder(tmp_path, extra=["--lossless", "--lossless-window", "1"])
    result = env.app().send_task("dqt.record", args=["once"], countdown=0.5, queue=env.queue)
    wait_for(lambda: len(runs_of(env, result.id)) == 1, 60, "the task to run")
    wait_for(lambda: store.get(result.id) is None, 30, "the forwarder to find it started and delete it")
    wait_for(lambda: "found started 1" in forwarder_log(env), 30, "the forwarder to count it as found started")
    assert len(runs_of(env, result.id)) == 1
    assert not drop_logged(env, result.id), "published again although it had started"


@pytest.mark.parametrize("env", ["rabbitmq"], indirect=True)  # on the store's own Redis the hand-off
# publishes and acks in one transaction: no crash falls between them (tests/test_celery/test_redis_handoff.py)
def test_forwarder_killed_between_publish_and_ack_runs_once(env: CeleryEnv, tmp_path: Path) -> None:
    """The next (lossless) forwarder finds the run started and deletes the item: not even a
    duplicate message reaches the broker."""
    store = store_of(env)
    env.start_worker(tmp_path)
    result = env.app().send_task("dqt.record", args=["crash"], countdown=1, queue=env.queue)
    crashed = crash_between_publish_and_ack(env, tmp_path)
    assert crashed.returncode == -9, env.tail()
    wait_for(lambda: len(runs_of(env, result.id)) == 1, 60, "the first delivery to run")
    assert store.get(result.id) is not None, "the crash left the item unacked in the store"
    env.start_forwarder(tmp_path, extra=WINDOW)  # claims it again once the dead forwarder's lease ends
    wait_for(lambda: store.get(result.id) is None, 60, "the forwarder to find it started and delete it")
    assert len(runs_of(env, result.id)) == 1
    assert not drop_logged(env, result.id), "published a second time"


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        ({"delayq_lossless": True}, "needs delayq_dedupe=True"),
        ({"delayq_lossless": "yes", "delayq_dedupe": True}, "delayq_lossless='yes'"),
        ({"delayq_lossless": True, "delayq_dedupe": True, "delayq_lossless_window": 0}, "delayq_lossless_window=0"),
        (
            {"delayq_lossless": True, "delayq_dedupe": True, "delayq_dedupe_ttl": 30, "delayq_lossless_window": 60},
            "shorter than delayq_dedupe_ttl",
        ),
    ],
)
def test_a_bad_lossless_setting_is_refused_by_name(conf: dict[str, Any], match: str) -> None:
    from celery import Celery

    from delayq_backends.celery import CelerySettings
    from delayq_backends.errors import ConfigError

    app = Celery("bad", broker="redis://127.0.0.1:1/0")
    app.conf.update(conf)
    with pytest.raises(ConfigError, match=match):
        CelerySettings.of(app)


def test_lossless_setting_reaches_the_celery_settings() -> None:
    from celery import Celery

    from delayq_backends.celery import CelerySettings

    app = Celery("ok", broker="redis://127.0.0.1:1/0")
    app.conf.update(delayq_dedupe=True, delayq_lossless=True, delayq_lossless_window=5)
    assert CelerySettings.of(app).forwarder.lossless_window == 5.0
    app.conf.delayq_lossless = False
    assert CelerySettings.of(app).forwarder.lossless_window is None


def test_keys_of_a_run_are_what_the_worker_writes(valkey_server: EmbeddedServer) -> None:
    """The forwarder's check reads the key the worker's RunGuard writes (one definition)."""
    from delayq_backends.dedupe import RunGuard
    from delayq_backends.models import RunRef

    store = DelayStore.from_url(valkey_server.url, prefix=f"dqt{uuid.uuid4().hex[:8]}", shards=4)
    task_id = str(uuid.uuid4())
    RunGuard(store, ttl_ms=60_000).start(task_id, 2)
    assert store.started(store.shard_of(task_id), [RunRef(task_id, 2)]) == {task_id}
    assert store.started(store.shard_of(task_id), [RunRef(task_id, 1)]) == set()
