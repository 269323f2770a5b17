"""claim.lua, ack.lua and schedule.lua work on whole batches (one HMGET per hash, one variadic
write per key, cut into chunks of 1,000 values): bad items mixed into a batch are still buried one
by one with their reason while the rest is leased, acks delete only what is still ours, and
batches longer than a chunk lose nothing."""

from __future__ import annotations

from delayq_backends import DelayStore
from tests.scripts import ENV, T

#: more than includes/batch.lua's CHUNK values, so every variadic call is cut in two or more
LONG = 2_500


def on_shard(store: DelayStore, shard: int, n: int, tag: str = "v") -> list[str]:
    """The first n ids of the form <tag><number> that fall on ``shard``."""
    ids: list[str] = []
    number = 0
    while len(ids) < n:
        if store.shard_of(f"{tag}{number}") == shard:
            ids.append(f"{tag}{number}")
        number += 1
    return ids


def test_bad_items_mixed_into_a_batch_are_buried_each_with_its_reason(store: DelayStore) -> None:
    ids = on_shard(store, 0, 10)
    store.schedule_many([(item_id, (T + n) / 1000, ENV) for n, item_id in enumerate(ids)])
    k = store.keys(0)
    no_envelope, bad_tries, bad_lease, spent, counted = ids[1], ids[3], ids[5], ids[7], ids[8]
    store.client.hdel(k.items, no_envelope)
    store.client.hset(k.tries, bad_tries, b"lots")
    store.client.hset(k.leased, bad_lease, b"garbage")
    store.client.hset(k.tries, spent, str(store.config.max_attempts).encode())  # this claim is one too many
    store.client.hset(k.tries, counted, b"2")
    raw = b"\xff-not-utf8"
    store.client.zadd(k.due, {raw: T + 4})
    store.client.hset(k.items, raw, store.check_payload("x", ENV))

    claim = store.claim(0, limit=100, lease_ms=1000, now=T + 100)

    good = [i for i in ids if i not in (no_envelope, bad_tries, bad_lease, spent)]
    assert [i.id for i in claim.items] == good  # in ready order, the bad ones left out
    assert {i.id: i.attempts for i in claim.items} == {i: 3 if i == counted else 1 for i in good}
    assert [i.ready_ms for i in claim.items] == [T + ids.index(i) for i in good]
    reasons = {d.id: d.error for d in store.dead_letters()}
    assert "no envelope" in reasons[no_envelope]
    assert "tries entry" in reasons[bad_tries]
    assert "leased entry" in reasons[bad_lease]
    assert "without an ack" in reasons[spent]
    assert any("not UTF-8" in why for why in reasons.values())
    assert len(reasons) == 5
    leased = store.client.hgetall(k.leased)
    assert set(leased) == {i.encode() for i in good}  # the buried ones hold no lease
    assert all(v.startswith(f"{claim.lease}:".encode()) for v in leased.values())
    assert all(store.client.zscore(k.due, i) == claim.deadline_ms for i in good)
    assert store.client.hget(k.tries, counted) == b"3"
    assert store.ack(claim) == len(good)
    assert store.client.zcard(k.due) == 0 and store.client.hlen(k.items) == 0


def test_a_batch_longer_than_a_chunk_is_claimed_and_acked_whole(store: DelayStore) -> None:
    ids = on_shard(store, 1, LONG, tag="long")
    counts = store.schedule_many([(item_id, T / 1000, ENV) for item_id in ids])
    assert (counts.added, counts.replaced, counts.kept) == (LONG, 0, 0)
    k = store.keys(1)
    store.client.hdel(k.items, ids[1500])  # one bad item in the second chunk
    claim = store.claim(1, limit=LONG, lease_ms=1000, now=T + 1)
    assert len(claim.items) == LONG - 1 and ids[1500] not in {i.id for i in claim.items}
    assert store.client.hlen(k.leased) == LONG - 1 and store.client.hlen(k.tries) == LONG - 1
    assert store.client.zcount(k.due, claim.deadline_ms, claim.deadline_ms) == LONG - 1
    assert store.ack(claim) == LONG - 1
    assert [store.client.hlen(key) for key in (k.items, k.tries, k.leased)] == [0, 0, 0]
    assert store.client.zcard(k.due) == 0


