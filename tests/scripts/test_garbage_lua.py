"""Values written straight into a shard's keys (the producer role may write them): the scripts
check each before writing anything, bury the bad item with a reason naming it, and claim the
rest; the readers never raise on them."""

from __future__ import annotations

from typing import Any

import pytest

from delayq_backends import DelayStore
from delayq_backends.keys import MAX_RANK, RANK_SPAN
from delayq_backends.models import FailedDelivery
from tests.scripts import ENV, T


def three_on_one_shard(store: DelayStore) -> tuple[int, list[str]]:
    """Three due ids of one shard, in ready order: a, b (the one made bad), c."""
    ids = [f"g{n}" for n in range(200) if store.shard_of(f"g{n}") == 0][:3]
    store.schedule_many([(item_id, (T + n) / 1000, ENV) for n, item_id in enumerate(ids)])
    return 0, ids


def dead_reasons(store: DelayStore) -> dict[str, str]:
    return {d.id: d.error for d in store.dead_letters()}


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("tries", b"lots", "tries entry"),
        ("tries", b"1.5", "tries entry"),
        ("leased", b"garbage", "leased entry"),
        ("leased", b"1:tok:nope", "leased entry"),
    ],
)
def test_a_bad_value_buries_its_item_and_the_batch_is_claimed(
    store: DelayStore, key: str, value: bytes, why: str
) -> None:
    shard, (a, b, c) = three_on_one_shard(store)
    store.client.hset(getattr(store.keys(shard), key), b, value)
    assert store.get(b) is not None and [i.id for i in store.scheduled()] == [a, b, c]  # readable meanwhile
    claim = store.claim(shard, now=T + 10)
    assert [i.id for i in claim.items] == [a, c]
    reason = dead_reasons(store)[b]
    assert why in reason and "not delivered" in reason
    assert store.ack(claim) == 2
    assert store.stats()[shard].scheduled == 0 and store.client.hlen(store.keys(shard).leased) == 0


@pytest.mark.parametrize("score", ["-inf", "+inf"])
def test_a_non_finite_score_never_stops_a_reader_and_is_buried_when_claimed(store: DelayStore, score: str) -> None:
    shard, (a, b, c) = three_on_one_shard(store)
    store.client.zadd(store.keys(shard).due, {b: float(score)})
    heads = store.heads()  # OverflowError before
    assert heads[shard] is not None and all(h is None or h >= 0 for h in heads)
    assert {i.id for i in store.scheduled()} == {a, b, c} and store.get(b) is not None
    assert {i.id for i in store.scan()} == {a, b, c}
    assert store.stats()[shard].scheduled == 3
    claim = store.claim(shard, now=T + 10)
    if score == "-inf":
        assert [i.id for i in claim.items] == [a, c]
        assert "ready time" in dead_reasons(store)[b]
        assert store.dead_letters()[0].ready_ms is None
    else:
        assert [i.id for i in claim.items] == [a, c]  # +inf never comes due


def test_an_id_that_is_not_utf8_is_buried_not_leased(store: DelayStore) -> None:
    shard, (a, b, c) = three_on_one_shard(store)
    k = store.keys(shard)
    raw = b"\xff\xfe-bad"
    store.client.zadd(k.due, {raw: T + 1})
    store.client.hset(k.items, raw, store.check_payload("x", ENV))
    assert len(store.scheduled()) == 4 and len(list(store.scan())) == 4  # readers show it escaped
    claim = store.claim(shard, now=T + 10)  # decoding failed here, after the lease was taken
    assert [i.id for i in claim.items] == [a, b, c]
    (dead,) = store.dead_letters()
    assert "not UTF-8" in dead.error and dead.id.startswith("\\xff\\xfe")
    assert store.client.hlen(k.leased) == 3  # ours only
    assert store.purge_dead() == 1


def test_garbage_dead_letter_info_and_scores_are_readable(store: DelayStore) -> None:
    k = store.keys(1)
    for item_id, score, info in [
        ("d1", float("-inf"), b'{"error": "x", "attempts": "many", "ready_ms": "soon"}'),
        ("d2", 5.0, b"[1, 2]"),
        ("d3", float("inf"), b"\xff not json"),
    ]:
        store.client.zadd(k.dead, {item_id: score})
        store.client.hset(k.dead_info, item_id, info)
    letters = {d.id: d for d in store.dead_letters()}
    assert set(letters) == {"d1", "d2", "d3"} and letters["d1"].attempts == 0


def test_a_key_of_the_wrong_type_is_that_shards_error_in_stats(store: DelayStore) -> None:
    store.schedule("x", T / 1000, ENV)
    bad = store.keys(2).due
    store.client.set(bad, "not a zset")
    stats = store.stats()
    assert stats[2].error and "shard 2" in stats[2].error
    assert all(s.error is None for s in stats if s.shard != 2)
    assert sum(s.scheduled for s in stats) == 1
    with pytest.raises(Exception, match="WRONGTYPE"):
        store.claim(2, now=T)
    assert store.client.get(bad) == b"not a zset", "refused before writing anything"
    store.client.delete(bad)


