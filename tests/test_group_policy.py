"""Group policies on a real server: the runtime policy (limit, rate with cost, weight, paused, a
throttle) applied by ``slot_take.lua`` at every release, set through the store's API, by
pattern, and throttled from a worker only with its hold's token; garbage in a group's policy
and bucket never stops the group for long and is reported."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from delayq_backends import keys as layout
from delayq_backends.store import SlotAsk
from tests.harness import make_store
from tests.test_slots import Running, past, running, schedule_line  # noqa: F401 (running: a fixture)

#: Hostile writes to a group's policy and bucket: each must leave the group releasing, the
#: garbage reported (SAID) and, for a policy field, dropped.
GARBAGE: dict[str, Callable[[redis.Redis, str, str], object]] = {
    "policy of another type": lambda c, p, k: c.set(layout.group_policy_key(p, k), "junk"),
    "limit not a number": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "limit", "lots"),
    "limit 0": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "limit", "0"),
    "rate not a rate": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "rate", "0/s"),
    "rate far too high": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "rate", "1e300/s"),
    "weight negative": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "weight", "-3"),
    "paused empty": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "paused", ""),
    "throttled for years": lambda c, p, k: c.hset(
        layout.group_policy_key(p, k), mapping={"throttled_until": "99999999999999", "throttled_by": "x"}
    ),
    "throttled by no number": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "throttled_until", "soon"),
    "bucket of another type": lambda c, p, k: (
        c.hset(layout.group_policy_key(p, k), "rate", "1000/s"),
        c.rpush(layout.group_bucket_key(p, k), "x"),
    ),
    "bucket in deep debt": lambda c, p, k: (
        c.hset(layout.group_policy_key(p, k), "rate", "1000/s"),
        c.hset(layout.group_bucket_key(p, k), mapping={"tokens": "-1e300", "at": "0"}),
    ),
    "bucket refilled in the future": lambda c, p, k: (
        c.hset(layout.group_policy_key(p, k), "rate", "1000/s"),
        c.hset(layout.group_bucket_key(p, k), mapping={"tokens": "0", "at": "99999999999999"}),
    ),
}
SAID = {
    "policy of another type": ":policy type=string",
    "limit not a number": "policy limit=lots",
    "limit 0": "policy limit=0",
    "rate not a rate": "policy rate=0/s",
    "rate far too high": "policy rate=1e300/s",
    "weight negative": "policy weight=-3",
    "paused empty": "policy paused=",
    "throttled for years": "policy throttled_until=99999999999999",
    "throttled by no number": "policy throttled_until=soon",
    "bucket of another type": ":bucket type=list",
    "bucket in deep debt": "bucket tokens=-1e300",
    "bucket refilled in the future": "bucket tokens=0 at=99999999999999",
}


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_in_policy_and_bucket_is_dropped_and_reported(
    running: Running,  # noqa: F811 (the imported fixture)
    garbage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever is written into a group's policy or bucket, every item of the group is released
    (at most its items' limit at once), with a warning naming what was dropped; a garbage
    policy field is gone after the first take that met it."""
    store = running.forwarder.store
    prefix = store.config.prefix
    GARBAGE[garbage](store.client, prefix, "a")
    a = schedule_line(store, "a", 6, limit=2, start=past())
    running.thread.start()
    for n in range(6):
        running.wait(lambda n=n: len(running.of("a")) > n, f"item {n} of a")
        assert store.slot_status("a").running <= 2
        running.end("a", [running.of("a")[n]])
    assert sorted(running.of("a")) == a
    assert any("slot 'a': " in r.message and SAID[garbage] in r.message for r in caplog.records)
    policy = store.client.hgetall(layout.group_policy_key(prefix, "a"))
    assert set(policy) <= {b"rate"}, f"garbage fields are dropped: {policy}"


def test_a_garbage_policy_reads_as_unset_and_does_not_raise(valkey_url: str, prefix: str) -> None:
    """The store's reads treat a garbage policy as the script does: each bad value as unset."""
    store = make_store(valkey_url, prefix)
    name = layout.group_policy_key(store.config.prefix, "g")
    store.client.hset(name, mapping={"limit": "lots", "rate": "fast", "weight": "inf", "throttled_until": "1e99"})
    store.client.set(layout.slot_limit_key(store.config.prefix, "g"), "4")
    policy = store.group_policy("g")
    assert (policy.limit, policy.rate, policy.weight, policy.throttled_until) == (4, None, None, None)
    grant = store.take_slots({"g": SlotAsk(0, [("x", 0)])}, hold_ms=60_000, wait_ms=60_000)["g"]
    assert not isinstance(grant, Exception) and grant.limit == 4 and grant.places == (-1,)
