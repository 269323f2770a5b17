"""delayq_backends.testing: what an application's own unit tests do with it, with no server.

Every test here runs with sockets refused, so "needs no Redis" is checked, not assumed.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import delayq_backends.scripts
from delayq_backends import Envelope, InvalidTimeError
from delayq_backends.keys import slot_holds_key
from delayq_backends.models import FailedDelivery, RearmOutcome
from delayq_backends.store import SlotAsk, SlotRun
from delayq_backends.targets import Delivery, PublishReport
from delayq_backends.testing import (
    CollectingTarget,
    FakeClock,
    TestingForwarder,
    TestingStore,
    _fake_client_class,
    advance_and_run,
    run_due,
    scheduled,
    testing_store,
)

DAY = timedelta(days=1)
MS = timedelta(milliseconds=1)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the testing store must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# -- the application under test -------------------------------------------------------------


class SignupApp:
    """A tiny application: signing up schedules a reminder mail three days later."""

    def __init__(self, store: TestingStore) -> None:
        self.store = store

    def sign_up(self, user: str) -> None:
        envelope = Envelope(target="mail", destination="reminders", body=user.encode(), meta={"template": "welcome"})
        self.store.schedule(f"reminder:{user}", timedelta(days=3), envelope)

    def delete_account(self, user: str) -> None:
        self.store.cancel(f"reminder:{user}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2030, 1, 1, 9, 0, tzinfo=timezone.utc))


@pytest.fixture
def store(clock: FakeClock) -> TestingStore:
    return testing_store(shards=4, clock=clock)


@pytest.fixture
def mail() -> CollectingTarget:
    return CollectingTarget("mail")


def test_sign_up_schedules_a_reminder_three_days_later(store: TestingStore, clock: FakeClock) -> None:
    SignupApp(store).sign_up("ada")

    [entry] = scheduled(store, target="mail")
    assert entry.id == "reminder:ada"
    assert entry.ready == clock.now() + timedelta(days=3)
    assert entry.ready == datetime(2030, 1, 4, 9, 0, tzinfo=timezone.utc)
    assert entry.ready_ms == clock() + 3 * 86_400_000
    assert entry.envelope.destination == "reminders"
    assert entry.envelope.body == b"ada"
    assert entry.envelope.meta == {"template": "welcome"}
    assert entry.attempts == 0 and entry.leased_until is None
    assert scheduled(store, target="sms") == []
    assert scheduled(store, destination="reminders") == [entry]


def test_reminder_is_delivered_exactly_once_when_due(
    store: TestingStore, clock: FakeClock, mail: CollectingTarget
) -> None:
    SignupApp(store).sign_up("ada")

    assert run_due(store, mail) == []
    assert advance_and_run(store, 3 * DAY - MS, mail) == []
    assert mail.delivered == []

    [delivery] = advance_and_run(store, MS, mail)
    assert delivery.id == "reminder:ada"
    assert delivery.envelope.body == b"ada"
    assert delivery.attempts == 1
    assert mail.ids == ["reminder:ada"]

    assert advance_and_run(store, 10 * DAY, mail) == []
    assert mail.ids == ["reminder:ada"]
    assert scheduled(store) == []
    assert not store.exists("reminder:ada")


def test_cancel_removes_the_reminder(store: TestingStore, mail: CollectingTarget) -> None:
    app = SignupApp(store)
    app.sign_up("ada")
    app.sign_up("bob")
    app.delete_account("ada")

    assert [e.id for e in scheduled(store)] == ["reminder:bob"]
    assert [d.id for d in advance_and_run(store, 4 * DAY, mail)] == ["reminder:bob"]
    assert mail.ids == ["reminder:bob"]


def test_signing_up_again_moves_the_reminder(store: TestingStore, clock: FakeClock, mail: CollectingTarget) -> None:
    app = SignupApp(store)
    app.sign_up("ada")
    clock.advance(DAY)
    app.sign_up("ada")  # same id: replaced, not duplicated

    [entry] = scheduled(store)
    assert entry.ready == clock.now() + 3 * DAY
    assert advance_and_run(store, 3 * DAY - MS, mail) == []
    assert len(advance_and_run(store, MS, mail)) == 1


def test_stats_and_due_counts_follow_the_fake_clock(store: TestingStore, clock: FakeClock) -> None:
    SignupApp(store).sign_up("ada")
    assert sum(s.due for s in store.stats()) == 0
    clock.advance(3 * DAY)
    assert sum(s.due for s in store.stats()) == 1
    assert sum(s.scheduled for s in store.stats()) == 1


def test_a_callable_receives_every_kind(store: TestingStore, clock: FakeClock) -> None:
    store.schedule("a", timedelta(seconds=1), Envelope("mail", "x", b"1"))
    store.schedule("b", timedelta(seconds=2), Envelope("sms", "y", b"2"))
    seen: list[Delivery] = []

    delivered = advance_and_run(store, 5, seen.append)

    assert [d.id for d in delivered] == [d.id for d in seen]
    assert sorted(d.envelope.target for d in seen) == ["mail", "sms"]


def test_a_failing_delivery_is_retried_on_the_fake_clock(store: TestingStore, clock: FakeClock) -> None:
    calls: list[str] = []

    def flaky(d: Delivery) -> None:
        calls.append(d.id)
        if len(calls) == 1:
            raise ConnectionError("SMTP down")

    store.schedule("r", timedelta(seconds=10), Envelope("mail", "x"))
    assert advance_and_run(store, 10, flaky) == []
    [entry] = scheduled(store)
    assert entry.attempts == 1
    assert entry.ready_ms == clock() + 1000  # retry_delay, on the fake clock, not the wall clock

    assert advance_and_run(store, 0.999, flaky) == []
    assert [d.id for d in advance_and_run(store, 0.001, flaky)] == ["r"]
    assert calls == ["r", "r"]
    assert scheduled(store) == []


def test_always_failing_ends_in_the_dead_letters(clock: FakeClock) -> None:
    store = testing_store(shards=2, clock=clock, max_attempts=3)
    store.schedule("r", 1.0 + clock() / 1000, Envelope("mail", "x"))

    def broken(d: Delivery) -> None:
        raise ValueError("template missing")

    for _ in range(5):
        assert advance_and_run(store, 3600, broken) == []

    assert scheduled(store) == []
    [dead] = store.dead_letters()
    assert dead.id == "r" and "template missing" in dead.error and dead.attempts == 3
    assert dead.died_ms <= clock()  # dated by the fake clock
    assert store.requeue_dead() == 1
    assert [d.id for d in run_due(store, CollectingTarget("mail"))] == ["r"]


def test_an_unknown_kind_is_not_delivered_and_waits_without_an_attempt(
    store: TestingStore, clock: FakeClock, mail: CollectingTarget
) -> None:
    """As a forwarder without that target does: the item is parked for one that has it."""
    store.schedule("s", timedelta(0), Envelope("sms", "x"))
    assert run_due(store, mail) == []
    [entry] = scheduled(store)
    assert entry.attempts == 0 and entry.ready_ms == clock()
    assert entry.parked == "target:sms" and entry.leased_until is None


def test_unsent_items_are_released_without_counting_an_attempt(store: TestingStore) -> None:
    class Down:
        kind = "mail"

        def publish_many(self, deliveries: Any) -> PublishReport:
            return PublishReport(unsent=[d.id for d in deliveries], broker_error=ConnectionError("down"))

        def close(self) -> None:
            pass

    store.schedule("u", timedelta(0), Envelope("mail", "x"))
    assert run_due(store, Down()) == []  # returns at once: no real back-off sleep
    [entry] = scheduled(store)
    assert entry.attempts == 0 and entry.leased_until is None


def test_more_items_than_one_batch_all_go_once(store: TestingStore, mail: CollectingTarget) -> None:
    for i in range(25):
        store.schedule(f"j{i}", timedelta(seconds=i), Envelope("mail", "x"))
    delivered = advance_and_run(store, 60, {"mail": mail}, batch=3)
    assert sorted(d.id for d in delivered) == sorted(f"j{i}" for i in range(25))
    assert len(mail.delivered) == 25


def test_targets_as_a_list(store: TestingStore) -> None:
    mail, sms = CollectingTarget("mail"), CollectingTarget("sms")
    store.schedule("a", timedelta(0), Envelope("mail", "x"))
    store.schedule("b", timedelta(0), Envelope("sms", "y"))
    run_due(store, [mail, sms])
    assert (mail.ids, sms.ids) == (["a"], ["b"])


def test_the_forwarder_loop_step_runs_on_the_fake_clock(
    store: TestingStore, clock: FakeClock, mail: CollectingTarget
) -> None:
    """Adapters drive ``run_once`` of a :class:`TestingForwarder`, as production does."""
    SignupApp(store).sign_up("ada")
    forwarder = TestingForwarder(store, [mail])
    assert forwarder.run_once() == 0
    clock.advance(3 * DAY)
    assert forwarder.run_once() == 1
    assert mail.ids == ["reminder:ada"]


def test_stores_are_isolated_unless_they_share_a_server(clock: FakeClock) -> None:
    a, b = testing_store(clock=clock), testing_store(clock=clock)
    a.schedule("x", timedelta(0), Envelope("mail", "x"))
    assert not b.exists("x")
    c = TestingStore(a.config, clock=clock, server=a.server)
    assert c.exists("x")


def test_fake_clock() -> None:
    before = datetime.now(timezone.utc)
    clock = FakeClock()
    assert before - timedelta(seconds=1) <= clock.now() <= datetime.now(timezone.utc) + timedelta(seconds=1)
    start = clock()
    assert clock.advance(timedelta(minutes=1)) == start + 60_000
    assert clock.advance(1.5) == start + 61_500
    assert clock.ms == clock()
    with pytest.raises(ValueError, match="advance"):
        clock.advance(-1)
    assert clock.set(datetime(2031, 5, 1, tzinfo=timezone.utc)) == 1_935_360_000_000
    assert clock.now() == datetime(2031, 5, 1, tzinfo=timezone.utc)
    with pytest.raises(InvalidTimeError, match="naive"):
        clock.set(datetime(2031, 5, 1))
    with pytest.raises(TypeError, match="advance"):
        clock.set(timedelta(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch"):
        clock.set(0)
    assert FakeClock(1_000).ms == 1_000_000


def test_advance_and_run_needs_a_fake_clock(store: TestingStore) -> None:
    store.clock = lambda: 5  # type: ignore[assignment]
    with pytest.raises(TypeError, match="FakeClock"):
        advance_and_run(store, 1, CollectingTarget("mail"))


def test_missing_fakeredis_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_client_class.cache_clear()
    monkeypatch.setitem(sys.modules, "fakeredis", None)
    try:
        with pytest.raises(ImportError, match=r'pip install "\.\[testing\]"'):
            testing_store()
    finally:
        _fake_client_class.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_client_class() -> Iterator[None]:
    yield
    _fake_client_class.cache_clear()


def test_an_rq_periodic_job_gets_its_next_run_under_the_helper(store: TestingStore, clock: FakeClock) -> None:
    """The helper delivers through the target's lease, as production does, so an RQ periodic
    job is moved *and* re-armed for its next run (it used to be moved and forgotten)."""
    pytest.importorskip("rq")
    from delayq_backends.rq import RQTarget, Scheduler

    connection = _fake_client_class()(server=store.server)
    scheduler = Scheduler("reports", connection=connection, delay_store=store)
    job = scheduler.schedule(clock.now(), "tests.test_rq.jobs.record", args=["p"], interval=60, repeat=None)
    target = RQTarget(connection)  # on the store's fake clock, through the lease

    assert [d.id for d in run_due(store, target)] == [job.id]

    assert connection.llen("rq:queue:reports") == 1
    [entry] = scheduled(store, target="rq")
    assert (entry.id, entry.ready) == (job.id, clock.now() + timedelta(seconds=60))


# -- every script that reads the time follows the fake clock ---------------------------------

SCRIPTS_DIR = Path(delayq_backends.scripts.__file__).parent
FAR = datetime(2031, 6, 1, tzinfo=timezone.utc)  # years from the real clock: the server's TIME is never near it


def _claimed(store: TestingStore, clock: FakeClock) -> Any:
    store.schedule("a", clock.now(), Envelope(target="mail", destination="q", body=b"x"))
    lease = store.lease(store.shard_of("a"))
    assert [i.id for i in lease.items] == ["a"]
    return lease


def _claim(store: TestingStore, clock: FakeClock) -> None:
    _claimed(store, clock)  # due at the fake now, which the server's clock has not reached


def _keep(store: TestingStore, clock: FakeClock) -> None:
    _claimed(store, clock).keep({"a": 60_000})
    assert store.get("a").leased_until_ms == clock.ms + 60_000  # due again a window after the fake now


def _extend(store: TestingStore, clock: FakeClock) -> None:
    assert _claimed(store, clock).extend(lease_ms=60_000).deadline_ms == clock.ms + 60_000


def _fail(store: TestingStore, clock: FakeClock) -> None:
    _claimed(store, clock).fail([FailedDelivery("a", None, "no such list")])
    [dead] = store.dead_letters()
    assert dead.died_ms == clock.ms


def _rearm(store: TestingStore, clock: FakeClock) -> None:
    lease = _claimed(store, clock)
    clock.advance(timedelta(seconds=store.config.lease_seconds + 1))  # the lease ran out on the fake clock
    envelope = Envelope(target="mail", destination="q", body=b"y")
    outcome = store.replace_if("a", lease.items[0].envelope, clock.now(), envelope)
    assert outcome is RearmOutcome.REPLACED


def _take(store: TestingStore, clock: FakeClock) -> None:
    assert store.take_tokens("q", 1, rate=10, burst=1).now_ms == clock.ms


def _slot_take(store: TestingStore, clock: FakeClock) -> None:
    grant = store.take_slots({"k": SlotAsk(1, [("a", 0)])}, hold_ms=1_000, wait_ms=1_000)["k"]
    assert not isinstance(grant, Exception) and grant.places == (-1,)
    assert store.client.zscore(slot_holds_key(store.config.prefix, "k"), "a") == clock.ms + 1_000


def _promote(store: TestingStore, clock: FakeClock) -> None:
    _claimed(store, clock).defer([("a", clock.ms + 10_000)])
    b = store.take_slots({"k": SlotAsk(1, [("b", 0)])}, hold_ms=1_000, wait_ms=1_000)["k"]  # b holds the slot
    store.take_slots({"k": SlotAsk(1, [("a", 1)])}, hold_ms=1_000, wait_ms=1_000)  # a waits first in line
    assert not isinstance(b, Exception)
    store.hold_slots({"k": [SlotRun("b", b.tokens[0])]}, "end")  # b's end brings a forward to the fake now
    assert store.client.zscore(store.keys(store.shard_of("a")).due, "a") == clock.ms


def _unpark(store: TestingStore, clock: FakeClock) -> None:
    lease = _claimed(store, clock)
    assert lease.park({"a": "target:sms"}, recheck_ms=clock.ms).count == 1
    assert store.recheck_parked(store.shard_of("a"), lambda why: True, limit=10, later_ms=0).released == 1
    assert store.client.zscore(store.keys(store.shard_of("a")).due, "a") == clock.ms  # due at the fake now


def _sync_version(store: TestingStore, clock: FakeClock) -> None:
    from delayq_backends.periodic.registry import code_record, record_code_sync

    record_code_sync(store, 1, "fp", kind="celery-periodic")
    record = code_record(store, "celery-periodic")
    assert record is not None and record.synced_ms == clock.ms


def _periodic_run(store: TestingStore, clock: FakeClock) -> None:
    from delayq_backends.periodic.history import RunMark, read_history, record_published

    record_published(store, RunMark("tick", clock.ms - 250), "run-1")
    [run] = read_history(store, "tick").runs
    assert (run.published_ms, run.lateness_ms) == (clock.ms, 250)


def _group_release(store: TestingStore, clock: FakeClock) -> None:
    from delayq_backends.envelope import Slot, with_slot
    from delayq_backends.keys import RELEASED_BIAS_MS

    grouped = with_slot(Envelope(target="mail", destination="q", body=b"x"), Slot("g"))
    store.schedule("a", clock.now() - timedelta(milliseconds=250), grouped)  # born parked in its group's line
    keys = store.keys(store.shard_of("a"))
    reply = store.release_lines({store.shard_of("a"): [("g", 1, 0)]})[store.shard_of("a")]
    assert not isinstance(reply, Exception)
    [released], _ = reply
    assert released.released == 1 and store.client.zscore(keys.due, "a") == clock.ms - 250 - RELEASED_BIAS_MS
    assert store.client.hget(keys.leased, "a") == f"{clock.ms}:deferred:{clock.ms - 250}".encode()


#: One check per script whose "now" a caller may choose (``now_ms(ARGV[..])``: the server's TIME
#: when given 0). debounce.lua reads TIME only for its counter's expiry, a server-side TTL.
TIME_READERS = {
    "claim": _claim,
    "keep": _keep,
    "extend": _extend,
    "fail": _fail,
    "rearm": _rearm,
    "take": _take,
    "slot_take": _slot_take,
    "promote": _promote,
    "unpark": _unpark,
    "group_release": _group_release,
    "sync_version": _sync_version,
    "periodic_run": _periodic_run,
}


def test_every_script_that_reads_the_time_has_a_fake_clock_check() -> None:
    """A new script reading TIME needs an entry above, so the testing store cannot silently run it
    on the real clock (as ``keep`` and ``extend`` once did)."""
    readers = {p.stem for p in SCRIPTS_DIR.glob("*.lua") if "'TIME'" in p.read_text() or "now_ms(ARGV" in p.read_text()}
    assert readers == set(TIME_READERS)


@pytest.mark.parametrize("name", sorted(TIME_READERS))
def test_each_script_that_reads_the_time_follows_the_fake_clock(name: str) -> None:
    clock = FakeClock(FAR)
    TIME_READERS[name](testing_store(shards=2, clock=clock), clock)
