"""keep.lua: lossless mode's ack. A published item stays, due again after the window, marked as
awaiting its start, with its attempt counted and its original ready time kept."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.models import CancelOutcome, RescheduleOutcome, RunRef
from delayq_backends.targets import RedisListTarget
from tests.scripts import ENV, T


def test_kept_item_is_due_after_the_window_with_its_ready_time_and_attempt(store: DelayStore) -> None:
    store.schedule("a", (T + 5) / 1000, ENV)
    shard = store.shard_of("a")
    claim = store.claim(shard, now=T + 10)
    assert store.keep(claim, {"a": 60_000}, now=T + 20) == 1
    item = store.get("a")
    assert item is not None and item.awaiting_start
    assert (item.ready_ms, item.attempts, item.leased_until_ms) == (T + 5, 1, T + 60_020)
    assert store.claim(shard, now=T + 60_019).items == []
    again = store.claim(shard, now=T + 60_020)
    assert [(i.id, i.ready_ms, i.attempts) for i in again.items] == [("a", T + 5, 2)]
    assert not store.get("a").awaiting_start  # type: ignore[union-attr]  # leased again
    assert store.ack(again) == 1 and store.get("a") is None


def test_old_claim_cannot_ack_or_keep_a_kept_item(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    store.keep(claim, {"a": 1000}, now=T)
    assert store.ack(claim) == 0
    assert store.keep(claim, {"a": 9000}, now=T) == 0
    assert store.release(claim) == 0
    assert store.get("a").leased_until_ms == T + 1000  # type: ignore[union-attr]


def test_keep_after_lease_lost_does_nothing(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    first = store.claim(store.shard_of("a"), lease_ms=100, now=T)
    second = store.claim(first.shard, lease_ms=100, now=T + 500)
    assert store.keep(first, {"a": 60_000}, now=T + 600) == 0
    assert store.get("a").leased_until_ms == second.deadline_ms  # type: ignore[union-attr]


def test_a_kept_item_is_in_flight_for_cancel_and_reschedule(store: DelayStore) -> None:
    store.schedule_many([("a", T / 1000, ENV), ("b", T / 1000, ENV)])
    for item_id in ("a", "b"):
        claim = store.claim(store.shard_of(item_id), now=T)
        store.keep(claim, {i.id: 1000 for i in claim.items}, now=T)
    assert store.reschedule("a", (T + 9000) / 1000) is RescheduleOutcome.IN_FLIGHT  # published: may run
    assert store.cancel("b") is CancelOutcome.IN_FLIGHT and store.get("b") is None


def test_schedule_keep_mode_replaces_an_item_awaiting_its_start(store: DelayStore) -> None:
    """A retry of a started task (same id, next run) must not be dropped as a duplicate send."""
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    store.keep(claim, {"a": 1000}, now=T)
    retry = RedisListTarget.envelope("out", b"retry")
    counts = store.schedule_many([("a", (T + 5000) / 1000, retry)], mode="keep")
    assert (counts.replaced, counts.kept) == (1, 0)
    item = store.get("a")
    assert item is not None and not item.awaiting_start and item.ready_ms == T + 5000
    store.schedule("b", T / 1000, ENV)
    assert store.schedule_many([("b", (T + 5000) / 1000, retry)], mode="keep").kept == 1  # not published: kept


def test_ranked_item_kept_leaves_the_claim_order_until_due(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV, rank=9)
    shard = store.shard_of("a")
    claim = store.claim(shard, now=T)
    store.keep(claim, {"a": 1000}, now=T)
    assert store.claim(shard, now=T + 999).items == []
    assert [(i.id, i.ready_ms) for i in store.claim(shard, now=T + 1000).items] == [("a", T)]
    assert store.rank("a") == 9


def test_started_finds_the_runs_workers_recorded(store: DelayStore) -> None:
    shard = store.shard_of("a")
    store.client.set(store.keys(shard).started("a", 1), "host:1 0")
    runs = [RunRef("a", 0), RunRef("a", 1)]
    assert store.started(shard, runs) == {"a"}
    assert store.started(shard, [RunRef("a", 0)]) == set()


def test_each_item_takes_its_own_window(store: DelayStore) -> None:
    store.schedule_many([(i, T / 1000, ENV) for i in ("a", "b", "c", "d")])
    for shard in {store.shard_of(i) for i in "abcd"}:
        claim = store.claim(shard, now=T)
        store.keep(claim, {i.id: 1000 * (ord(i.id) - 96) for i in claim.items}, now=T)
    assert [store.get(i).leased_until_ms for i in "abcd"] == [T + 1000, T + 2000, T + 3000, T + 4000]  # type: ignore[union-attr]
