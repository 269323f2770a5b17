"""Bad input and bad data, systematically: each gets a clear error or a dead letter with the
reason; the forwarder never dies or spins, and nothing else is lost. Real servers only."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayq_backends import DelayqError, DelayStore, Envelope, StoreFullError
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.forwarder.parking import ParkedRecheck
from delayq_backends.keys import PARKED_MS
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import make_store
from tests.helpers import wait_for

ids = st.one_of(
    st.text(max_size=600),
    st.binary(max_size=80),
    st.sampled_from(["", "*", "a b", "\ud800", "é" * 300, "{x}", "id:with:colons"]),
)
times = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**16), max_value=10**16),
    st.datetimes(timezones=st.none() | st.just(timezone.utc)),
    st.timedeltas(min_value=timedelta(days=-3), max_value=timedelta(days=3)),
    st.sampled_from([None, "2030-01-01", True]),
)
payloads = st.one_of(
    st.binary(max_size=300).map(lambda b: RedisListTarget.envelope("out", b)),
    st.binary(max_size=40),
    st.integers(min_value=0, max_value=3000).map(lambda n: RedisListTarget.envelope("out", b"x" * n)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(item_id=ids, when=times, payload=payloads)
def test_schedule_stores_exactly_what_it_accepts(valkey_url: str, item_id: Any, when: Any, payload: Any) -> None:
    """Any input either schedules the item where ``get`` finds it, or raises a DelayqError
    (a ValueError too) and stores nothing; never another exception."""
    store = make_store(valkey_url, "fuzz", shards=4, max_payload_bytes=2048)
    before = sum(s.scheduled for s in store.stats())
    try:
        store.schedule(item_id, when, payload)
    except DelayqError as exc:
        assert isinstance(exc, ValueError) and str(exc)
        assert sum(s.scheduled for s in store.stats()) == before
        return
    finally:
        store.client.close()
    store = make_store(valkey_url, "fuzz", shards=4)
    item = store.get(item_id)
    assert item is not None and store.cancel(item_id)
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        assert math.isclose(item.ready_ms, when * 1000, abs_tol=1)
    if isinstance(when, datetime):  # rounded up: never a fraction of a ms early
        assert 0 <= item.ready_ms - when.timestamp() * 1000 < 1.001
    store.client.close()


@pytest.fixture
def running(valkey_url: str, prefix: str) -> Iterator[tuple[DelayStore, Forwarder, CollectingTarget]]:
    """A forwarder running in a thread on a 4-shard store, delivering to a collecting target."""
    store = make_store(valkey_url, prefix, shards=4)
    inbox = CollectingTarget("list")
    forwarder = Forwarder(store, [inbox], poll_interval=0.1, max_retry_delay=2)
    thread = threading.Thread(target=forwarder.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    yield store, forwarder, inbox
    forwarder.stop()
    thread.join(10)
    assert not thread.is_alive(), "the forwarder stops when asked"


def test_a_corrupt_shard_is_set_aside_and_the_rest_flows(running: tuple[DelayStore, Forwarder, Any]) -> None:
    store, forwarder, inbox = running
    bad = store.keys(0).leased
    store.client.set(bad, "not a hash")  # a key of ours holding another type: WRONGTYPE in the claim
    items = [f"i{n}" for n in range(60)]
    store.schedule_many((i, 1, RedisListTarget.envelope("out", b"x")) for i in items)
    on_bad = {i for i in items if store.shard_of(i) == 0}
    wait_for(lambda: set(inbox.ids) == set(items) - on_bad, 10, "every item of the healthy shards")
    wait_for(lambda: forwarder.stats.errors >= 2, 10, "the bad shard to be retried with back-off")
    assert forwarder.stats.errors < 10, "backs off instead of spinning"
    store.client.delete(bad)  # repaired: nothing of that shard was lost
    wait_for(lambda: set(inbox.ids) == set(items), 10, "the repaired shard's items")
    assert len(inbox.ids) == len(items) and store.dead_letters() == []


def test_a_full_store_refuses_schedules_clearly_and_the_forwarder_drains_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with EmbeddedServer() as server:
        store = make_store(server.url, "full", shards=2)
        store.schedule_many((f"i{n}", 1, RedisListTarget.envelope("out", b"x")) for n in range(20))
        admin = redis.Redis.from_url(server.url)
        admin.config_set("maxmemory", "1")  # below what is used: every write is refused
        with pytest.raises(StoreFullError, match="nothing was written.*noeviction"):
            store.schedule("more", 1, RedisListTarget.envelope("out", b"x"))
        with pytest.raises(StoreFullError):
            store.schedule_many((f"m{n}", 1, RedisListTarget.envelope("out", b"x")) for n in range(600))
        inbox = CollectingTarget("list")
        forwarder = Forwarder(store, [inbox], poll_interval=0.1, max_retry_delay=1)
        thread = threading.Thread(target=forwarder.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        try:
            # claims and acks run at maxmemory (allow-oom): a full store drains
            wait_for(lambda: len(inbox.ids) == 20, 10, "every item delivered from the full store")
            assert store.get("more") is None, "the refused schedule stored nothing"
            with pytest.raises(StoreFullError):
                store.schedule("more", 1, RedisListTarget.envelope("out", b"x"))
        finally:
            forwarder.stop()
            thread.join(10)
            admin.close()


def run_until(forwarder: Forwarder, done: Callable[[], bool], what: str) -> None:
    """Run ``forwarder`` in a thread until ``done()`` (at most 15 s), then stop it."""
    thread = threading.Thread(target=forwarder.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(done, 15, what)
    finally:
        forwarder.stop()
        thread.join(10)


def parked_in(store: DelayStore, item_id: str) -> tuple[float | None, float | None, bytes | None]:
    """``item_id``'s score in its shard's due index and in its parked set, and its parked reason."""
    k = store.keys(store.shard_of(item_id))
    return (
        store.client.zscore(k.due, item_id),
        store.client.zscore(k.parked, item_id),
        store.client.hget(k.parked_why, item_id),
    )


def claims_pass_it_by(
    store: DelayStore, inbox: CollectingTarget, forwarder: Forwarder, parked: int
) -> Callable[[], bool]:
    """A condition for :func:`run_until`: once ``parked`` items are parked and "fine" delivered,
    20 more items due one by one are delivered (each a claim of its shard) with no parked one
    claimed again."""
    step = {"scheduled": False}

    def done() -> bool:
        if forwarder.stats.parked < parked or "fine" not in inbox.ids:
            return False
        if not step["scheduled"]:
            step["scheduled"] = True
            now = store.server_time_ms() / 1000
            store.schedule_many((f"later{n}", now + n / 50, RedisListTarget.envelope("out", b"x")) for n in range(20))
        return len(inbox.ids) == 21

    return done


def look_now(store: DelayStore, ids: list[str]) -> None:
    """Make the parked ``ids``' time to be looked at again come (as if PARK_FOR_MS passed)."""
    for item_id in ids:
        store.client.zadd(store.keys(store.shard_of(item_id)).parked, {item_id: 0}, xx=True)


