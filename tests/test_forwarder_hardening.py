"""The forwarder against hostile data and stalls, in process on the embedded server: garbage
wake-ups, unreadable heads, errors in one shard, a stepped wall clock, leases that run out."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import Delivery, PublishReport, RedisListTarget
from tests.harness import make_store
from tests.helpers import wait_for


@pytest.fixture
def out(valkey_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(valkey_url)
    yield client
    client.close()


def body(item_id: str) -> bytes:
    return json.dumps({"id": item_id}).encode()


def delivered(out: redis.Redis, key: str) -> list[str]:
    return [json.loads(b)["id"] for b in out.lrange(key, 0, -1)]


class Running:
    """A forwarder's :meth:`Forwarder.run` in a thread; the test fails if it returned by itself."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.thread = threading.Thread(target=forwarder.run, kwargs={"install_signals": False, "log_every": 3600})
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.forwarder.stop()
        self.thread.join(10)


@pytest.fixture
def run() -> Iterator[Any]:
    started: list[Running] = []

    def start(forwarder: Forwarder) -> Running:
        started.append(Running(forwarder))
        return started[-1]

    yield start
    for r in started:
        r.stop()


GARBAGE_WAKES: Sequence[Any] = ["hello", b"\xff\xfe", "1e5", "9" * 5000, "-inf", "", " 12", "1.5", "0x10"]


def test_garbage_on_the_wake_channel_is_ignored(valkey_url: str, prefix: str, out: redis.Redis, run: Any) -> None:
    """Anyone who may PUBLISH on `<prefix>:wake` used to stop every forwarder with one word."""
    store = make_store(valkey_url, prefix, shards=4)
    key = f"{prefix}:out"
    forwarder = run(Forwarder(store, [RedisListTarget(out)], poll_interval=0.5))
    wait_for(lambda: out.pubsub_numsub(store.wake_channel)[0][1] >= 1, 10, "the forwarder subscribed")
    for garbage in GARBAGE_WAKES:
        out.publish(store.wake_channel, garbage)
    store.schedule("after", 0, RedisListTarget.envelope(key, body("after")))
    wait_for(lambda: delivered(out, key) == ["after"], 10, "the item scheduled after the garbage delivered")
    assert forwarder.alive()


def test_a_non_finite_score_does_not_stop_the_forwarders(
    valkey_url: str, prefix: str, out: redis.Redis, run: Any
) -> None:
    """A `-inf` score written straight into Redis made `heads()` raise OverflowError at start."""
    store = make_store(valkey_url, prefix, shards=2, lease_seconds=0.5)
    key = f"{prefix}:out"
    shard = store.shard_of("minus-inf")
    keys = store.keys(shard)
    out.zadd(keys.due, {"minus-inf": float("-inf")})
    out.hset(keys.items, "minus-inf", RedisListTarget.envelope(key, body("minus-inf")).encode())
    store.schedule_many([(f"good{i}", 0, RedisListTarget.envelope(key, body(f"good{i}"))) for i in range(20)])
    forwarder = run(Forwarder(store, [RedisListTarget(out)], poll_interval=0.2, max_outage_backoff=0.5))
    good = sorted(f"good{i}" for i in range(20))
    wait_for(lambda: not store.exists("minus-inf"), 20, "the -inf item handled")
    wait_for(lambda: good <= sorted(delivered(out, key)), 20, lambda: f"good ones delivered: {delivered(out, key)}")
    dead = {d.id: d.error for d in store.dead_letters()}
    assert "minus-inf" in delivered(out, key) or dead.get("minus-inf"), "the -inf item neither delivered nor dead"
    assert forwarder.alive()


