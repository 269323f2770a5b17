"""RunGuard, the broker-neutral half of worker-side dedupe, on a real server."""

from __future__ import annotations

import redis
from redis.crc import key_slot

from bench.lib.proxy import TcpProxy
from delayq_backends import Config, DelayStore
from delayq_backends.dedupe import RunGuard, Verdict
from delayq_backends.embedded import EmbeddedServer


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
        guard = RunGuard(DelayStore(client, Config(prefix=prefix, shards=4)), ttl_ms=1000)
        proxy.cut()
        decision = guard.start("job-1", 0)
        assert decision.verdict is Verdict.UNCHECKED and decision.run
    finally:
        proxy.close()
