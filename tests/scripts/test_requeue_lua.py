"""requeue.lua and purge.lua: dead letters back into the schedule, or gone for good."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.models import FailedDelivery
from delayq_backends.scripts.store import Purge, Requeue
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


def bury_many(store: DelayStore, shard: int, count: int, tag: str) -> list[str]:
    """``count`` dead letters on ``shard``, buried by one claim and one fail."""
    ids = [f"{tag}{k}" for k in range(60 * count) if store.shard_of(f"{tag}{k}") == shard][:count]
    store.schedule_many((i, T / 1000, ENV) for i in ids)
    claim = store.claim(shard, now=T, limit=count)
    store.fail(claim, [FailedDelivery(i, None, "boom") for i in ids], now=T)
    return ids


def test_one_call_touches_at_most_max_dead_letters_whatever_it_asks(store: DelayStore) -> None:
    """Purge and requeue are capped on the server, as claim is: a caller's own FCALL asking for
    1e9 letters (or passing more ids) gets 1,000; the store's own calls page past it."""
    keys = store._keys[0]
    bury_many(store, 0, 1_100, "p")
    assert store.scripts.run(Purge.oldest(keys, 0)) == 0  # none, not ZRANGE 0 -1
    assert store.scripts.run(Purge.oldest(keys, 10**9)) == 1_000
    assert store.purge_dead() == 100
    ids = bury_many(store, 0, 1_100, "r")
    assert store.scripts.run(Requeue.page(keys, 0, 10**9, ready_ms=T, wake="")).seen == 1_000
    assert store.scripts.run(Requeue.ids(keys, ids, ready_ms=T, wake="")).seen == 1_000