def test_a_hand_written_ranked_entry_outside_every_band_is_dropped(store: DelayStore) -> None:
    store.schedule("r", T / 1000, ENV, rank=3)
    k = store.keys(store.shard_of("r"))
    store.client.zadd(k.ranked, {"junk": float("inf"), "junk2": MAX_RANK * RANK_SPAN + 5})
    assert [i.id for i in store.claim(store.shard_of("r"), now=T).items] == ["r"]
    assert store.client.zscore(k.ranked, "junk") is None


def test_old_deferred_entries_are_claimed_at_their_time_and_not_stepped_over(store: DelayStore) -> None:
    """Entries written by the previous defer.lua: ranked entry left at the ready time."""
    ids = [f"d{n}" for n in range(400) if store.shard_of(f"d{n}") == 0][:50]
    store.schedule_many([(i, T / 1000, ENV, 5) for i in ids])
    store.schedule("now", T / 1000, ENV, rank=1) if store.shard_of("now") == 0 else None
    k = store.keys(0)
    later = T + 60_000
    for item_id in ids:  # what defer.lua wrote before: score = not-before, entry "<nb>:deferred:<ready>"
        store.client.zadd(k.due, {item_id: later})
        store.client.hset(k.leased, item_id, f"{later}:deferred:{T}")
    assert store.claim(0, now=T + 1).items == [i for i in store.claim(0, now=T + 1).items if i.id == "now"]
    band = (MAX_RANK - 5) * RANK_SPAN
    assert store.client.zscore(k.ranked, ids[0]) == band + later, "moved once to its not-before time"
    again = store.claim(0, limit=100, now=later)
    assert sorted(i.id for i in again.items) == sorted(ids) and {i.ready_ms for i in again.items} == {T}


def test_defer_moves_the_ranked_entry_so_claims_skip_deferred_items(store: DelayStore) -> None:
    store.schedule("r", T / 1000, ENV, rank=5)
    shard = store.shard_of("r")
    claim = store.claim(shard, now=T)
    assert store.defer(claim, [("r", T + 5000)]) == 1
    assert store.client.zscore(store.keys(shard).ranked, "r") == (MAX_RANK - 5) * RANK_SPAN + T + 5000
    assert store.claim(shard, now=T + 4999).items == []
    assert [(i.id, i.ready_ms) for i in store.claim(shard, now=T + 5000).items] == [("r", T)]


def test_dead_letters_capped_per_shard(server_url: str, prefix: str) -> None:
    from tests.harness import make_store

    s = make_store(server_url, prefix, shards=1, max_attempts=1, dead_letter_max=3)
    for n in range(5):
        s.schedule(f"x{n}", (T + n) / 1000, ENV)
        claim = s.claim(0, limit=1, now=T + 10 + n)
        s.fail(claim, [FailedDelivery(f"x{n}", None, "boom")], now=T + 10 + n)
    assert sorted(d.id for d in s.dead_letters()) == ["x2", "x3", "x4"]
    assert s.client.hlen(s.keys(0).dead_info) == 3


def test_requeue_and_purge_of_all_run_in_chunks(store: DelayStore, monkeypatch: Any) -> None:
    import delayq_backends.store.reader as store_module

    monkeypatch.setattr(store_module, "DEAD_CHUNK", 3)
    k = store.keys(0)
    for n in range(10):  # dead letters written directly; d0 has no envelope: it stays
        store.client.zadd(k.dead, {f"d{n}": T + n})
        if n:
            store.client.hset(k.dead_items, f"d{n}", store.check_payload("x", ENV))
    calls: list[Any] = []
    real = store._write
    monkeypatch.setattr(store, "_write", lambda *a: calls.append(a) or real(*a))
    assert store.requeue_dead(when=T / 1000) == 9
    assert len(calls) == 4 and [d.id for d in store.dead_letters()] == ["d0"]
    assert store.purge_dead() == 1 and store.dead_letters() == []


def test_a_lease_of_the_first_releases_is_still_read_and_claimed(store: DelayStore) -> None:
    """ "<deadline>:<ready>" (before claim tokens): an expired one is claimed with its ready time."""
    shard, (a, b, c) = three_on_one_shard(store)
    k = store.keys(shard)
    store.client.zadd(k.due, {b: T + 5})
    store.client.hset(k.leased, b, f"{T + 5}:{T - 7}")
    assert store.get(b).ready_ms == T - 7  # type: ignore[union-attr]
    claim = store.claim(shard, now=T + 10)
    assert {(i.id, i.ready_ms) for i in claim.items} >= {(b, T - 7)} and store.dead_letters() == []
