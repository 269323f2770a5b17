"""defer.lua: leased items back in the store not before a time, attempt not counted, original
ready time kept (flow control)."""

from __future__ import annotations

from delayq_backends import DelayStore
from tests.scripts import ENV, T


def test_defer_waits_until_not_before_and_keeps_ready_time_and_attempts(store: DelayStore) -> None:
    store.schedule("a", (T + 5) / 1000, ENV)
    shard = store.shard_of("a")
    claim = store.claim(shard, lease_ms=30_000, now=T + 10)
    assert store.defer(claim, [("a", T + 1000)]) == 1
    item = store.get("a")
    assert item is not None
    assert (item.ready_ms, item.attempts) == (T + 5, 0)
    assert store.heads()[shard] == T + 1000
    assert store.claim(shard, now=T + 999).items == []
    again = store.claim(shard, now=T + 1000)
    assert [(i.id, i.ready_ms, i.attempts) for i in again.items] == [("a", T + 5, 1)]


def test_deferred_twice_still_reports_the_first_ready_time(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    shard = store.shard_of("a")
    for k in range(1, 4):
        claim = store.claim(shard, now=T + k * 1000)
        assert [i.ready_ms for i in claim.items] == [T]
        store.defer(claim, [("a", T + (k + 1) * 1000 - 1)])
    assert store.get("a").attempts == 0  # type: ignore[union-attr]


def test_old_claim_cannot_ack_release_or_defer_a_deferred_item(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    store.defer(claim, [("a", T + 500)])
    assert store.ack(claim) == 0
    assert store.release(claim) == 0
    assert store.defer(claim, [("a", T + 9000)]) == 0
    assert store.get("a").ready_ms == T  # type: ignore[union-attr]
    assert store.heads()[claim.shard] == T + 500


def test_defer_after_lease_lost_does_nothing(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    first = store.claim(store.shard_of("a"), lease_ms=100, now=T)
    second = store.claim(first.shard, lease_ms=100, now=T + 500)
    assert store.defer(first, [("a", T + 10_000)]) == 0
    assert store.get("a").leased_until_ms == second.deadline_ms  # type: ignore[union-attr]


def test_reschedule_and_cancel_of_a_deferred_item(store: DelayStore) -> None:
    store.schedule_many([("a", T / 1000, ENV), ("b", T / 1000, ENV)])
    for item_id in ("a", "b"):
        claim = store.claim(store.shard_of(item_id), now=T)
        store.defer(claim, [(i.id, T + 500) for i in claim.items])
    assert store.reschedule("a", (T + 50) / 1000)
    item = store.get("a")
    assert item is not None and (item.ready_ms, item.leased_until_ms) == (T + 50, None)
    assert store.cancel("b") and store.get("b") is None
