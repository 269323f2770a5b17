"""debounce.lua: schedules of one key collapse into one pending run (debounce: at the last
call's time; throttle: at the first's), keeping the first or last envelope; a call once a
forwarder holds the run starts the next one, which the old forwarder's late ack leaves alone."""

from __future__ import annotations

import pytest

from delayq_backends import DelayStore
from delayq_backends.errors import ConfigError, InvalidIdError
from delayq_backends.targets import RedisListTarget
from tests.scripts import T


def env(n: int) -> bytes:
    return RedisListTarget.envelope("out", str(n).encode()).encode()


def body(store: DelayStore, item_id: str) -> bytes:
    item = store.get(item_id)
    assert item is not None
    return item.envelope


def test_debounce_fires_at_the_last_call_with_the_chosen_envelope(store: DelayStore) -> None:
    for keep, kept in (("last", 9), ("first", 0)):
        results = [store.debounce(f"k-{keep}", (T + n * 100) / 1000, env(n), keep=keep) for n in range(10)]
        assert [r.calls for r in results] == list(range(1, 11))
        assert results[0].new_run and not results[1].new_run
        assert [r.stored for r in results] == [True] + [keep == "last"] * 9
        assert results[-1].ready_ms == T + 900
        item = store.get(f"debounce:k-{keep}")
        assert item is not None and (item.ready_ms, item.calls) == (T + 900, 10)
        assert item.envelope == env(kept)
        assert store.claim(item.shard, now=T + 899).items == []
        assert [i.envelope for i in store.claim(item.shard, now=T + 900).items] == [env(kept)]


def test_throttle_keeps_the_first_calls_time(store: DelayStore) -> None:
    for keep, kept in (("last", 4), ("first", 0)):
        for n in range(5):
            result = store.throttle(f"t-{keep}", (T + 1000 + n * 100) / 1000, env(n), keep=keep)
            assert result.ready_ms == T + 1000
        item = store.get(f"throttle:t-{keep}")
        assert item is not None and (item.ready_ms, item.calls, item.envelope) == (T + 1000, 5, env(kept))


def test_last_envelope_reports_what_it_superseded(store: DelayStore) -> None:
    assert store.debounce("s", T / 1000, env(1)).superseded is None
    assert store.debounce("s", T / 1000, env(2)).superseded == env(1)
    assert store.debounce("s", T / 1000, env(3), keep="first").superseded is None


def test_a_call_after_the_claim_starts_a_new_run_that_the_late_ack_leaves_alone(store: DelayStore) -> None:
    store.debounce("k", T / 1000, env(1))
    store.debounce("k", T / 1000, env(2))
    claim = store.claim(store.shard_of("debounce:k"), now=T)
    assert [i.envelope for i in claim.items] == [env(2)]
    again = store.debounce("k", (T + 5000) / 1000, env(3), keep="first")
    assert (again.calls, again.stored, again.superseded) == (1, True, None)
    assert store.ack(claim) == 0  # the new run is not the old forwarder's
    item = store.get("debounce:k")
    assert item is not None and (item.ready_ms, item.calls, item.attempts, item.leased_until_ms) == (
        T + 5000,
        1,
        0,
        None,
    )


def test_a_deferred_run_is_pending_debounce_moves_it_throttle_keeps_it(store: DelayStore) -> None:
    for mode in ("debounce", "throttle"):
        call = getattr(store, mode)
        call("d", T / 1000, env(1))
        shard = store.shard_of(f"{mode}:d")
        claim = store.claim(shard, now=T)
        assert store.defer(claim, [(f"{mode}:d", T + 2000)]) == 1
        result = call("d", (T + 500) / 1000, env(2))
        assert result.calls == 2
        item = store.get(f"{mode}:d")
        assert item is not None
        if mode == "debounce":
            assert (item.ready_ms, item.leased_until_ms) == (T + 500, None)
        else:
            due = store.client.zscore(store.keys(shard).due, "throttle:d")
            assert (result.ready_ms, item.ready_ms, due) == (T, T, T + 2000)


def test_rank_follows_the_kept_call(store: DelayStore) -> None:
    store.debounce("r", T / 1000, env(1), rank=5)
    store.debounce("r", T / 1000, env(2), rank=7, keep="first")
    assert store.rank("debounce:r") == 5
    store.debounce("r", T / 1000, env(3), rank=0)
    assert store.rank("debounce:r") == 0


def test_the_counter_expires_a_day_after_the_run(store: DelayStore) -> None:
    store.debounce("e", T / 1000, env(1))
    k = store.keys(store.shard_of("debounce:e"))
    assert store.client.pexpiretime(k.calls("debounce:e")) == T + 86_400_000


def test_bad_input_is_refused_and_stores_nothing(store: DelayStore) -> None:
    with pytest.raises(ConfigError, match="keep='middle'"):
        store.debounce("x", T / 1000, env(1), keep="middle")
    for key in ("", None, b"x", "a\nb"):
        with pytest.raises(InvalidIdError):
            store.debounce(key, T / 1000, env(1))  # type: ignore[arg-type]
    assert store.get("debounce:x") is None


def test_a_hand_written_counter_of_another_type_is_refused_before_any_write(store: DelayStore) -> None:
    k = store.keys(store.shard_of("debounce:w"))
    store.client.set(k.calls("debounce:w"), "junk")
    with pytest.raises(Exception, match="is not a hash"):
        store.debounce("w", T / 1000, env(1))
    assert store.get("debounce:w") is None
    store.client.delete(k.calls("debounce:w"))
    store.client.hset(k.calls("debounce:w"), "calls", "garbage")
    store.debounce("w", T / 1000, env(1))
    assert store.debounce("w", T / 1000, env(2)).calls == 2  # a fresh run resets it
