"""schedule.lua: add, replace, keep, and the wake-up of sleeping forwarders."""

from __future__ import annotations

import time

from delayq_backends import DelayStore, Envelope
from delayq_backends.targets import RedisListTarget
from tests.harness import make_store

ENV = RedisListTarget.envelope("out", b"one")


def test_schedule_adds_item_with_exact_ms(store: DelayStore) -> None:
    assert store.schedule("a", 1_800_000_000.123, ENV) == "added"
    item = store.get("a")
    assert item is not None
    assert item.ready_ms == 1_800_000_000_123
    assert Envelope.decode(item.envelope) == ENV
    assert item.attempts == 0 and item.leased_until_ms is None


def test_replace_updates_time_and_envelope(store: DelayStore) -> None:
    store.schedule("a", 1_800_000_000, ENV)
    other = RedisListTarget.envelope("out", b"two")
    assert store.schedule("a", 1_900_000_000, other) == "replaced"
    item = store.get("a")
    assert item is not None and item.ready_ms == 1_900_000_000_000
    assert Envelope.decode(item.envelope).body == b"two"
    assert sum(s.scheduled for s in store.stats()) == 1


def test_keep_leaves_existing_item(store: DelayStore) -> None:
    store.schedule("a", 1_800_000_000, ENV)
    assert store.schedule("a", 1_900_000_000, RedisListTarget.envelope("out", b"two"), mode="keep") == "kept"
    item = store.get("a")
    assert item is not None and item.ready_ms == 1_800_000_000_000
    assert Envelope.decode(item.envelope).body == b"one"


def test_schedule_many_counts_per_mode(store: DelayStore) -> None:
    first = store.schedule_many([(f"id{i}", 1_800_000_000 + i, ENV) for i in range(1200)])
    assert (first.added, first.replaced, first.kept) == (1200, 0, 0)
    again = store.schedule_many([(f"id{i}", 1_800_000_000, ENV) for i in range(1000, 1500)], mode="keep")
    assert (again.added, again.replaced, again.kept) == (300, 0, 200)
    assert store.get("id1100").ready_ms == 1_800_001_100_000  # type: ignore[union-attr]
    assert sum(s.scheduled for s in store.stats()) == 1500


def test_new_head_publishes_wake_up_once(store: DelayStore) -> None:
    pubsub = store.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.wake_channel)
    pubsub.get_message(timeout=1)  # subscription confirmation
    shard = store.shard_of("late")
    same_shard = [f"x{i}" for i in range(200) if store.shard_of(f"x{i}") == shard][:2]
    store.schedule("late", 1_900_000_000, ENV)
    store.schedule(same_shard[0], 1_950_000_000, ENV)  # later than the head: no wake
    store.schedule(same_shard[1], 1_800_000_000, ENV)  # earlier: wake with its time
    messages = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(messages) < 2:
        m = pubsub.get_message(timeout=0.2)
        if m:
            messages.append(int(m["data"]))
    assert messages == [1_900_000_000_000, 1_800_000_000_000]
    pubsub.close()


def test_replace_counts_repeated_ids_and_drops_leases_of_replaced_items(store: DelayStore) -> None:
    # replace mode reads nothing per id: HSET's count of new fields splits added from replaced
    store.schedule("a", 1_000, ENV)
    claim = store.claim(store.shard_of("a"), lease_ms=60_000, now=2_000_000)
    assert [i.id for i in claim.items] == ["a"]
    shard_ids = [f"n{i}" for i in range(400) if store.shard_of(f"n{i}") == store.shard_of("a")][:2]
    rows = [("a", 1_800_000_000, ENV), (shard_ids[0], 1_800_000_000, ENV), (shard_ids[0], 1_800_000_001, ENV)]
    counts = store.schedule_many([*rows, (shard_ids[1], 1_800_000_000, ENV)])
    assert (counts.added, counts.replaced, counts.kept) == (2, 2, 0)  # a, and shard_ids[0]'s second row
    item = store.get("a")
    assert item is not None and (item.attempts, item.leased_until_ms) == (0, None)
    assert store.get(shard_ids[0]).ready_ms == 1_800_000_001_000  # type: ignore[union-attr]
    assert store.ack(claim) == 0  # the late ack leaves the new schedule of "a"
    assert store.get("a") is not None


def _one_by_one(store: DelayStore, rows: list[tuple[str, float, int]]) -> None:
    for item_id, when, rank in rows:
        store.schedule(item_id, when, ENV, rank=rank)  # schedule_one.lua


def _as_batches_of_one(store: DelayStore, rows: list[tuple[str, float, int]]) -> None:
    for item_id, when, rank in rows:
        store.schedule_many([(item_id, when, ENV, rank)])  # schedule.lua


def _shard_state(store: DelayStore) -> list[object]:
    """Every key a schedule writes, per shard, and the wake-ups it published."""
    c = store.client
    out: list[object] = []
    for shard in range(store.config.shards):
        k = store.keys(shard)
        out += [c.zrange(k.due, 0, -1, withscores=True), c.zrange(k.ranked, 0, -1, withscores=True)]
        out += [c.hgetall(k.items), c.hgetall(k.tries), c.hgetall(k.leased)]
    return out


def test_a_single_schedule_writes_what_a_batch_of_one_writes(store: DelayStore, server_url: str, prefix: str) -> None:
    # schedule() runs schedule_one.lua, schedule_many() schedule.lua: the same rows must leave
    # the same keys and wake-ups, leases and attempts of replaced items dropped, ranks set and cleared
    twin = make_store(server_url, f"{prefix}b", shards=4)
    states, wakes = [], []
    for s, write in ((store, _one_by_one), (twin, _as_batches_of_one)):
        pubsub = s.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(s.wake_channel)
        pubsub.get_message(timeout=1)
        write(s, [("a", 1_000, 0), ("r", 1_800_000_000, 5), ("x", 1_900_000_000, 0)])
        claim = s.claim(s.shard_of("a"), lease_ms=60_000, now=2_000_000)
        assert [i.id for i in claim.items] == ["a"] and s.client.hlen(s.keys(s.shard_of("a")).leased) == 1
        again = [("a", 1_700_000_000, 0), ("r", 1_600_000_000, 0), ("x", 1_950_000_000, 3), ("x", 1_500_000_000, 0)]
        write(s, [*again, ("s", 9e9, 7)])
        assert s.ack(claim) == 0  # the late ack leaves the new schedule of "a"
        states.append(_shard_state(s))
        received: list[bytes] = []
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            m = pubsub.get_message(timeout=0.1)
            if m:
                received.append(m["data"])
        wakes.append(received)
        pubsub.close()
    twin.client.close()
    assert states[0] == states[1]
    assert sorted(wakes[0]) == sorted(wakes[1]) and wakes[0]  # a cluster relays shards in any order
