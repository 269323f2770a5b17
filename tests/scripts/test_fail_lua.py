"""fail.lua: retry later with attempts kept, or bury with the error."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.models import FailCounts, FailedDelivery
from tests.scripts import ENV, T


def test_transient_failure_retries_at_given_time(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    assert store.fail(claim, [FailedDelivery("a", T + 4000, "broker said no")], now=T) == FailCounts(1, 0)
    item = store.get("a")
    assert item is not None and (item.ready_ms, item.attempts, item.leased_until_ms) == (T + 4000, 1, None)


def test_permanent_failure_buries_with_error_and_envelope(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    assert store.fail(claim, [FailedDelivery("a", None, "corrupt envelope: bad magic")], now=T + 5) == FailCounts(0, 1)
    assert not store.exists("a")
    (dead,) = store.dead_letters()
    assert (dead.id, dead.error, dead.attempts, dead.died_ms, dead.ready_ms) == (
        "a",
        "corrupt envelope: bad magic",
        1,
        T + 5,
        T,
    )
    assert dead.envelope == ENV.encode()


def test_failure_at_max_attempts_buries(server_url: str, prefix: str) -> None:
    from tests.harness import make_store

    store = make_store(server_url, prefix, shards=1, max_attempts=2)
    store.schedule("a", T / 1000, ENV)
    c1 = store.claim(0, now=T)
    assert store.fail(c1, [FailedDelivery("a", T + 10, "e1")], now=T) == FailCounts(1, 0)
    c2 = store.claim(0, now=T + 10)
    counts = store.fail(c2, [FailedDelivery("a", T + 20, "e2")], now=T + 10)
    assert counts == FailCounts(0, 1) and counts.buried_ids == ("a",)  # for targets.BuryTarget
    assert store.dead_letters()[0].error == "e2"


def test_fail_with_foreign_lease_does_nothing(store: DelayStore) -> None:
    store.schedule("a", T / 1000, ENV)
    claim = store.claim(store.shard_of("a"), now=T)
    store.schedule("a", (T + 100) / 1000, ENV)
    assert store.fail(claim, [FailedDelivery("a", None, "late")], now=T) == FailCounts(0, 0)
    assert store.exists("a") and store.dead_letters() == []
