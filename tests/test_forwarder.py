"""The forwarder in process, on real servers: publish then ack, per-item errors, outages,
wake-up precision."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from delayq_backends import DelayStore, Envelope
from delayq_backends.embedded import free_port
from delayq_backends.forwarder import Forwarder
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.models import DeliveryFailure, RunRef
from delayq_backends.targets import Delivery, PublishReport, RedisListTarget
from tests.harness import make_store
from tests.helpers import wait_for


@pytest.fixture
def out(valkey_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(valkey_url)
    yield client
    client.close()


def envelope(item_id: str, ready_ms: int = 0, key: str = "out") -> Envelope:
    return RedisListTarget.envelope(key, json.dumps({"id": item_id, "ready_ms": ready_ms}).encode())


def test_run_once_publishes_due_items_then_acks(store: DelayStore, out: redis.Redis, prefix: str) -> None:
    key = f"{prefix}:out"
    store.schedule_many([(f"d{i}", 1, envelope(f"d{i}", key=key)) for i in range(450)])
    store.schedule("future", 4_000_000_000, envelope("future", key=key))
    fwd = Forwarder(store, [RedisListTarget(out)], batch=100)
    assert fwd.run_once() == 450
    assert sorted(json.loads(b)["id"] for b in out.lrange(key, 0, -1)) == sorted(f"d{i}" for i in range(450))
    assert sum(s.scheduled for s in store.stats()) == 1 and store.exists("future")
    assert fwd.stats.acked == 450 and fwd.stats.forwarded == 450


def test_corrupt_envelope_is_dead_lettered_and_the_rest_delivered(
    store: DelayStore, out: redis.Redis, prefix: str
) -> None:
    key = f"{prefix}:out"
    store.schedule_many([(f"ok{i}", 1, envelope(f"ok{i}", key=key)) for i in range(20)])
    store.schedule("bad", 1, b"DQ\x01\x00\x00\x00\x05{oops")
    store.schedule("future", 4_000_000_000, envelope("future", key=key))
    fwd = Forwarder(store, [RedisListTarget(out)])
    fwd.run_once()
    assert out.llen(key) == 20
    (dead,) = store.dead_letters()
    assert dead.id == "bad" and dead.error.startswith("corrupt envelope") and dead.envelope.startswith(b"DQ")
    assert fwd.stats.dead == 1


def test_broker_outage_releases_without_burning_attempts(store: DelayStore, prefix: str, out: redis.Redis) -> None:
    key = f"{prefix}:out"
    store.schedule_many([(f"x{i}", 1, envelope(f"x{i}", key=key)) for i in range(50)])
    down = RedisListTarget(redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)))
    fwd = Forwarder(store, [down], max_outage_backoff=0.2)
    fwd.run_once()
    assert fwd.stats.released == 50 and fwd.stats.outages >= 1
    assert store.dead_letters() == []
    items = [store.get(f"x{i}") for i in range(50)]
    assert all(i is not None and i.attempts == 0 and i.leased_until_ms is None and i.ready_ms == 1000 for i in items)
    Forwarder(store, [RedisListTarget(out)]).run_once()
    assert out.llen(key) == 50 and sum(s.scheduled for s in store.stats()) == 0


class PartlyFailingTarget:
    """Publishes ids not in ``reject``; reports the rest as permanent failures."""

    kind = "list"

    def __init__(self, inner: RedisListTarget, reject: set[str]) -> None:
        self.inner, self.reject = inner, reject

    def publish_many(self, deliveries: list[Delivery]) -> PublishReport:  # type: ignore[override]
        report = self.inner.publish_many([d for d in deliveries if d.id not in self.reject])
        rejected = [d for d in deliveries if d.id in self.reject]
        report.failed += [DeliveryFailure(d.id, "rejected by test", permanent=True) for d in rejected]
        return report

    def close(self) -> None:
        self.inner.close()


def test_one_bad_item_does_not_hold_back_its_batch(store: DelayStore, out: redis.Redis, prefix: str) -> None:
    key = f"{prefix}:out"
    store.schedule_many([(f"x{i}", 1, envelope(f"x{i}", key=key)) for i in range(10)])
    Forwarder(store, [PartlyFailingTarget(RedisListTarget(out), {"x3"})]).run_once()
    assert out.llen(key) == 9
    assert [d.id for d in store.dead_letters()] == ["x3"]


def test_target_that_raises_does_not_kill_the_forwarder(store: DelayStore) -> None:
    class Exploding:
        kind = "list"

        def publish_many(self, deliveries: list[Delivery]) -> PublishReport:
            raise RuntimeError("bug in target")

        def close(self) -> None: ...

    store.schedule("a", 1, envelope("a"))
    fwd = Forwarder(store, [Exploding()], retry_delay=30)
    fwd.run_once()
    item = store.get("a")
    assert item is not None and item.attempts == 1 and item.ready_ms > store.server_time_ms()


def test_wrongtype_destination_is_dead_lettered(store: DelayStore, out: redis.Redis, prefix: str) -> None:
    out.set(f"{prefix}:string", "not a list")
    store.schedule("a", 1, envelope("a", key=f"{prefix}:string"))
    Forwarder(store, [RedisListTarget(out)]).run_once()
    (dead,) = store.dead_letters()
    assert "WRONGTYPE" in dead.error
    out.delete(f"{prefix}:string")


@pytest.fixture
def running(store: DelayStore, out: redis.Redis) -> Iterator[Forwarder]:
    fwd = Forwarder(store, [RedisListTarget(out)], poll_interval=1.0)
    thread = threading.Thread(target=fwd.run, kwargs={"install_signals": False, "log_every": 3600})
    thread.start()
    yield fwd
    fwd.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_idle_forwarder_wakes_for_a_new_earliest_item(
    store: DelayStore, out: redis.Redis, prefix: str, running: Forwarder
) -> None:
    """Wake-up, not polling: with a 1 s safety poll, a 200 ms item arrives within ~50 ms."""
    key = f"{prefix}:out"
    store.schedule("later", 4_000_000_000, envelope("later", key=key))
    wait_for(lambda: listening(store), 10, "the forwarder on its wake channel")
    lateness = []
    for n in range(5):
        ready = store.server_time_ms() + 200
        store.schedule(f"soon{n}", ready / 1000, envelope(f"soon{n}", ready, key=key))
        _, body = out.blpop([key], timeout=5) or (None, None)
        assert body is not None, "item was not forwarded within 5 s"
        lateness.append(store.server_time_ms() - ready)
    assert min(lateness) >= 0, f"forwarded before its time: {lateness}"
    assert sorted(lateness)[2] <= 100, f"median lateness {sorted(lateness)[2]} ms: wake-up is not working ({lateness})"


def listening(store: DelayStore) -> bool:
    """A forwarder subscribed to the store's wake channel (on a cluster, on the channel's node)."""
    client = store.client
    if isinstance(client, RedisCluster):
        client = client.get_node_from_key(store.wake_channel).redis_connection
    return bool(client.pubsub_numsub(store.wake_channel)[0][1] >= 1)


def test_stop_finishes_and_returns(store: DelayStore, out: redis.Redis, prefix: str, running: Forwarder) -> None:
    key = f"{prefix}:out"
    store.schedule_many([(f"x{i}", 1, envelope(f"x{i}", key=key)) for i in range(1000)])
    wait_for(lambda: out.llen(key) == 1000, 20, "1000 items forwarded")
    wait_for(lambda: sum(s.scheduled for s in store.stats()) == 0, 5, "store to be empty")


class _RunListTarget(RedisListTarget):
    """A list target whose items are runs 0 of their ids, as a Celery target names them."""

    def run_of(self, delivery: Delivery) -> RunRef:
        return RunRef(delivery.id, 0)


def test_lossless_keeps_published_items_and_publishes_again_what_did_not_start(
    store: DelayStore, out: redis.Redis, prefix: str
) -> None:
    key = f"{prefix}:out"
    store.schedule_many([(i, 1, envelope(i, key=key)) for i in ("a", "b")])
    metrics = ForwarderMetrics()
    fwd = Forwarder(store, [_RunListTarget(out)], lossless_window=1, metrics=metrics)
    first = fwd.run_until_idle()
    assert (first.forwarded, first.kept, first.acked) == (2, 2, 0)
    assert out.llen(key) == 2 and all(store.get(i).awaiting_start for i in ("a", "b"))  # type: ignore[union-attr]
    store.client.set(store.keys(store.shard_of("a")).started("a", 0), "worker:1 0")  # a worker started "a"
    now = store.server_time_ms()
    wait_for(lambda: store.server_time_ms() >= now + 1000, 5, "the window to pass")
    second = fwd.run_until_idle()
    assert (second.confirmed, second.forwarded, second.kept) == (1, 1, 1)
    assert store.get("a") is None  # found started: deleted, not published again
    assert out.lrange(key, 0, -1)[2:] == [envelope("b", key=key).body]  # "b" never started: sent again
    kept = store.get("b")
    assert kept is not None and kept.awaiting_start
    assert kept.leased_until_ms is not None  # published on its 2nd claim: the window doubled
    assert 1500 < kept.leased_until_ms - store.server_time_ms() <= 2000
    assert {name: _total(metrics, name) for name in ("kept", "found_started", "acked")} == {
        "kept": 3,
        "found_started": 1,
        "acked": 0,
    }


def _total(metrics: ForwarderMetrics, name: str) -> float:
    return sum(
        s.value
        for m in metrics.registry.collect()
        if m.name == f"delayq_{name}"
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_without_lossless_a_run_target_is_acked(store: DelayStore, out: redis.Redis, prefix: str) -> None:
    store.schedule("a", 1, envelope("a", key=f"{prefix}:out"))
    stats = Forwarder(store, [_RunListTarget(out)]).run_until_idle()
    assert (stats.forwarded, stats.acked, stats.kept) == (1, 1, 0) and store.get("a") is None


@pytest.mark.parametrize("window", [0, 0.5, 86401])
def test_a_bad_lossless_window_is_refused(store: DelayStore, window: float) -> None:
    from delayq_backends.errors import ConfigError

    with pytest.raises(ConfigError, match="lossless_window"):
        Forwarder(store, [], lossless_window=window)


def test_lossless_buries_a_task_no_worker_ever_starts(valkey_url: str, prefix: str, out: redis.Redis) -> None:
    """Each publish counts an attempt, so an expired or unknown task is not published forever."""
    store = make_store(valkey_url, prefix, shards=4, max_attempts=2)
    store.schedule("never", 1, envelope("never", key=f"{prefix}:out"))
    fwd = Forwarder(store, [_RunListTarget(out)], lossless_window=1)
    assert fwd.run_until_idle().kept == 1
    now = store.server_time_ms()
    wait_for(lambda: store.server_time_ms() >= now + 1000, 5, "the window to pass")
    assert fwd.run_until_idle().dead == 1
    [dead] = store.dead_letters()
    assert dead.id == "never" and "no worker has recorded its start" in dead.error and "delayq_dedupe" in dead.error
    assert out.llen(f"{prefix}:out") == 1  # published once, not a second time
    store.client.close()
