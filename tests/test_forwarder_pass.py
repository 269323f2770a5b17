"""One forwarder pass acks every shard's batch in one round trip: what that keeps (publish
before ack, leases held until the acks, one bad shard set aside alone, nothing lost to a crash
between the publishes and the acks)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.models import Claim, DeliveryFailure
from delayq_backends.targets import Delivery, PublishReport, RedisListTarget
from tests.harness import make_store
from tests.helpers import wait_for


@pytest.fixture
def out(valkey_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(valkey_url)
    yield client
    client.close()


def delivered(out: redis.Redis, key: str) -> list[str]:
    return [json.loads(b)["id"] for b in out.lrange(key, 0, -1)]


def schedule(store: DelayStore, key: str, ids: Sequence[str]) -> None:
    rows = [(i, 0, RedisListTarget.envelope(key, json.dumps({"id": i}).encode())) for i in ids]
    store.schedule_many(rows)


def spy_acks(store: DelayStore) -> list[list[tuple[int, list[str]]]]:
    """Each ``ack_many`` call's (shard, ids); a single-claim ``ack`` fails the test."""
    calls: list[list[tuple[int, list[str]]]] = []
    real = store.ack_many

    def ack_many(acks: Sequence[tuple[Claim, Sequence[str]]]) -> list[int | Exception]:
        calls.append([(claim.shard, list(ids)) for claim, ids in acks])
        return real(acks)

    def ack(*_: Any, **__: Any) -> int:
        raise AssertionError("a claim acked on its own, not with the pass")

    store.ack_many = ack_many  # type: ignore[method-assign]
    store.ack = ack  # type: ignore[method-assign]
    return calls


class Hooked(RedisListTarget):
    """A list target that calls ``hook(call number, deliveries)`` after each publish."""

    def __init__(self, client: redis.Redis, hook: Any) -> None:
        super().__init__(client)
        self.hook = hook
        self.calls = 0

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        report = super().publish_many(deliveries)
        self.calls += 1
        self.hook(self.calls, deliveries)
        return report


def test_a_pass_over_several_shards_acks_them_all_in_one_call(valkey_url: str, prefix: str, out: redis.Redis) -> None:
    store = make_store(valkey_url, prefix, shards=8)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(64)]
    schedule(store, key, ids)
    calls = spy_acks(store)
    forwarder = Forwarder(store, [RedisListTarget(out)])
    assert forwarder.run_once() == 64
    assert len(calls) == 1 and sorted(shard for shard, _ in calls[0]) == list(range(8))
    assert sorted(i for _, acked in calls[0] for i in acked) == sorted(ids)
    assert sorted(delivered(out, key)) == sorted(ids) and forwarder.stats.acked == 64
    assert sum(s.scheduled for s in store.stats()) == 0


def test_ack_many_sends_one_pipeline(valkey_url: str, prefix: str) -> None:
    """The acks of several shards' claims reach the server in one round trip."""
    store = make_store(valkey_url, prefix, shards=4)
    schedule(store, "x", [f"i{n}" for n in range(40)])
    claims = [c for c in store.claim_many(range(4), limit=100) if isinstance(c, Claim)]
    executed: list[int] = []
    real_pipeline = store.client.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        def execute(*a: Any, **kw: Any) -> Any:
            executed.append(len(pipe.command_stack))
            return real_execute(*a, **kw)

        pipe.execute = execute
        return pipe

    store.client.pipeline = pipeline  # type: ignore[method-assign]
    replies = store.ack_many([(c, [i.id for i in c.items]) for c in claims] + [(claims[0], [])])
    assert executed == [4] and replies == [len(c.items) for c in claims] + [0]
    assert sum(s.scheduled for s in store.stats()) == 0


