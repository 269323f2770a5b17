"""One bad item never fails its batch, and a configuration error never burns attempts (issue 21,
findings 3 and 4): a target call that raises is split so only the raising item fails; a target
refused by its server (NOPERM, a wrong password) is paused with its items waiting in the store;
a periodic entry whose runs the broker refuses waits instead of running out of attempts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timezone

import pytest
import redis
from celery import Celery

from delayq_backends import DelayStore
from delayq_backends.celery.periodic import PeriodicTarget, sync
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.errors import ConfigError
from delayq_backends.forwarder import Forwarder
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.periodic.ops import item_id
from delayq_backends.targets import Delivery, PublishReport, RedisListTarget
from delayq_backends.testing import CollectingTarget, FakeClock, TestingForwarder, testing_store
from tests.harness.servers import make_store
from tests.helpers import wait_for


class RaisesOnOne(RedisListTarget):
    """A list target with a bug that only one item's body meets."""

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        if any(d.envelope.body == b"bad" for d in deliveries):
            raise KeyError("a value the target did not foresee")
        return super().publish_many(deliveries)


@pytest.fixture
def store(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    s = make_store(valkey_url, prefix, shards=2)
    yield s
    s.client.close()


def test_a_target_that_raises_on_one_item_fails_that_item_alone(store: DelayStore, prefix: str) -> None:
    """It failed the whole call: all 41 items retried, and after 10 attempts dead-lettered."""
    out = f"{prefix}:out"
    for i in range(40):
        store.schedule(f"good-{i}", 0, RedisListTarget.envelope(out, f"{i}".encode()))
    store.schedule("bad", 0, RedisListTarget.envelope(out, b"bad"))
    forwarder = Forwarder(store, [RaisesOnOne(store.client)], batch=100)

    assert forwarder.run_once() == 41
    assert store.client.llen(out) == 40, "the rest of the call was published at once"
    assert forwarder.stats.retried == 1 and forwarder.stats.dead == 0
    bad = store.get("bad")
    assert bad is not None and bad.attempts == 1 and bad.leased_until_ms is None
    assert all(store.get(f"good-{i}") is None for i in range(40))


class DefersSomeRaisesOnOne(RaisesOnOne):
    """As RaisesOnOne, and items with a body "wait" are deferred (as RQ defers a class off its
    allowlist): ``later``, not published."""

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        waiting = [d for d in deliveries if d.envelope.body == b"wait"]
        report = super().publish_many([d for d in deliveries if d not in waiting])
        report.later += [(d.id, 2**42) for d in waiting]
        return report


def test_a_call_split_around_a_raising_item_keeps_the_deferrals_of_its_halves(store: DelayStore, prefix: str) -> None:
    """The halves' reports were merged without their ``later``: deferred items were neither
    published, failed nor deferred, and came back as a lapsed lease, an attempt counted."""
    out = f"{prefix}:out"
    for i in range(6):
        store.schedule(f"good-{i}", 0, RedisListTarget.envelope(out, f"{i}".encode()))
        store.schedule(f"wait-{i}", 0, RedisListTarget.envelope(out, b"wait"))
    store.schedule("bad", 0, RedisListTarget.envelope(out, b"bad"))
    forwarder = Forwarder(store, [DefersSomeRaisesOnOne(store.client)], batch=100)

    forwarder.run_once()
    assert store.client.llen(out) == 6
    for i in range(6):
        waiting = store.get(f"wait-{i}")
        # deferred to the target's time, no attempt counted (not held by the claim's lease)
        assert waiting is not None and (waiting.attempts, waiting.leased_until_ms) == (0, 2**42), waiting


@pytest.fixture
def acl_server() -> Iterator[EmbeddedServer]:
    """A server of the test's own, whose ACL users it may change."""
    with EmbeddedServer() as server:
        yield server


def test_a_target_refused_by_its_server_is_paused_and_burns_no_attempt(
    store: DelayStore, prefix: str, acl_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A list target whose user may not RPUSH: each item was a permanent failure, a dead letter."""
    admin = redis.Redis(port=acl_server.port)
    admin.acl_setuser("lister", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-rpush"])
    lister = redis.Redis(port=acl_server.port, username="lister", password="pw")
    out = f"{prefix}:out"
    for i in range(30):
        store.schedule(f"i-{i}", 0, RedisListTarget.envelope(out, b"x"))
    store.schedule("elsewhere", 0, Envelope(target="other", destination="q"))
    metrics = ForwarderMetrics()
    other = CollectingTarget("other")
    forwarder = Forwarder(store, [RedisListTarget(lister), other], max_outage_backoff=0.5, metrics=metrics)

    assert forwarder.run_once() == 31
    assert other.ids == ["elsewhere"], "the other target keeps flowing"
    assert forwarder.stats.deferred == 30 and forwarder.stats.retried == forwarder.stats.dead == 0
    assert [item.attempts for item in store.scan()] == [0] * 30
    assert store.dead_letters() == []
    assert metrics.registry.get_sample_value("delayq_target_paused", {"target": "list"}) == 1
    assert metrics.registry.get_sample_value("delayq_config_errors_total", {"target": "list"}) == 1
    assert caplog.text.count("paused by a configuration error") == 1 and "ACL SETUSER" in caplog.text

    admin.acl_setuser("lister", enabled=True, commands=["+rpush"])
    wait_for(lambda: forwarder.run_once() >= 0 and admin.llen(out) == 30, 15, "the items to flow once granted")
    assert (
        store.dead_letters() == []
        and metrics.registry.get_sample_value("delayq_target_paused", {"target": "list"}) == 0
    )

    forwarder.check_targets()  # it logs in: the start goes on
    refused = Forwarder(store, [RedisListTarget(redis.Redis(port=acl_server.port, username="lister", password="no"))])
    with pytest.raises(ConfigError, match=r"target 'list': the server refused the login .*fix the user and password"):
        refused.check_targets()


def test_a_periodic_entry_whose_runs_the_broker_refuses_waits_and_is_never_a_dead_letter() -> None:
    """The broker refuses every run (a queue's exchange missing, say) for longer than the entry's
    attempts: it was dead-lettered after 10, its schedule ended and its run history was lost."""
    clock = FakeClock(datetime(2031, 1, 1, tzinfo=timezone.utc))
    store = testing_store(prefix="wait", shards=2, clock=clock, max_attempts=3)
    app = Celery("wait", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"tick": {"task": "t.tick", "schedule": 60.0}}
    sync(app, store)
    refusing = [True]

    def broker(_: Delivery) -> None:
        if refusing[0]:
            raise RuntimeError("NOT_FOUND - no exchange 'q'")

    inner = CollectingTarget("celery", broker)
    forwarder = TestingForwarder(store, [inner, PeriodicTarget(inner)])
    for _ in range(12):  # four times its attempts
        entry = store.get(item_id("tick"))
        assert entry is not None and entry.attempts == 0
        clock.set(max(clock() / 1000 + 301, entry.ready_ms / 1000))  # past its back-off (at most 300 s)
        assert forwarder.run_once() == 1
    assert store.dead_letters() == [] and inner.delivered == []
    assert forwarder.stats.deferred == 12 and forwarder.stats.dead == 0

    refusing[0] = False
    entry = store.get(item_id("tick"))
    assert entry is not None
    clock.set(clock() / 1000 + 301)
    forwarder.run_once()
    assert len(inner.delivered) == 1, "it fires once the broker takes it"
    following = store.get(item_id("tick"))
    assert following is not None and following.ready_ms > clock()
