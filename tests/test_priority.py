"""Priority under a backlog: ranked items are claimed before the rest, on every server kind;
the Celery adapter gives task priorities the rank their broker means; real forwarder processes
deliver the ranked items first, and no shard starves. (RQ's ``at_front``: tests/test_rq/test_priority.py.)

Store-level tests pass ``now=`` to the claims, so "due" is exact and nothing sleeps.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq_backends import Config, DelayStore, InvalidRankError
from delayq_backends.celery import store_for
from delayq_backends.celery.message import priority_rank
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import MAX_RANK, RANK_SPAN
from delayq_backends.models import Claim, FailCounts, FailedDelivery
from delayq_backends.scripts import source
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, make_store
from tests.harness.fleet import Forwarders
from tests.harness.servers import flush_scripts
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, delete_queue, new_env

ENV = RedisListTarget.envelope("out", b"x")
T0 = 1_750_000_000_000  # ms: the ready times below lie just after it
NOW = T0 + 1_000_000  # every item scheduled at T0 + offset (offset < 1e6) is due


def ids(claim_items: list[Any]) -> list[str]:
    return [c.id for c in claim_items]


@pytest.fixture
def one_shard(server_url: str, prefix: str) -> DelayStore:
    s = make_store(server_url, prefix, shards=1)
    flush_scripts(s.client, server_url)
    return s


def test_backlog_high_ranks_are_claimed_first_then_by_ready_time(one_shard: DelayStore) -> None:
    """2,000 low + 100 high-rank due items, batch 100: the first claim is exactly the high ones,
    highest rank first and earliest first within a rank; the lows follow earliest first."""
    rng = random.Random(7)
    lows = [(f"low{i}", (T0 + i) / 1000, ENV) for i in range(2000)]
    # high items are *later* than most lows: rank, not time, puts them first
    highs = [
        (f"high{i}", (T0 + 500_000 + rng.randrange(100_000)) / 1000, ENV, rng.choice([1, 5, 9])) for i in range(100)
    ]
    entries: list[Any] = [*lows, *highs]
    rng.shuffle(entries)
    one_shard.schedule_many(entries)
    first = one_shard.claim(0, limit=100, now=NOW)
    expected = [h[0] for h in sorted(highs, key=lambda h: (-h[3], h[1], h[0]))]
    assert ids(first.items) == expected
    claimed = list(ids(first.items))
    while batch := one_shard.claim(0, limit=100, now=NOW).items:
        claimed += ids(batch)
    assert claimed[100:] == [f"low{i}" for i in range(2000)]  # earliest first, nothing lost
    assert len(set(claimed)) == 2100


def test_each_shard_claims_its_ranked_items_first(store: DelayStore) -> None:
    store.schedule_many([(f"low{i}", (T0 + i) / 1000, ENV) for i in range(400)])
    store.schedule_many([(f"high{i}", (T0 + 900 + i) / 1000, ENV, 3) for i in range(40)])
    for shard in range(store.shards):
        expected = [f"high{i}" for i in range(40) if store.shard_of(f"high{i}") == shard]
        got = ids(store.claim(shard, limit=100, now=NOW).items)
        assert got[: len(expected)] == expected and not any(i.startswith("high") for i in got[len(expected) :])


def test_a_ranked_item_not_yet_due_waits(one_shard: DelayStore) -> None:
    one_shard.schedule("later", (NOW + 1) / 1000, ENV, rank=9)
    one_shard.schedule("low", T0 / 1000, ENV)
    assert ids(one_shard.claim(0, limit=10, now=NOW).items) == ["low"]
    assert ids(one_shard.claim(0, limit=10, now=NOW + 1).items) == ["later"]


def test_stale_index_entries_are_harmless_and_cleaned(one_shard: DelayStore) -> None:
    """Cancel, ack, reschedule (later and earlier), release, fail and replace-with-rank-0 leave
    entries the claim must step over or follow; none is delivered twice or lost."""
    s = one_shard
    s.schedule_many([(f"h{i}", (T0 + i) / 1000, ENV, 2) for i in range(10)])
    s.schedule_many([(f"l{i}", (T0 + i) / 1000, ENV) for i in range(10)])
    acked = s.claim(0, limit=2, now=NOW)  # h0, h1
    assert ids(acked.items) == ["h0", "h1"] and s.ack(acked) == 2
    assert s.cancel("h2")
    assert s.reschedule("h3", (NOW + 500) / 1000)  # later: not due at NOW
    s.schedule("h4", (T0 + 4) / 1000, ENV)  # replaced with rank 0
    assert s.rank("h4") == 0 and s.rank("h5") == 2 and s.rank("h2") is None
    released = s.claim(0, limit=1, now=NOW)  # h5
    failed = s.claim(0, limit=1, now=NOW)  # h6
    assert ids(released.items) == ["h5"] and ids(failed.items) == ["h6"]
    assert s.fail(failed, [FailedDelivery("h6", NOW + 200, "boom")], now=NOW) == FailCounts(1, 0)
    # h5 is leased: the next claim steps over it without spending the batch on it
    assert ids(s.claim(0, limit=3, now=NOW).items) == ["h7", "h8", "h9"]
    assert s.release(released) == 1
    assert ids(s.claim(0, limit=2, now=NOW).items) == ["h5", "l0"]
    # h6's retry and h3's reschedule come due ranked again, at their new times
    assert ids(s.claim(0, limit=1, now=NOW + 200).items) == ["h6"]
    h3 = s.claim(0, limit=1, now=NOW + 500)
    assert ids(h3.items) == ["h3"]
    assert not s.reschedule("h3", (T0 + 1) / 1000)  # in flight: left alone
    assert s.release(h3) == 1
    assert s.reschedule("h3", (T0 + 1) / 1000)  # earlier again
    assert ids(s.claim(0, limit=1, now=NOW + 500).items) == ["h3"]
    # entries of items that are gone are removed by the claims that met them
    ranked = s.client.zrange(s.keys(0).ranked, 0, -1)
    assert {m.decode() for m in ranked} <= {"h3", "h5", "h6", "h7", "h8", "h9"}


def test_expired_lease_and_dead_letter_requeue_keep_the_rank(server_url: str, prefix: str) -> None:
    s = make_store(server_url, prefix, shards=1, max_attempts=1)
    s.schedule("h", T0 / 1000, ENV, rank=4)
    s.schedule_many([(f"l{i}", T0 / 1000, ENV) for i in range(3)])
    first = s.claim(0, limit=1, lease_ms=1_000, now=NOW)
    assert ids(first.items) == ["h"]
    # the lease expires: claimed again first, over attempts, so dead-lettered
    assert ids(s.claim(0, limit=1, now=NOW + 1_000).items) == []
    assert [d.id for d in s.dead_letters()] == ["h"] and s.rank("h") is None
    assert s.requeue_dead(["h"], when=T0 / 1000) == 1
    assert s.rank("h") == 4
    assert ids(s.claim(0, limit=2, now=NOW + 1_000).items) == ["h", "l0"]


def test_rank_zero_items_leave_no_index(store: DelayStore) -> None:
    store.schedule_many([(f"l{i}", T0 / 1000, ENV) for i in range(50)])
    for shard in range(store.shards):
        store.claim(shard, limit=100, now=NOW)
    assert not any(store.client.exists(store.keys(k).ranked) for k in range(store.shards))


def test_get_list_and_scan_show_each_items_rank(store: DelayStore) -> None:
    t = T0 / 1000
    store.schedule_many([("plain", t, ENV), ("top", t + 1, ENV, MAX_RANK), ("mid", t + 2, ENV, 9)])
    expected = {"plain": 0, "top": MAX_RANK, "mid": 9}
    assert {i: store.get(i).rank for i in expected} == expected  # type: ignore[union-attr]
    assert {item.id: item.rank for item in store.scheduled()} == expected
    assert {item.id: item.rank for item in store.scan()} == expected
    store.schedule("mid", t + 2, ENV)  # re-scheduled without a rank: back to 0
    assert store.get("mid").rank == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("rank", [-1, MAX_RANK + 1, 1.5, "3", True, None])
def test_bad_ranks_are_refused_and_nothing_stored(store: DelayStore, rank: object) -> None:
    with pytest.raises(InvalidRankError, match=rf"pass an int in 0..{MAX_RANK}"):
        store.schedule("a", T0 / 1000, ENV, rank=rank)  # type: ignore[arg-type]
    with pytest.raises(InvalidRankError):
        store.schedule_many([("b", T0 / 1000, ENV), ("a", T0 / 1000, ENV, rank)])  # type: ignore[list-item]
    assert not store.exists("a") and not store.exists("b")


def test_lua_and_python_agree_on_the_rank_encoding() -> None:
    common = source("claim")
    assert re.search(rf"^local MAX_RANK = {MAX_RANK}$", common, re.MULTILINE)
    assert re.search(rf"^local RANK_SPAN = {RANK_SPAN}$", common, re.MULTILINE)
    assert (MAX_RANK + 1) * RANK_SPAN <= 2**53  # every index score is exact in a double


# -- no shard starves -----------------------------------------------------------------------


class _Recording(DelayStore):
    """A store that notes the shard of every claim, in order."""

    claimed: list[int]

    def claim_many(self, shards: Sequence[int], **kwargs: Any) -> list[Claim | Exception]:
        self.claimed += shards
        return super().claim_many(shards, **kwargs)


def test_every_due_shard_is_claimed_in_a_pass_despite_one_huge_backlog(valkey_url: str, prefix: str) -> None:
    """Shard 0 holds 3,000 due items (ranked ones among them), the other 7 shards 5 each: the
    forwarder's first 8 claims visit all 8 shards, then it comes back for shard 0's rest."""
    s = _Recording(connect(valkey_url), Config(url=valkey_url, prefix=prefix, shards=8))
    s.claimed = []
    key = f"{prefix}:out"
    env = RedisListTarget.envelope(key, b"x")
    by_shard: dict[int, list[str]] = {k: [] for k in range(8)}
    n = 0
    while len(by_shard[0]) < 3000 or any(len(by_shard[k]) < 5 for k in range(1, 8)):
        item_id, n = f"i{n}", n + 1
        k = s.shard_of(item_id)
        if len(by_shard[k]) < (3000 if k == 0 else 5):
            by_shard[k].append(item_id)
    s.schedule_many([(i, 1, env, 7 if n % 10 == 0 else 0) for n, i in enumerate(sum(by_shard.values(), []))])
    assert Forwarder(s, [RedisListTarget(s.client)], batch=100).run_once() == 3035
    assert sorted(s.claimed[:8]) == list(range(8))
    assert Counter(s.claimed) == {0: 31, **{k: 1 for k in range(1, 8)}}  # 30 full batches + the empty one
    assert s.client.llen(key) == 3035


# -- end to end: a real forwarder process ------------------------------------------------------


def test_forwarder_process_delivers_ranked_items_first(valkey_url: str, prefix: str, procs: Launcher) -> None:
    """2,000 low + 100 high due items on 4 shards, batch 100, one `delayq forward` process: in the
    list it fills, every shard's high items arrive before its low ones, all of them within the
    first pass (one batch per shard), and nothing is lost or doubled."""
    s = make_store(valkey_url, prefix, shards=4)
    key = f"{prefix}:out"
    rng = random.Random(3)
    lows = [(f"low{i}", 1 + i / 1000, RedisListTarget.envelope(key, f"low{i}".encode())) for i in range(2000)]
    highs = [
        (f"high{i}", 10 + i / 1000, RedisListTarget.envelope(key, f"high{i}".encode()), rng.choice([1, 2]))
        for i in range(100)
    ]
    s.schedule_many([*lows, *highs])
    Forwarders(procs, valkey_url, prefix, 4, "--batch", "100").start()
    wait_for(lambda: s.client.llen(key) >= 2100, 60, lambda: f"2100 items in {key}, got {s.client.llen(key)}")
    procs.stop_all()
    arrived = [b.decode() for b in s.client.lrange(key, 0, -1)]
    assert sorted(arrived) == sorted(i for i, *_ in [*lows, *highs])
    position = {item_id: n for n, item_id in enumerate(arrived)}
    assert max(position[h[0]] for h in highs) < 400
    for shard in range(4):
        mine = [i for i in arrived if s.shard_of(i) == shard]
        ranked = sorted((h for h in highs if s.shard_of(h[0]) == shard), key=lambda h: (-h[3], h[1]))
        assert mine[: len(ranked)] == [h[0] for h in ranked]


# -- Celery: the priority mapping on each broker --------------------------------------------------


@pytest.fixture(params=BROKERS)
def celery_env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    yield env
    delete_queue(env)


@pytest.mark.parametrize(
    "priority, amqp, redis_rank",
    [(None, 0, 0), (0, 0, 9), (1, 1, 8), (5, 5, 4), (9, 9, 0), (10, 10, 0), (255, 255, 0), (300, 255, 0), (-1, 0, 9)],
)
def test_priority_rank_mapping(priority: Any, amqp: int, redis_rank: int) -> None:
    assert priority_rank(priority, "amqp") == amqp
    assert priority_rank(priority, "redis") == redis_rank
    assert priority_rank(priority, "sqs") == 0


def test_celery_tasks_get_the_rank_their_broker_gives_their_priority(celery_env: CeleryEnv) -> None:
    """RabbitMQ serves higher priorities first, kombu's Redis transport lower ones: the stored
    rank follows the broker, and no priority is rank 0 on both."""
    app = celery_env.app()
    store = store_for(app)
    expected = {
        None: 0,
        **{p: priority_rank(p, "amqp" if celery_env.kind == "rabbitmq" else "redis") for p in (0, 3, 9)},
    }
    ids = {}
    for priority in expected:
        options = {} if priority is None else {"priority": priority}
        ids[priority] = app.send_task("dqt.record", args=["x"], countdown=3600, **options).id
    assert {p: store.rank(i) for p, i in ids.items()} == expected
    highest = 9 if celery_env.kind == "rabbitmq" else 0
    assert store.rank(ids[highest]) == 9  # the broker's highest priority is the highest rank


def test_celery_on_redis_broker_forwards_high_priority_first(
    request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    """A due backlog of 400 tasks without priority and 40 with priority 0 (kombu's highest on
    Redis), forwarded by a real `delayq forward` process with batch 20: both kinds land in the
    same Redis list (kombu's priority-0 bucket), whose LPUSH order shows arrival order."""
    env = new_env("redis", broker_url_for("redis", request, valkey_server), valkey_server)
    app = env.app()
    store = store_for(app)
    low = [app.send_task("dqt.record", args=["low"], countdown=3600).id for _ in range(400)]
    high = [app.send_task("dqt.record", args=["high"], countdown=3600, priority=0).id for _ in range(40)]
    now = datetime.now(timezone.utc)
    for n, task_id in enumerate(low + high):  # due now, the high ones the latest of all
        assert store.reschedule(task_id, now - timedelta(seconds=10) + timedelta(milliseconds=n))
    args = [sys.executable, "-m", "delayq_backends.cli", "forward", "--url", env.store, "--prefix", env.prefix]
    args += ["--shards", "4", "--celery-broker", env.broker, "--batch", "20", "--log-level", "warning"]
    env.start(args, "forwarder", tmp_path)
    broker = redis.Redis.from_url(env.broker)
    try:
        wait_for(
            lambda: broker.llen(env.queue) >= 440,
            60,
            lambda: f"440 messages, got {broker.llen(env.queue)}\n{env.tail()}",
        )
    finally:
        env.stop()
    arrived = [json.loads(m)["headers"]["id"] for m in reversed(broker.lrange(env.queue, 0, -1))]
    broker.delete(env.queue)
    assert sorted(arrived) == sorted(low + high)
    position = {task_id: n for n, task_id in enumerate(arrived)}
    assert max(position[t] for t in high) < 4 * 20  # all in the first pass
    for shard in range(4):
        mine = [t for t in arrived if store.shard_of(t) == shard]
        ranked = [t for t in high if store.shard_of(t) == shard]
        assert sorted(mine[: len(ranked)]) == sorted(ranked)
