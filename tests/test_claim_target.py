"""The generic half of the exactly-once hand-off: a ClaimTarget gets the batch's Lease, the
forwarder prefers publish_claimed, and ids the target acked itself are not acked again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from delayq_backends import DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.store import Lease
from delayq_backends.targets import ClaimTarget, Delivery, PublishReport, RedisListTarget
from tests.harness import make_store


class TransactionalListTarget(RedisListTarget):
    """RPUSH and the store's ack in one MULTI/EXEC, guarded by the lease (the RQ target's pattern)."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.leases: list[Lease] = []

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        self.leases.append(lease)
        assert lease.shares_server(self.client)
        with self.client.pipeline() as pipe:
            pipe.watch(lease.watch_key)
            held = lease.held(pipe, [d.id for d in deliveries])
            pipe.multi()
            for d in deliveries:
                if d.id in held:
                    pipe.rpush(d.envelope.destination, d.envelope.body)
            lease.ack(held, pipeline=pipe)
            pipe.execute()
        return PublishReport(published=held, acked=held)


def test_the_forwarder_prefers_publish_claimed_and_does_not_ack_twice(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=2)
    client = redis.Redis.from_url(valkey_url)
    target = TransactionalListTarget(client)
    assert isinstance(target, ClaimTarget)
    store.schedule_many([(f"i{n}", 1, RedisListTarget.envelope(f"{prefix}:out", b"x")) for n in range(10)])
    forwarder = Forwarder(store, [target])
    acks: list[Any] = []
    real_ack_many = store.ack_many

    def ack_many(pairs: Any) -> list[int | Exception]:
        acks.extend(list(ids) for _, ids in pairs)  # the forwarder's own acks, not the target's
        return real_ack_many(pairs)

    store.ack_many = ack_many  # type: ignore[method-assign]
    assert forwarder.run_once() == 10
    assert client.llen(f"{prefix}:out") == 10 and sum(s.scheduled for s in store.stats()) == 0
    assert forwarder.stats.acked == 10 and forwarder.stats.forwarded == 10
    assert acks and all(not ids for ids in acks)  # nothing left for the forwarder's own ack
    assert {lease.claim.shard for lease in target.leases} <= {0, 1} and all(
        lease.store is store for lease in target.leases
    )
    client.close()


def test_held_sees_only_our_lease(valkey_url: str, prefix: str) -> None:
    store: DelayStore = make_store(valkey_url, prefix, shards=1)
    store.schedule_many([("a", 1, b"DQ\x01\x00\x00\x00\x02{}"), ("b", 1, b"DQ\x01\x00\x00\x00\x02{}")])
    stale = store.claim(0, lease_ms=1)
    assert sorted(store.held(stale, ["a", "b"])) == ["a", "b"]
    store.cancel("b")
    assert store.held(stale, ["a", "b"]) == ["a"]
    fresh = store.claim(0, lease_ms=60_000, now=store.server_time_ms() + 10)  # the stale lease has ended
    assert store.held(stale, ["a"]) == [] and store.held(fresh, ["a"]) == ["a"]