def test_one_shards_failing_ack_sets_only_it_aside(valkey_url: str, prefix: str, out: redis.Redis) -> None:
    """A shard whose ack errors (its lease hash turned into a string after the publish) is set
    aside with its items kept; the other shards' items are acked in the same round trip."""
    store = make_store(valkey_url, prefix, shards=4)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(40)]
    bad_shard = store.shard_of("i0")
    schedule(store, key, ids)

    def break_bad_shard(_: int, deliveries: Sequence[Delivery]) -> None:
        if any(store.shard_of(d.id) == bad_shard for d in deliveries):
            leased = store.keys(bad_shard).leased
            out.delete(leased)
            out.set(leased, "not a hash")

    forwarder = Forwarder(store, [Hooked(out, break_bad_shard)])
    bad = [i for i in ids if store.shard_of(i) == bad_shard]
    assert forwarder.run_once() == 40 - len(bad)
    assert forwarder.stats.errors == 1 and forwarder.shards.aside(bad_shard, forwarder.server_now_ms())
    assert sorted(delivered(out, key)) == sorted(ids)  # published once each, the bad shard's too
    assert all(store.exists(i) for i in bad), "the bad shard's items were not acked: kept for later"
    assert not any(store.exists(i) for i in ids if i not in bad)


def test_a_forwarder_killed_between_publishes_and_acks_loses_nothing(
    valkey_url: str, prefix: str, out: redis.Redis
) -> None:
    """Published but not acked when it dies: the items come again after their lease (at least
    once), none is lost."""
    store = make_store(valkey_url, prefix, shards=4, lease_seconds=0.3)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(40)]
    schedule(store, key, ids)
    dying = make_store(valkey_url, prefix, shards=4, lease_seconds=0.3)

    def die(_: Any) -> list[int | Exception]:
        raise redis.ConnectionError("killed before the acks")

    dying.ack_many = die  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        Forwarder(dying, [RedisListTarget(out)]).run_once()
    assert sorted(delivered(out, key)) == sorted(ids) and all(store.exists(i) for i in ids)
    forwarder = Forwarder(store, [RedisListTarget(out)])
    wait_for(lambda: forwarder.run_once() > 0 and sum(s.scheduled for s in store.stats()) == 0, 5, "re-delivered")
    assert sorted(delivered(out, key)) == sorted(ids * 2)


def test_batches_published_early_in_a_pass_stay_ours_until_its_acks(
    valkey_url: str, prefix: str, out: redis.Redis
) -> None:
    """A pass that stalls past the lease after its first publish: the batches published and
    not yet acked are extended by the heartbeat, so another forwarder cannot take them."""
    store = make_store(valkey_url, prefix, shards=2, lease_seconds=0.6)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(20)]
    schedule(store, key, ids)
    taken: list[int] = []

    def stall_then_compete(call: int, _: Sequence[Delivery]) -> None:
        if call == 1:
            time.sleep(1.0)
            taken.append(Forwarder(store, [RedisListTarget(out)]).run_once())

    forwarder = Forwarder(store, [Hooked(out, stall_then_compete)])
    assert forwarder.run_once() == 20
    assert taken == [0], "a batch of the pass was taken over before its ack"
    assert sorted(delivered(out, key)) == sorted(ids) and forwarder.stats.acked == 20


