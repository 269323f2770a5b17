"""ack.lua: delete only what is still under our lease."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.models import RescheduleOutcome
from delayq_backends.targets import RedisListTarget
from tests.scripts import ENV, T


def claim_a(store: DelayStore, now: int = T, lease_ms: int = 1000):  # type: ignore[no-untyped-def]
    store.schedule("a", T / 1000, ENV) if not store.exists("a") else None
    return store.claim(store.shard_of("a"), lease_ms=lease_ms, now=now)


def test_ack_deletes_item_and_its_bookkeeping(store: DelayStore) -> None:
    claim = claim_a(store)
    assert store.ack(claim) == 1
    assert store.get("a") is None
    keys = store.keys(claim.shard)
    assert not store.client.hexists(keys.tries, "a") and not store.client.hexists(keys.leased, "a")


def test_ack_after_cancel_and_reschedule_keeps_the_new_item(store: DelayStore) -> None:
    claim = claim_a(store)
    store.cancel("a")
    store.schedule("a", (T + 60_000) / 1000, ENV)
    assert store.ack(claim) == 0
    item = store.get("a")
    assert item is not None and item.ready_ms == T + 60_000


def test_reschedule_of_a_leased_item_is_in_flight_and_changes_nothing(store: DelayStore) -> None:
    """Moving it could deliver it now (the forwarder holds it) and again at the new time."""
    claim = claim_a(store)
    outcome = store.reschedule("a", (T + 5000) / 1000)
    assert outcome is RescheduleOutcome.IN_FLIGHT and not outcome
    item = store.get("a")
    assert item is not None and item.ready_ms == T and item.leased_until_ms == claim.deadline_ms
    assert store.ack(claim) == 1


def test_ack_after_replace_keeps_the_replacement(store: DelayStore) -> None:
    claim = claim_a(store)
    store.schedule("a", (T + 7000) / 1000, RedisListTarget.envelope("out", b"retry"))
    assert store.ack(claim) == 0
    assert store.get("a").ready_ms == T + 7000  # type: ignore[union-attr]


def test_stale_ack_after_lease_expiry_and_reclaim_deletes_nothing(store: DelayStore) -> None:
    first = claim_a(store, now=T, lease_ms=100)
    second = store.claim(first.shard, lease_ms=100, now=T + 200)
    assert [i.id for i in second.items] == ["a"]
    assert store.ack(first) == 0
    assert store.exists("a")
    assert store.ack(second) == 1
    assert not store.exists("a")


def test_ack_of_an_older_claim_with_the_same_deadline_deletes_nothing(store: DelayStore) -> None:
    """Leases of different lengths can end on the same millisecond; the claim token tells them apart."""
    first = claim_a(store, now=T, lease_ms=1000)
    store.schedule("a", T / 1000, ENV)
    second = store.claim(first.shard, lease_ms=500, now=T + 500)
    assert second.deadline_ms == first.deadline_ms and second.token != first.token
    assert store.ack(first) == 0 and store.release(first) == 0
    assert store.ack(second) == 1
