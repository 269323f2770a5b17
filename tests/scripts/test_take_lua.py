"""take.lua: a forwarding-rate token bucket shared by all forwarders, booking slots at the
rate for what it refuses."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.keys import rate_key
from delayq_backends.models import TokenGrant
from tests.scripts import T


def test_new_bucket_is_full_then_refuses_and_books_slots_at_the_rate(store: DelayStore) -> None:
    assert store.take_tokens("q", 3, rate=10, burst=5, now=T) == TokenGrant(3, T, T)
    grant = store.take_tokens("q", 10, rate=10, burst=5, now=T)
    granted, first = grant.granted, grant.first_slot_ms
    assert granted == 2
    assert first == T + 100  # the next token, 1/rate from now
    # the 8 refused hold slots T+100 .. T+800; the next refusal queues after them
    assert store.take_tokens("q", 1, rate=10, burst=5, now=T + 1) == TokenGrant(0, T + 900, T + 1)


def test_bucket_refills_at_the_rate_up_to_its_burst(store: DelayStore) -> None:
    assert store.take_tokens("q", 5, rate=10, burst=5, now=T).granted == 5
    assert store.take_tokens("q", 5, rate=10, burst=5, now=T + 300).granted == 3
    assert store.take_tokens("q", 50, rate=10, burst=5, now=T + 60_000).granted == 5


def test_buckets_are_per_queue_and_expire_when_idle(store: DelayStore) -> None:
    assert store.take_tokens("a", 5, rate=1, burst=5, now=T).granted == 5
    assert store.take_tokens("b", 5, rate=1, burst=5, now=T).granted == 5
    ttl = store.client.pttl(rate_key(store.config.prefix, "a"))
    assert 0 < ttl <= 5000 + 1000 + 1000  # refill time (5 s) plus a second; refused none


def test_server_clock_is_the_default(store: DelayStore) -> None:
    grant = store.take_tokens("q", 1, rate=2, burst=1)
    granted, first, now = grant.granted, grant.first_slot_ms, grant.now_ms
    assert granted == 1
    assert abs(now - store.server_time_ms()) < 1000 and first >= now
