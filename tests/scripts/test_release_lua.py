"""release.lua: back to the original ready time, attempt not counted."""

from __future__ import annotations

from delayq_backends import DelayStore
from tests.scripts import ENV, T


def test_release_restores_original_ready_time_and_attempts(store: DelayStore) -> None:
    store.schedule("a", (T + 5) / 1000, ENV)
    claim = store.claim(store.shard_of("a"), lease_ms=30_000, now=T + 10)
    assert store.release(claim) == 1
    item = store.get("a")
    assert item is not None
    assert (item.ready_ms, item.attempts, item.leased_until_ms) == (T + 5, 0, None)
    again = store.claim(claim.shard, now=T + 10)
    assert [(i.id, i.attempts) for i in again.items] == [("a", 1)]


def test_release_after_expiry_and_reclaim_does_nothing(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    first = store.claim(store.shard_of("a"), lease_ms=100, now=T)
    second = store.claim(first.shard, lease_ms=100, now=T + 500)
    assert store.release(first) == 0
    assert store.get("a").leased_until_ms == second.deadline_ms  # type: ignore[union-attr]


def test_release_of_second_attempt_keeps_first_attempt(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    store.claim(store.shard_of("a"), lease_ms=100, now=T)
    second = store.claim(store.shard_of("a"), lease_ms=100, now=T + 100)
    store.release(second)
    assert store.get("a").attempts == 1  # type: ignore[union-attr]
