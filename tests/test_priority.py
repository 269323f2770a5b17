"""Priority under a backlog: ranked items are claimed before the rest, on every server kind.

Store-level tests pass ``now=`` to the claims, so "due" is exact and nothing sleeps.
"""

from __future__ import annotations

import random
import re

import pytest

from delayq_backends import DelayStore, InvalidRankError
from delayq_backends.keys import MAX_RANK, RANK_SPAN
from delayq_backends.scripts import source
from delayq_backends.targets import RedisListTarget
from tests.conftest import make_store

ENV = RedisListTarget.envelope("out", b"x")
T0 = 1_750_000_000_000  # ms: the ready times below lie just after it
NOW = T0 + 1_000_000  # every item scheduled at T0 + offset (offset < 1e6) is due


def ids(claim_items: list) -> list[str]:  # type: ignore[type-arg]
    return [c.id for c in claim_items]


@pytest.fixture
def one_shard(server_url: str, prefix: str) -> DelayStore:
    s = make_store(server_url, prefix, shards=1)
    s.client.script_flush()
    return s


def test_backlog_high_ranks_are_claimed_first_then_by_ready_time(one_shard: DelayStore) -> None:
    """2,000 low + 100 high-rank due items, batch 100: the first claim is exactly the high ones,
    highest rank first and earliest first within a rank; the lows follow earliest first."""
    rng = random.Random(7)
    lows = [(f"low{i}", (T0 + i) / 1000, ENV) for i in range(2000)]
    # high items are *later* than most lows: rank, not time, puts them first
    highs = [(f"high{i}", (T0 + 500_000 + rng.randrange(100_000)) / 1000, ENV, rng.choice([1, 5, 9])) for i in range(100)]
    entries: list = [*lows, *highs]  # type: ignore[type-arg]
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
    assert s.fail(failed, [("h6", NOW + 200, "boom")], now=NOW) == (1, 0)
    # h5 is leased: the next claim steps over it without spending the batch on it
    assert ids(s.claim(0, limit=3, now=NOW).items) == ["h7", "h8", "h9"]
    assert s.release(released) == 1
    assert ids(s.claim(0, limit=2, now=NOW).items) == ["h5", "l0"]
    # h6's retry and h3's reschedule come due ranked again, at their new times
    assert ids(s.claim(0, limit=1, now=NOW + 200).items) == ["h6"]
    assert ids(s.claim(0, limit=1, now=NOW + 500).items) == ["h3"]
    assert s.reschedule("h3", (T0 + 1) / 1000)  # earlier again, and its lease dropped
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