def test_an_error_in_one_shard_sets_it_aside_and_the_others_flow(
    valkey_url: str, prefix: str, out: redis.Redis, run: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Any exception while handling one shard's data (here: a bug that raises ValueError on one
    item's settle) is logged with the shard and ids, once, and the loop goes on."""
    store = make_store(valkey_url, prefix, shards=4, lease_seconds=0.5)
    key = f"{prefix}:out"
    bad_shard = store.shard_of("poison")
    real_ack_many = store.ack_many
    raised: list[int] = []

    def ack_many(acks: Any) -> list[int | Exception]:
        """The bad shard's ack fails once (not sent); the others go."""
        bad = [n for n, (claim, _) in enumerate(acks) if claim.shard == bad_shard and not raised]
        replies = real_ack_many([(claim, [] if n in bad else ids) for n, (claim, ids) in enumerate(acks)])
        raised.extend(bad)
        return [ValueError("a bug met in this shard") if n in bad else r for n, r in enumerate(replies)]

    store.ack_many = ack_many  # type: ignore[method-assign]
    store.schedule("poison", 0, RedisListTarget.envelope(key, body("poison")))
    others = [i for i in (f"ok{n}" for n in range(40)) if store.shard_of(i) != bad_shard][:10]
    store.schedule_many([(i, 0, RedisListTarget.envelope(key, body(i))) for i in others])
    with caplog.at_level(logging.ERROR, logger="delayq.forwarder"):
        forwarder = run(Forwarder(store, [RedisListTarget(out)], poll_interval=0.2, max_outage_backoff=0.5))
        wait_for(lambda: set(others) <= set(delivered(out, key)), 10, "the other shards' items delivered")
        # the shard comes back after its back-off; its item was published once already (before
        # the failed ack): at-least-once, so it may come twice, never zero times
        wait_for(lambda: not store.exists("poison"), 10, "the set-aside shard drained after its back-off")
    assert forwarder.alive()
    lines = [r.getMessage() for r in caplog.records if "a bug met" in r.getMessage()]
    assert len(lines) == 1 and f"shard {bad_shard}" in lines[0] and "'poison'" in lines[0], lines
    assert not any(r.exc_info for r in caplog.records), "a traceback per data error floods the log"


@pytest.mark.alone  # counts the claims of 1.5 s: a busy core stretches a pass
@pytest.mark.parametrize("step_s", [3600, -3600])
def test_a_wall_clock_step_makes_items_neither_early_nor_late(
    valkey_url: str, prefix: str, out: redis.Redis, run: Any, monkeypatch: pytest.MonkeyPatch, step_s: int
) -> None:
    """The forwarder's "now" is server TIME advanced by the monotonic clock: a wall-clock step
    of an hour (either way) neither delays items by the step nor spins empty claims."""
    store = make_store(valkey_url, prefix, shards=2)
    key = f"{prefix}:out"
    claims: list[int] = []
    real_claim_many = store.claim_many
    store.claim_many = lambda shards, **k: claims.extend(shards) or real_claim_many(shards, **k)  # type: ignore[method-assign]
    forwarder = run(Forwarder(store, [RedisListTarget(out)], poll_interval=5.0))
    store.schedule("warm-up", 0, RedisListTarget.envelope(key, body("warm-up")))
    assert out.blpop([key], timeout=10), "the forwarder did not start"  # it has read the clock
    claims.clear()
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + step_s)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + step_s * 1_000_000_000)
    ready = store.server_time_ms() + 1500
    store.schedule("stepped", ready / 1000, RedisListTarget.envelope(key, body("stepped")))
    item = out.blpop([key], timeout=10)
    arrived = store.server_time_ms()
    assert item is not None, "not delivered within 10 s of its time"
    assert 0 <= arrived - ready <= 500, f"{arrived - ready} ms late (negative: early)"
    assert 1 <= len(claims) <= 5, f"{len(claims)} claims for one item: the forwarder spun on a stepped clock"
    assert forwarder.alive()


class SlowTarget:
    """A list target whose first publish takes ``pause`` seconds (a broker blocking confirms)."""

    kind = "list"

    def __init__(self, client: redis.Redis, pause: float) -> None:
        self.inner = RedisListTarget(client)
        self.pause = pause

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        pause, self.pause = self.pause, 0.0
        time.sleep(pause)  # the stall under test, not a wait for a result
        return self.inner.publish_many(deliveries)

    def close(self) -> None:
        self.inner.close()


