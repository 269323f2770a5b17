"""requeue.lua and purge.lua: dead letters back into the schedule, or gone for good."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.models import FailedDelivery
from tests.scripts import ENV, T


def bury(store: DelayStore, *ids: str) -> None:
    for item_id in ids:
        store.schedule(item_id, T / 1000, ENV)
        claim = store.claim(store.shard_of(item_id), now=T)
        store.fail(claim, [FailedDelivery(item_id, None, "boom")], now=T)


def test_requeue_selected_dead_letter(store: DelayStore) -> None:
    bury(store, "a", "b")
    assert store.requeue_dead(["a"], when=T / 1000) == 1
    item = store.get("a")
    assert item is not None and item.ready_ms == T and item.attempts == 0
    assert [d.id for d in store.dead_letters()] == ["b"]


def test_requeue_all_and_skip_ids_scheduled_again(store: DelayStore) -> None:
    bury(store, "a", "b", "c")
    store.schedule("b", (T + 9) / 1000, ENV)  # scheduled again since it died: keep the live one
    assert store.requeue_dead(when=T / 1000) == 2
    assert store.get("b").ready_ms == T + 9  # type: ignore[union-attr]
    assert [d.id for d in store.dead_letters()] == ["b"]


def test_purge_selected_and_all(store: DelayStore) -> None:
    bury(store, "a", "b", "c")
    assert store.purge_dead(["a", "zz"]) == 1
    assert sorted(d.id for d in store.dead_letters()) == ["b", "c"]
    assert store.purge_dead() == 2
    assert store.dead_letters() == [] and sum(s.dead for s in store.stats()) == 0


def test_an_id_that_looks_like_a_wildcard_is_just_an_id(store: DelayStore) -> None:
    bury(store, "*", "a")
    assert store.purge_dead(["*"]) == 1
    assert [d.id for d in store.dead_letters()] == ["a"]
    bury(store, "*")
    assert store.requeue_dead(["*"], when=T / 1000) == 1
    assert store.exists("*") and [d.id for d in store.dead_letters()] == ["a"]
