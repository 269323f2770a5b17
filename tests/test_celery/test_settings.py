"""Configuration and bad input at apply_async: a clear error naming what to fix, nothing lost.

Real servers: the embedded Valkey as delay store and as Redis broker (no worker needed).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery, beat

from bench.lib.proxy import TcpProxy
from delayq_backends import ConfigError, DelayStore, EnvelopeError, PayloadTooLargeError, ShardMismatchError
from delayq_backends.celery import AMQP, CeleryTarget, forget_store, get, install, reschedule, store_for
from delayq_backends.celery.amqp import StoreUnavailableError
from delayq_backends.config import Config
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer, free_port


@pytest.fixture
def base(valkey_server: EmbeddedServer) -> str:
    return valkey_server.url.rsplit("/", 1)[0]


@pytest.fixture
def make(base: str) -> Iterator[Any]:
    apps: list[Celery] = []

    def make(**conf: Any) -> Celery:
        app = Celery(f"settings-{uuid.uuid4().hex[:6]}")
        queue = f"q-{uuid.uuid4().hex[:8]}"
        app.conf.update(
            broker_url=f"{base}/1",
            delayq_url=f"{base}/0",
            delayq_prefix=f"s{uuid.uuid4().hex[:10]}",
            delayq_shards=4,
            task_default_queue=queue,
            broker_connection_retry_on_startup=True,
        )
        app.conf.update(conf)
        install(app)
        apps.append(app)
        return app

    yield make
    for app in apps:
        forget_store(app)


#: a ready time is rounded up to the next ms, so it can end 1 ms past now + the countdown
ROUNDING = 1


def queued(app: Celery) -> int:
    """Messages waiting in the app's default queue on the Redis broker."""
    return int(redis.Redis.from_url(app.conf.broker_url).llen(app.conf.task_default_queue))


def stored(app: Celery) -> int:
    return sum(s.scheduled for s in store_for(app).stats())


def test_install_and_the_amqp_argument_give_the_same_plugin(base: str) -> None:
    by_argument = Celery("a", amqp="delayq_backends.celery:AMQP", broker=f"{base}/1")
    assert isinstance(by_argument.amqp, AMQP)
    assert type(by_argument.control).__module__ == "delayq_backends.celery.amqp"


def test_only_future_etas_past_min_delay_are_stored(make: Any) -> None:
    app = make(delayq_min_delay=5)
    app.send_task("t.near", countdown=2)  # within delayq_min_delay: published as Celery would
    app.send_task("t.now")
    app.send_task("t.past", eta=datetime.now(timezone.utc) - timedelta(seconds=5))
    far = app.send_task("t.far", countdown=60)
    assert queued(app) == 3 and stored(app) == 1
    assert store_for(app).get(far.id) is not None


def test_disabled_plugin_publishes_as_celery_does(make: Any) -> None:
    app = make(delayq_enabled=False, delayq_url="redis://127.0.0.1:1/0")  # never contacted
    app.send_task("t.far", countdown=60)
    assert queued(app) == 1


def test_naive_eta_is_read_as_utc_like_the_worker_does(make: Any) -> None:
    app = make()
    naive = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0) + timedelta(minutes=10)
    result = app.send_task("t.naive", eta=naive)
    item = store_for(app).get(result.id)
    assert item is not None and item.ready_ms == int(naive.replace(tzinfo=timezone.utc).timestamp() * 1000)


@pytest.mark.parametrize(
    ("conf", "names"),
    [
        ({"delayq_sharts": 4}, "delayq_sharts"),
        ({"delayq_min_delay": -1}, "delayq_min_delay"),
        ({"delayq_min_delay": float("nan")}, "delayq_min_delay"),
        ({"delayq_enabled": "yes"}, "delayq_enabled"),
        ({"delayq_prefix": "has space"}, "prefix"),
        ({"delayq_url": None, "broker_url": "amqp://guest@127.0.0.1:1//"}, "set delayq_url"),
        ({"task_protocol": 1}, "task_protocol"),
        ({"delayq_max_payload_bytes": "1MB"}, "max_payload_bytes"),
        ({"delayq_durable_replicas": -1}, "durable_replicas"),
        ({"delayq_durable_timeout_ms": 0}, "durable_timeout_ms"),
        ({"delayq_duplicate_id": "twice"}, "delayq_duplicate_id"),
    ],
)
def test_misconfiguration_fails_loudly_naming_the_setting(make: Any, conf: dict[str, Any], names: str) -> None:
    app = make(**conf)
    with pytest.raises(ConfigError, match=names):
        app.send_task("t.far", countdown=60)