def test_an_envelope_from_a_newer_delayq_is_parked_for_a_newer_forwarder(
    valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling upgrade with producers first: an item of a format this forwarder does not read
    is parked out of the due index for a newer forwarder (claimed once, then never again until
    its re-check), never dead-lettered, no attempt counted, its ready time kept, logged once per
    format and counted by a metric; a re-check by a forwarder that still cannot read it keeps it
    parked another PARK_FOR_MS."""
    store = make_store(valkey_url, prefix, shards=4)
    newer = bytearray(Envelope("list", "out", b"x").encode())
    newer[2] = 99  # format version byte
    store.schedule("future-format", 1, bytes(newer))
    store.schedule("fine", 1, RedisListTarget.envelope("out", b"x"))
    inbox = CollectingTarget("list")
    metrics = ForwarderMetrics()
    forwarder = Forwarder(store, [inbox], poll_interval=0.05, metrics=metrics)
    caplog.set_level(logging.WARNING, logger="delayq.forwarder")
    run_until(forwarder, claims_pass_it_by(store, inbox, forwarder, 1), "the parked item passed by")
    assert inbox.ids[0] == "fine" and len(inbox.ids) == 21 and store.dead_letters() == []
    assert forwarder.stats.newer_format == 1, "claimed once: parked, no claim reads it again"
    due, look, why = parked_in(store, "future-format")
    assert due == PARKED_MS and look is not None and look > store.server_time_ms() + 20_000 and why == b"format:99"
    item = store.get("future-format")
    assert item is not None and item.envelope == bytes(newer) and item.attempts == 0 and item.ready_ms == 1000
    assert item.parked == "format:99"
    assert sum(s.parked for s in store.stats()) == 1
    said = [r.getMessage() for r in caplog.records if "newer than this delayq reads" in r.getMessage()]
    assert len(said) == 1 and "upgrade" in said[0] and "parked" in said[0], caplog.text
    assert metrics.registry.get_sample_value("delayq_newer_format_total", {"format": "99"}) == 1
    look_now(store, ["future-format"])
    assert ParkedRecheck(forwarder.recheck.ctx).run() is False
    assert parked_in(store, "future-format")[0] == PARKED_MS, "this forwarder still cannot read it: kept parked"
    assert (parked_in(store, "future-format")[1] or 0) > store.server_time_ms() + 20_000


def test_an_item_without_a_target_here_is_parked_for_a_forwarder_that_has_one(
    valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Celery item (a periodic entry, say) claimed by a forwarder started without
    --celery-broker: a configuration, not the item's fault. Parked like a newer format's (no
    attempt, never dead, claimed once), logged once per kind, counted; once its time to be looked
    at again comes, a forwarder with the target releases and delivers it, its ready time kept."""
    store = make_store(valkey_url, prefix, shards=4, max_attempts=2)
    store.schedule_many([(f"c{i}", 1, Envelope("celery", "default", b"{}")) for i in range(3)])
    store.schedule("fine", 1, RedisListTarget.envelope("out", b"x"))
    inbox, metrics = CollectingTarget("list"), ForwarderMetrics()
    forwarder = Forwarder(store, [inbox], poll_interval=0.05, metrics=metrics)
    caplog.set_level(logging.WARNING, logger="delayq.forwarder")
    run_until(forwarder, claims_pass_it_by(store, inbox, forwarder, 3), "the parked items passed by")
    assert inbox.ids[0] == "fine" and len(inbox.ids) == 21 and store.dead_letters() == [] and forwarder.stats.dead == 0
    assert forwarder.stats.no_target == 3, "each claimed once: parked, no claim reads it again"
    assert all((item := store.get(f"c{i}")) is not None and item.attempts == 0 for i in range(3))
    assert {parked_in(store, f"c{i}")[2] for i in range(3)} == {b"target:celery"}
    said = [r.getMessage() for r in caplog.records if "no 'celery' target" in r.getMessage()]
    assert len(said) == 1 and "not an attempt" in said[0], caplog.text
    assert metrics.registry.get_sample_value("delayq_no_target_total", {"target": "celery"}) == 3
    celery = CollectingTarget("celery")
    assert Forwarder(store, [celery]).run_until_idle().forwarded == 0, "not looked at again before its time"
    look_now(store, [f"c{i}" for i in range(3)])
    with_celery = Forwarder(store, [celery])
    done = with_celery.run_until_idle()
    assert sorted(celery.ids) == ["c0", "c1", "c2"] and done.forwarded == 3 and with_celery.stats.unparked == 3
    assert sum(s.parked for s in store.stats()) == 0, "released: no longer parked"
    assert all(store.client.zcard(store.keys(s).parked) == 0 for s in range(4))


def test_an_expired_back_off_does_not_keep_an_idle_forwarder_awake(valkey_url: str, prefix: str) -> None:
    """A shard set aside that is empty once its back-off ends must not wake the forwarder at
    once, again and again: an idle forwarder sleeps until its poll."""
    store = make_store(valkey_url, prefix, shards=4)
    forwarder = Forwarder(store, [CollectingTarget("list")], poll_interval=0.3)
    forwarder.shards.until[0] = (forwarder.server_now_ms() - 5_000, 1_000)  # ended 5 s ago
    started = time.monotonic()
    forwarder.loop.sleep(None, store.heads())  # nothing scheduled: only the poll should end the sleep
    assert time.monotonic() - started >= 0.25


def test_a_store_at_maxmemory_drains_and_a_partial_bulk_schedule_says_what_was_stored() -> None:
    """noeviction + a small maxmemory, filled until refused: claims and acks still run (allow-oom),
    schedules are refused, and the refused bulk write names what it did not store."""
    with EmbeddedServer() as server:
        store = make_store(server.url, "oom", shards=4)
        admin = redis.Redis.from_url(server.url)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 3_000_000)
        body = RedisListTarget.envelope("out", b"x" * 2000)
        batch = [(f"i{n}", 1, body) for n in range(8000)]  # about 16 MB in 16 calls: some refused
        with pytest.raises(StoreFullError) as refused:
            store.schedule_many(batch)
        err = refused.value
        assert err.stored > 0 and err.stored + len(err.not_stored) == len(batch)
        assert f"{err.stored} items were stored" in str(err)
        assert not any(store.exists(i) for i in err.not_stored[:50])
        assert sum(s.scheduled for s in store.stats()) == err.stored
        filled = 0
        with pytest.raises(StoreFullError, match="nothing was written.*noeviction") as single:
            while filled < 100_000:  # the bulk's refusal counted its own query buffer: fill up
                store.schedule(f"f{filled}", 1, body)
                filled += 1
        assert single.value.stored == 0
        drained = 0
        for shard in range(store.shards):  # the claim's first write used to be refused here
            while claim := store.claim(shard, limit=500):
                if not claim.items:
                    break
                drained += store.ack(claim)
        assert drained == err.stored + filled and sum(s.scheduled for s in store.stats()) == 0
        assert store.schedule("more", 1, body) == "added", "room again once drained"
        admin.close()


def test_ready_times_round_up_to_the_next_ms() -> None:
    from delayq_backends.timeutil import to_ms

    at = datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc)  # 1 microsecond past a ms
    assert to_ms(at) == int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000) + 1
    assert to_ms(timedelta(microseconds=1), clock=lambda: 1000) == 1001
    assert to_ms(timedelta(milliseconds=300), clock=lambda: 1000) == 1300
    assert to_ms(0.3) == 300 and to_ms(1.0001) == 1001


def test_a_timedelta_is_measured_on_the_servers_clock(valkey_url: str, prefix: str, monkeypatch: Any) -> None:
    """A producer whose wall clock is an hour ahead still schedules a 10 s delay 10 s from the
    server's now (the clock every claim uses)."""
    monkeypatch.setattr(time, "time_ns", lambda: (time.monotonic_ns() + 10**18) // 1 + 3600 * 10**9)
    store = make_store(valkey_url, prefix, shards=2)
    store.schedule("x", timedelta(seconds=10), RedisListTarget.envelope("out", b"x"))
    item = store.get("x")
    assert item is not None and abs(item.ready_ms - (store.server_time_ms() + 10_000)) < 1000
