"""RunGuard, the broker-neutral half of worker-side dedupe, on a real server."""

from __future__ import annotations

import threading
from typing import Any

import redis
from redis.crc import key_slot

from bench.lib.proxy import TcpProxy
from delayq_backends import Config, DelayStore
from delayq_backends.dedupe import RunGuard, Verdict
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.models import RunRef
from tests.helpers import wait_for


def test_first_start_runs_a_second_is_dropped_and_the_next_run_runs(valkey_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(valkey_url)
    guard = RunGuard(DelayStore(client, Config(prefix=prefix, shards=4)), ttl_ms=5000)
    first = guard.start("job-1", 0)
    assert first.verdict is Verdict.FIRST and first.run
    again = guard.start("job-1", 0)
    assert again.verdict is Verdict.DUPLICATE and not again.run
    assert again.first is not None and again.first.split(" ")[0] == client.get(first.key).decode().split(" ")[0]
    assert guard.start("job-1", 1).verdict is Verdict.FIRST  # a retry is a new run
    assert 0 < client.pttl(first.key) <= 5000
    assert guard.counts() == {Verdict.FIRST: 2, Verdict.DUPLICATE: 1, Verdict.UNCHECKED: 0}


def test_starts_on_each_server_kind_and_garbage_is_replaced(store: DelayStore) -> None:
    """On a cluster too (the record goes to the shard's node); a record that is no worker's (a
    hand write, another type) is replaced once and the run goes ahead; a real one drops it."""
    guard = RunGuard(store, ttl_ms=5000)
    for n, plant in enumerate([lambda k: store.client.set(k, "junk"), lambda k: store.client.hset(k, "a", "b")]):
        key = guard.key(f"g{n}", 0)
        plant(key)
        assert guard.start(f"g{n}", 0).verdict is Verdict.FIRST
        assert guard.start(f"g{n}", 0).verdict is Verdict.DUPLICATE
        assert store.started(store.shard_of(f"g{n}"), [RunRef(f"g{n}", 0)]) == {f"g{n}"}
    store.client.set(guard.key("h", 0), "junk")
    assert store.started(store.shard_of("h"), [RunRef("h", 0)]) == set(), "a hand write is no start"


def test_the_record_lives_in_the_items_shard_slot_and_derives_from_id_and_run(valkey_url: str, prefix: str) -> None:
    """A forwarder's shard script can read it beside the item (issue 15, item 3)."""
    store = DelayStore(redis.Redis.from_url(valkey_url), Config(prefix=prefix, shards=16))
    guard = RunGuard(store, ttl_ms=1000)
    for item_id in ("a", "{odd}id", "x:y:z"):
        items = store.keys(store.shard_of(item_id)).items
        key = guard.key(item_id, 3)
        assert key_slot(key.encode()) == key_slot(items.encode())
        assert key.endswith(f":started:3:{item_id}")


def test_a_store_out_of_reach_answers_unchecked(valkey_server: EmbeddedServer, prefix: str) -> None:
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    try:
        client = redis.Redis(port=proxy.port, socket_connect_timeout=1, socket_timeout=1)
        guard = RunGuard(DelayStore(client, Config(prefix=prefix, shards=4)), ttl_ms=1000, wait_ms=0)
        proxy.cut()
        decision = guard.start("job-1", 0)
        assert decision.verdict is Verdict.UNCHECKED and decision.run
    finally:
        proxy.close()


def test_a_start_waits_out_a_short_outage(valkey_server: EmbeddedServer, prefix: str) -> None:
    """A store restart or failover of a second: the start retries and is recorded, not unchecked."""
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    try:
        client = redis.Redis(port=proxy.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        guard = RunGuard(DelayStore(client, Config(prefix=prefix, shards=4)), ttl_ms=60_000, wait_ms=10_000)
        guard.key("job-1", 0)  # the layout read, before the cut
        proxy.cut()
        threading.Timer(1.0, proxy.restore).start()
        assert guard.start("job-1", 0).verdict is Verdict.FIRST
    finally:
        proxy.close()


def test_an_unchecked_run_is_recorded_once_the_store_is_back(valkey_server: EmbeddedServer, prefix: str) -> None:
    """So a lossless forwarder finds it started and does not publish it again."""
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    try:
        client = redis.Redis(port=proxy.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        guard = RunGuard(DelayStore(client, Config(prefix=prefix, shards=4)), ttl_ms=60_000, wait_ms=0)
        key = guard.key("job-1", 0)
        proxy.cut()
        assert guard.start("job-1", 0).verdict is Verdict.UNCHECKED
        assert guard.pending() == 1
        direct = redis.Redis(port=valkey_server.port)
        assert not direct.exists(key)
        proxy.restore()
        wait_for(lambda: guard.pending() == 0, 20, "the record to be written")
        assert direct.exists(key) and 0 < direct.pttl(key) <= 60_000
        assert guard.start("job-1", 0).verdict is Verdict.DUPLICATE
    finally:
        proxy.close()


class _LostReply(redis.Redis):
    """A client whose first SET reaches the server but whose reply is lost (a cut, a restart)."""

    lose = 1

    def set(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().set(*args, **kwargs)
        if self.lose:
            self.lose -= 1
            raise redis.ConnectionError("connection lost after the write")
        return reply


def test_a_start_whose_reply_was_lost_is_not_its_own_duplicate(valkey_url: str, prefix: str) -> None:
    """The retry finds the record it wrote itself: the run goes ahead (found in a chaos run, where
    a store restart dropped the reply and the task was dropped as a duplicate of itself)."""
    guard = RunGuard(DelayStore(_LostReply.from_url(valkey_url), Config(prefix=prefix, shards=4)), ttl_ms=60_000)
    assert guard.start("job-1", 0).verdict is Verdict.FIRST
    assert guard.start("job-1", 0).verdict is Verdict.DUPLICATE  # a second start still is one