def test_a_publish_longer_than_the_lease_is_not_duplicated(
    valkey_url: str, prefix: str, out: redis.Redis, run: Any
) -> None:
    """The heartbeat extends the lease while a publish runs past it, so a second forwarder does
    not take (and publish again) the batch the first one is still publishing."""
    store = make_store(valkey_url, prefix, shards=1, lease_seconds=0.6)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(50)]
    store.schedule_many([(i, 0, RedisListTarget.envelope(key, body(i))) for i in ids])
    first = Forwarder(store, [SlowTarget(out, 2.0)], poll_interval=0.1)
    claim = store.claim(0, limit=50)
    publishing = threading.Thread(target=first.deliver, args=(claim,))
    publishing.start()
    second = run(Forwarder(store, [RedisListTarget(out)], poll_interval=0.1))
    publishing.join(10)
    wait_for(lambda: not store.exists("i0"), 5, "the batch acked")
    time.sleep(0.8)  # past the (unextended) lease: a duplicate would show now
    assert sorted(delivered(out, key)) == sorted(ids)
    assert second.alive()


def test_a_claim_stalled_past_its_lease_publishes_nothing_taken_over(
    valkey_url: str, prefix: str, out: redis.Redis
) -> None:
    """A forwarder that wakes up after its lease ran out (and another forwarder took and
    delivered its items) publishes none of them again."""
    store = make_store(valkey_url, prefix, shards=1, lease_seconds=0.2)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(20)]
    store.schedule_many([(i, 0, RedisListTarget.envelope(key, body(i))) for i in ids])
    stalled = store.claim(0, limit=20)
    wait_for(lambda: store.server_time_ms() > stalled.deadline_ms, 5, "the lease ran out")
    Forwarder(store, [RedisListTarget(out)]).run_once()  # the take-over
    Forwarder(store, [RedisListTarget(out)]).deliver(stalled)  # the stalled one wakes up
    assert sorted(delivered(out, key)) == sorted(ids)


def test_an_expired_lease_still_ours_is_extended_and_published(valkey_url: str, prefix: str, out: redis.Redis) -> None:
    """Past its deadline but not taken over, a batch is still ours: extended, then published."""
    store = make_store(valkey_url, prefix, shards=1, lease_seconds=0.2)
    key = f"{prefix}:out"
    store.schedule_many([(f"i{n}", 0, RedisListTarget.envelope(key, body(f"i{n}"))) for n in range(5)])
    claim = store.claim(0, limit=5)
    wait_for(lambda: store.server_time_ms() > claim.deadline_ms, 5, "the lease ran out")
    forwarder = Forwarder(store, [RedisListTarget(out)])
    forwarder.deliver(claim)
    assert sorted(delivered(out, key)) == [f"i{n}" for n in range(5)]
    assert forwarder.stats.acked == 5 and not store.exists("i0")


def test_extend_moves_only_our_items_deadline_and_keeps_the_lease(valkey_url: str, prefix: str) -> None:
    store: DelayStore = make_store(valkey_url, prefix, shards=1, lease_seconds=1)
    store.schedule_many([(i, 0, RedisListTarget.envelope("k", b"x")) for i in ("a", "b", "c")])
    claim = store.claim(0, limit=3)
    store.cancel("c")
    extension = store.extend(claim, lease_ms=60_000)
    assert sorted(extension.held) == ["a", "b"]
    assert extension.deadline_ms >= claim.deadline_ms + 50_000
    score = store.client.zscore(store.keys(0).due, "a")
    assert score == extension.deadline_ms
    assert store.ack(claim) == 2, "the claim's lease no longer matches after an extension"


def test_an_id_that_is_not_utf8_is_dead_lettered_and_its_batch_delivered(
    valkey_url: str, prefix: str, out: redis.Redis
) -> None:
    """An id written straight into Redis that is not UTF-8 used to fail decoding after its
    lease was taken, in a loop, holding its whole batch."""
    store = make_store(valkey_url, prefix, shards=1)
    key = f"{prefix}:out"
    keys = store.keys(0)
    out.hset(keys.items, b"\xff\xfe-raw", RedisListTarget.envelope(key, body("raw")).encode())
    out.zadd(keys.due, {b"\xff\xfe-raw": 0})
    store.schedule_many([(f"good{n}", 0, RedisListTarget.envelope(key, body(f"good{n}"))) for n in range(10)])
    forwarder = Forwarder(store, [RedisListTarget(out)])
    forwarder.run_once()
    assert sorted(delivered(out, key)) == sorted(f"good{n}" for n in range(10))
    info = out.hget(keys.dead_info, b"\xff\xfe-raw")
    assert info is not None and "UTF-8" in json.loads(info)["error"]
    assert out.zcard(keys.due) == 0