class Picky(RedisListTarget):
    """Fails ids ending in 7 for good, leaves those ending in 3 unsent, publishes the rest;
    counts its calls."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.calls: list[int] = []

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        self.calls.append(len(deliveries))
        report = super().publish_many([d for d in deliveries if d.id[-1] not in "37"])
        report.failed += [DeliveryFailure(d.id, "no", permanent=True) for d in deliveries if d.id.endswith("7")]
        report.unsent += [d.id for d in deliveries if d.id.endswith("3")]
        return report


def test_one_publish_per_target_per_pass_split_back_to_each_shard(
    valkey_url: str, prefix: str, out: redis.Redis
) -> None:
    """All shards' items go to a target in one call; what it reports reaches each claim: the
    published acked, the failed dead-lettered, the unsent released, on every shard."""
    store = make_store(valkey_url, prefix, shards=8)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(80)]
    schedule(store, key, ids)
    target = Picky(out)
    forwarder = Forwarder(store, [target])
    assert forwarder.run_once() == 80
    assert target.calls == [80]
    published = [i for i in ids if i[-1] not in "37"]
    assert sorted(delivered(out, key)) == sorted(published)
    assert not any(store.exists(i) for i in published)
    assert sorted(d.id for d in store.dead_letters()) == sorted(i for i in ids if i.endswith("7"))
    assert all(store.exists(i) for i in ids if i.endswith("3"))
    assert (forwarder.stats.acked, forwarder.stats.dead, forwarder.stats.released) == (64, 8, 8)
    assert len({store.shard_of(i) for i in ids if i.endswith("7")}) > 1  # the split crossed shards


def test_overlapped_claims_keep_each_shards_order(valkey_url: str, prefix: str, out: redis.Redis) -> None:
    """The next pass is claimed while the current one publishes: every item still arrives once,
    and each shard's items in their ready order (one shard: the list is the store's order)."""
    store = make_store(valkey_url, prefix, shards=1)
    now = store.server_time_ms() / 1000
    ids = [f"o{n:04d}" for n in range(1000)]
    rows = [(i, now - 10 + n / 1000, RedisListTarget.envelope("ordered", json.dumps({"id": i}).encode()))
            for n, i in enumerate(ids)]  # fmt: skip
    store.schedule_many(rows)
    claims = spy_claims(store)
    forwarder = Forwarder(store, [RedisListTarget(out)], batch=100, overlap=True)
    assert forwarder.run_once() == 1000
    assert delivered(out, "ordered") == ids
    assert len(claims) == 11  # 10 full batches, then the empty claim that ends the sweep


def test_a_pass_that_fails_gives_back_the_claim_made_ahead_of_it(
    valkey_url: str, prefix: str, out: redis.Redis
) -> None:
    """If a pass raises (the store fails its acks), the batch claimed ahead of it is released at
    once, not left leased until its lease runs out; the failed pass's own batch waits for its
    lease (published, not acked: at-least-once)."""
    store = make_store(valkey_url, prefix, shards=1, lease_seconds=30)
    schedule(store, "ahead", [f"a{n}" for n in range(300)])
    real = store.ack_many

    def failing(acks: Sequence[tuple[Claim, Sequence[str]]]) -> list[int | Exception]:
        time.sleep(0.2)  # the claim ahead has landed
        raise redis.ConnectionError("store gone")

    store.ack_many = failing  # type: ignore[method-assign]
    forwarder = Forwarder(store, [RedisListTarget(out)], batch=100, overlap=True)
    with pytest.raises(redis.ConnectionError):
        forwarder.run_once()
    store.ack_many = real  # type: ignore[method-assign]
    (shard,) = store.stats()
    assert shard.leased == 100 and shard.due == 200  # only the failed pass's batch is held


def spy_claims(store: DelayStore) -> list[list[int]]:
    """The shards of each ``claim_many`` call."""
    calls: list[list[int]] = []
    real = store.claim_many

    def claim_many(shards: Sequence[int], **kwargs: Any) -> list[Claim | Exception]:
        calls.append(list(shards))
        return real(shards, **kwargs)

    store.claim_many = claim_many  # type: ignore[method-assign]
    return calls


class Claiming(RedisListTarget):
    """A list target with ``publish_claimed`` (a :class:`ClaimTarget`) that counts the calls of each kind."""

    def __init__(self, client: redis.Redis, takes_leases: bool) -> None:
        super().__init__(client)
        self.takes_leases = takes_leases
        self.claimed_calls: list[int] = []
        self.many_calls: list[int] = []

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Any) -> PublishReport:
        self.claimed_calls.append(len(deliveries))
        return super().publish_many(deliveries)

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        self.many_calls.append(len(deliveries))
        return super().publish_many(deliveries)


@pytest.mark.parametrize("takes_leases", [True, False])
def test_a_claim_target_that_takes_no_lease_gets_the_pass_in_one_call(
    valkey_url: str, prefix: str, out: redis.Redis, takes_leases: bool
) -> None:
    """The Celery target on RabbitMQ takes no lease (``takes_leases`` False): a pass over 4
    shards is one publish call, one wait for the broker's confirms, not one per shard."""
    store = make_store(valkey_url, prefix, shards=4)
    key = f"{prefix}:out"
    ids = [f"i{n}" for n in range(40)]
    schedule(store, key, ids)
    target = Claiming(out, takes_leases)
    assert Forwarder(store, [target]).run_once() == 40
    if takes_leases:
        assert target.many_calls == [] and len(target.claimed_calls) == 4, "one call per claim, with its lease"
    else:
        assert target.claimed_calls == [] and target.many_calls == [40], "the pass in one call"
    assert sorted(delivered(out, key)) == sorted(ids)