def test_ack_of_a_mixed_batch_deletes_only_what_is_still_ours(store: DelayStore) -> None:
    ids = on_shard(store, 2, 6)
    store.schedule_many([(item_id, T / 1000, ENV) for item_id in ids])
    claim = store.claim(2, lease_ms=1000, now=T)
    mine, cancelled, replaced, reclaimed, unknown = ids[0], ids[1], ids[2], ids[3], "never-scheduled"
    store.cancel(cancelled)  # in flight: gone from the store, its lease with it
    store.schedule(replaced, (T + 5) / 1000, ENV)  # a new item of that id: not ours to delete
    k = store.keys(2)
    store.client.hset(k.leased, reclaimed, f"{T + 2000}:other:{T}".encode())  # another claim's lease
    acked = store.ack(claim, [mine, mine, cancelled, replaced, reclaimed, unknown, ids[4]])
    assert acked == 2  # mine (once, though named twice) and ids[4]
    assert not store.exists(mine) and not store.exists(ids[4])
    assert store.exists(replaced) and store.exists(reclaimed) and store.exists(ids[5])
    assert store.client.hget(k.leased, reclaimed) == f"{T + 2000}:other:{T}".encode()


def test_schedule_batches_count_replaced_and_kept_with_duplicates(store: DelayStore) -> None:
    a, b, c = on_shard(store, 3, 3)
    store.schedule(a, T / 1000, ENV)
    claim = store.claim(3, lease_ms=1000, now=T)
    replace = store.schedule_many([(a, (T + 1) / 1000, ENV), (b, (T + 2) / 1000, ENV), (b, (T + 3) / 1000, ENV)])
    assert (replace.added, replace.replaced, replace.kept) == (1, 2, 0)  # b's second row replaces its first
    assert store.get(b).ready_ms == T + 3  # type: ignore[union-attr]
    got = store.get(a)
    assert got is not None and got.ready_ms == T + 1 and got.leased_until_ms is None and got.attempts == 0
    assert store.ack(claim) == 0  # the replaced item lost the lease
    keep = store.schedule_many([(a, T / 1000, ENV), (c, T / 1000, ENV), (c, (T + 9) / 1000, ENV)], mode="keep")
    assert (keep.added, keep.replaced, keep.kept) == (1, 0, 2)  # a exists, c's second row meets the first
    assert store.get(c).ready_ms == T  # type: ignore[union-attr]


def test_schedule_of_a_long_batch_with_ranks(store: DelayStore) -> None:
    ids = on_shard(store, 0, LONG, tag="ranked")
    counts = store.schedule_many([(item_id, T / 1000, ENV, n % 3) for n, item_id in enumerate(ids)])
    assert counts.added == LONG
    claim = store.claim(0, limit=5, now=T + 1)
    top = sorted(i for n, i in enumerate(ids) if n % 3 == 2)  # highest rank; equal times go by id
    assert [i.id for i in claim.items] == top[:5]


def test_a_big_claim_writes_its_leases_into_hashtables_a_small_one_into_listpacks(store: DelayStore) -> None:
    """includes/batch.lua's hset_many(): a listpack hash finds each field by a linear scan, so
    from WIDE_FROM (32) leases on the claim converts `leased` and `tries` first; what it leaves
    are the leases and counts alone."""
    ids = on_shard(store, 3, 40, tag="wide")
    store.schedule_many([(item_id, T / 1000, ENV) for item_id in ids])
    k = store.keys(3)
    small = store.claim(3, limit=8, lease_ms=1000, now=T)
    assert {store.client.object("encoding", key) for key in (k.leased, k.tries)} == {b"listpack"}
    store.ack(small)
    big = store.claim(3, limit=32, lease_ms=1000, now=T)
    assert len(big.items) == 32
    assert {store.client.object("encoding", key) for key in (k.leased, k.tries)} == {b"hashtable"}
    leased = store.client.hgetall(k.leased)
    assert set(leased) == {i.id.encode() for i in big.items}
    assert all(v == f"{big.lease}:{T}".encode() for v in leased.values())
    assert set(store.client.hvals(k.tries)) == {b"1"}
    assert store.ack(big) == 32
    assert store.client.exists(k.leased, k.tries) == 0


def test_counts_are_read_when_only_the_tries_hash_holds_entries(store: DelayStore) -> None:
    """claim.lua skips reading `leased` or `tries` while it is empty; one of them empty does not
    make it skip the other."""
    ids = on_shard(store, 1, 3, tag="count")
    store.schedule_many([(item_id, T / 1000, ENV) for item_id in ids])
    k = store.keys(1)
    store.client.hset(k.tries, ids[1], b"2")
    assert store.client.exists(k.leased) == 0
    claim = store.claim(1, lease_ms=1000, now=T)
    assert {i.id: i.attempts for i in claim.items} == {ids[0]: 1, ids[1]: 3, ids[2]: 1}
    assert store.client.hget(k.tries, ids[1]) == b"3"
