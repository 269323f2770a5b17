"""claim.lua: due items only, earliest first, leased until a deadline, dead after max attempts."""

from __future__ import annotations

from delayq_backends import DelayStore
from tests.scripts import ENV, T


def one_shard(store: DelayStore, n: int) -> list[str]:
    """n ids that share the shard of the first one."""
    ids = [f"i{k}" for k in range(2000)]
    shard = store.shard_of(ids[0])
    return [i for i in ids if store.shard_of(i) == shard][:n]


def test_claims_only_due_items_earliest_first(store: DelayStore) -> None:
    a, b, c = one_shard(store, 3)
    store.schedule(a, (T + 20) / 1000, ENV)
    store.schedule(b, (T + 10) / 1000, ENV)
    store.schedule(c, (T + 5000) / 1000, ENV)
    claim = store.claim(store.shard_of(a), limit=10, lease_ms=1000, now=T + 100)
    assert [i.id for i in claim.items] == [b, a]
    assert [i.ready_ms for i in claim.items] == [T + 10, T + 20]
    assert claim.deadline_ms == T + 1100
    assert all(i.attempts == 1 for i in claim.items)
    got = store.get(a)
    assert got is not None and got.leased_until_ms == T + 1100 and got.ready_ms == T + 20


def test_limit_is_respected(store: DelayStore) -> None:
    ids = one_shard(store, 5)
    store.schedule_many([(i, T / 1000, ENV) for i in ids])
    assert len(store.claim(store.shard_of(ids[0]), limit=3, now=T + 1).items) == 3


def test_leased_item_is_not_claimed_again_until_lease_expires(store: DelayStore) -> None:
    (a,) = one_shard(store, 1)
    shard = store.shard_of(a)
    store.schedule(a, T / 1000, ENV)
    first = store.claim(shard, lease_ms=1000, now=T)
    assert [i.id for i in first.items] == [a]
    assert store.claim(shard, lease_ms=1000, now=T + 999).items == []
    second = store.claim(shard, lease_ms=1000, now=T + 1000)
    assert [(i.id, i.attempts, i.ready_ms) for i in second.items] == [(a, 2, T)]


def test_item_over_max_attempts_goes_to_dead_letters(server_url: str, prefix: str) -> None:
    from tests.harness import make_store

    store = make_store(server_url, prefix, shards=2, max_attempts=2)
    store.schedule("a", T / 1000, ENV)
    shard = store.shard_of("a")
    assert len(store.claim(shard, lease_ms=10, now=T).items) == 1
    assert len(store.claim(shard, lease_ms=10, now=T + 10).items) == 1
    assert store.claim(shard, lease_ms=10, now=T + 20).items == []
    assert not store.exists("a")
    (dead,) = store.dead_letters()
    assert dead.id == "a" and dead.attempts == 3 and dead.ready_ms == T
    assert "3 times without an ack" in dead.error
    assert dead.envelope == ENV.encode()


def test_id_without_envelope_is_dead_lettered_not_returned(store: DelayStore) -> None:
    keys = store.keys(store.shard_of("ghost"))
    store.client.zadd(keys.due, {"ghost": T})
    claim = store.claim(store.shard_of("ghost"), now=T + 1)
    assert claim.items == []
    (dead,) = store.dead_letters()
    assert dead.id == "ghost" and "no envelope" in dead.error and dead.envelope is None


def test_a_huge_limit_is_cut_to_the_most_one_claim_takes(store: DelayStore) -> None:
    """Any user allowed to call claim could pass a limit as big as the shard; the script cuts it."""
    from delayq_backends.forwarder import MAX_BATCH

    shard = store.shard_of("x")
    ids = [f"x{k}" for k in range(40 * (MAX_BATCH + 100)) if store.shard_of(f"x{k}") == shard][: MAX_BATCH + 100]
    store.schedule_many((i, T / 1000, ENV) for i in ids)
    claim = store.claim(shard, limit=10**9, lease_ms=1000, now=T + 1)
    assert len(claim.items) == MAX_BATCH
