"""cancel.lua and reschedule.lua: by id, O(log N), leased or not."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.models import CancelOutcome, RescheduleOutcome
from tests.scripts import ENV, T


def test_cancel_removes_and_reports(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    assert store.cancel("a") is CancelOutcome.CANCELLED
    assert store.cancel("a") is CancelOutcome.NOT_FOUND
    assert store.get("a") is None and not store.exists("a")


def test_cancel_of_leased_item_removes_it_everywhere(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    outcome = store.cancel("a")
    assert outcome is CancelOutcome.IN_FLIGHT and not outcome  # removed, but maybe published already
    keys = store.keys(claim.shard)
    assert store.client.hlen(keys.leased) == 0 and store.client.hlen(keys.tries) == 0
    assert store.ack(claim) == 0


def test_reschedule_moves_only_existing_items(store: DelayStore) -> None:
    assert store.reschedule("nope", T / 1000) is RescheduleOutcome.NOT_FOUND
    assert store.get("nope") is None
    store.schedule("a", T / 1000, ENV)
    assert store.reschedule("a", (T + 1) / 1000) is RescheduleOutcome.RESCHEDULED
    assert store.get("a").ready_ms == T + 1  # type: ignore[union-attr]