def test_unreachable_store_fails_at_first_use_naming_delayq_url(make: Any) -> None:
    app = make(delayq_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(ConfigError, match="delayq_url"):
        app.send_task("t.far", countdown=60)
    assert queued(app) == 0, "no silent fallback to worker-side ETAs"


def test_shard_mismatch_names_delayq_shards(make: Any, base: str) -> None:
    app = make()
    DelayStore(connect(f"{base}/0"), Config(prefix=app.conf.delayq_prefix, shards=8)).check_meta()
    with pytest.raises(ShardMismatchError, match="delayq_shards"):
        app.send_task("t.far", countdown=60)


def test_store_lost_after_first_use_raises_and_publishes_nothing(make: Any, valkey_server: EmbeddedServer) -> None:
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    app = make(delayq_url=f"redis://127.0.0.1:{proxy.port}/0")
    try:
        app.send_task("t.far", countdown=60)
        proxy.cut()
        with pytest.raises(StoreUnavailableError, match="was NOT scheduled"):
            app.send_task("t.far", countdown=60)
    finally:
        proxy.close()
    assert queued(app) == 0


def test_unstorable_headers_and_huge_payloads_are_refused(make: Any) -> None:
    app = make()
    with pytest.raises(EnvelopeError, match="JSON-serializable"):
        app.send_task("t.far", countdown=60, headers={"x_obj": object()})
    with pytest.raises(PayloadTooLargeError, match="max_payload_bytes"):
        app.send_task("t.far", args=["x" * (2 * 1024 * 1024)], countdown=60)
    small = make(delayq_max_payload_bytes=4096)
    with pytest.raises(PayloadTooLargeError, match="max_payload_bytes=4096"):
        small.send_task("t.far", args=["x" * 5000], countdown=60)
    small.send_task("t.far", args=["x" * 1000], countdown=60)
    assert stored(app) == 0 and queued(app) == 0 and stored(small) == 1


def test_beat_entry_with_a_countdown_waits_in_the_store(make: Any) -> None:
    app = make(beat_schedule={"later": {"task": "t.beat", "schedule": 60.0, "options": {"countdown": 600}}})
    scheduler = beat.Scheduler(app=app, lazy=True)
    scheduler.setup_schedule()
    scheduler.apply_async(scheduler.schedule["later"], advance=False)
    (item,) = store_for(app).scheduled()
    assert 590_000 < item.ready_ms - store_for(app).server_time_ms() <= 600_000 + ROUNDING
    assert queued(app) == 0


def test_same_task_id_twice_replaces_by_default_on_a_real_store(make: Any) -> None:
    """The default: the second send wins (a reschedule), one item, the second's eta and args."""
    app = make()
    app.send_task("t.far", args=[1], task_id="dup", countdown=60)
    app.send_task("t.far", args=[2], task_id="dup", countdown=120)
    (item,) = store_for(app).scheduled()
    assert 110_000 < item.ready_ms - store_for(app).server_time_ms() <= 120_000 + ROUNDING
    kept = make(delayq_duplicate_id="keep")
    kept.send_task("t.far", args=[1], task_id="dup", countdown=60)
    kept.send_task("t.far", args=[2], task_id="dup", countdown=120)
    (item,) = store_for(kept).scheduled()
    assert item.ready_ms - store_for(kept).server_time_ms() <= 60_000 + ROUNDING


def test_reschedule_with_the_store_down_raises_store_unavailable(make: Any, valkey_server: EmbeddedServer) -> None:
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    app = make(delayq_url=f"redis://127.0.0.1:{proxy.port}/0")
    try:
        task_id = app.send_task("t.far", countdown=60).id
        proxy.cut()
        with pytest.raises(StoreUnavailableError, match=f"rescheduling task {task_id} was NOT done"):
            reschedule(app, task_id, countdown=600)
        with pytest.raises(StoreUnavailableError, match="reading task"):
            get(app, task_id)
    finally:
        proxy.close()


def test_reschedule_accepts_what_apply_async_accepts(make: Any) -> None:
    """A naive eta is UTC (as Celery reads it), ISO text, a countdown, or an aware datetime."""
    app = make()
    task_id = app.send_task("t.far", countdown=60).id
    naive = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(hours=2)
    assert reschedule(app, task_id, naive)
    item = get(app, task_id)
    assert item is not None and abs(item.ready_ms - naive.replace(tzinfo=timezone.utc).timestamp() * 1000) <= 1
    assert reschedule(app, task_id, (naive + timedelta(hours=1)).isoformat())
    assert reschedule(app, task_id, countdown=30)
    item = get(app, task_id)
    assert item is not None and 29_000 < item.ready_ms - store_for(app).server_time_ms() <= 30_050
    with pytest.raises(ValueError, match="eta= or countdown="):
        reschedule(app, task_id)


def test_the_forward_banner_shows_no_password_stars_for_a_broker_without_one() -> None:
    """Issue 22: kombu's ``as_uri()`` writes ``:**@`` into a URL that has no password."""
    for url, shown in [
        ("redis://h:6379/1", "redis://h:6379/1"),
        ("amqp://u:pw@h//", "amqp://u:***@h:5672//"),
    ]:
        target = CeleryTarget.from_app(Celery("banner", broker=url, set_as_current=False))
        try:
            assert target.describe() == shown
        finally:
            target.close()
