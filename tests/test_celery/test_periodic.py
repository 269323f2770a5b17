"""Periodic entries on a fake clock: DST in Europe/Berlin, misfire policies, re-syncs, and the
rearm that acks a run and schedules the next in one step under the lease.

The store is the testing store (the real Lua scripts on fakeredis) driven by a FakeClock; the
forwarder is a real Forwarder on that clock; runs are collected instead of sent to a broker.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, solar

from delayq_backends.celery.message import StoredMessage
from delayq_backends.celery.periodic import KIND, PeriodicTarget, sync
from delayq_backends.envelope import FORMAT_VERSION, Envelope
from delayq_backends.models import RearmOutcome
from delayq_backends.periodic.ops import CodeEntryError, item_id, remove, statuses
from delayq_backends.periodic.schedules import run_task_id
from delayq_backends.store import Lease
from delayq_backends.testing import CollectingTarget, FakeClock, TestingForwarder, TestingStore, testing_store

BERLIN = ZoneInfo("Europe/Berlin")


class Harness:
    """A fake-clock store, an app with a beat_schedule, a forwarder, and the runs it sent."""

    def __init__(self, start: datetime, schedule: dict[str, Any], *, zone: str = "Europe/Berlin") -> None:
        self.clock = FakeClock(start)
        self.store: TestingStore = testing_store(prefix="per", shards=4, clock=self.clock)
        self.app = Celery("per", broker="memory://", set_as_current=False)
        self.app.conf.update(timezone=zone, beat_schedule=schedule, task_default_queue="q")
        self.sent = CollectingTarget("celery")
        self.periodic = PeriodicTarget(self.sent)
        self.forwarder = TestingForwarder(self.store, [self.sent, self.periodic])

    def sync(self, schedule: dict[str, Any] | None = None) -> Any:
        if schedule is not None:
            self.app.conf.beat_schedule = schedule
        return sync(self.app, self.store)

    def fire_next(self, name: str) -> None:
        """Move the clock to the entry's next run and forward what is due."""
        item = self.store.get(item_id(name))
        assert item is not None
        self.clock.set(item.ready_ms / 1000)
        self.forwarder.run_once()

    def runs(self) -> list[tuple[str, datetime]]:
        """(task id, local time it was due) of every run sent, in order."""
        out = []
        for d in self.sent.delivered:
            message = StoredMessage.from_envelope(d.envelope)
            out.append((message.task_id, datetime.fromtimestamp(d.ready_ms / 1000, tz=BERLIN)))
        return out


def _local(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN)  # type: ignore[arg-type,misc]


# -- DST ------------------------------------------------------------------------------------------


def test_daily_crontab_across_spring_forward_runs_at_the_jump_once() -> None:
    h = Harness(_local(2026, 3, 27, 12), {"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}})
    h.sync()
    for _ in range(3):
        h.fire_next("nightly")
    assert [when for _, when in h.runs()] == [
        _local(2026, 3, 28, 2, 30),
        _local(2026, 3, 29, 3, 0),  # 02:30 does not exist that night: at the jump, not lost
        _local(2026, 3, 30, 2, 30),
    ]
    assert len({task_id for task_id, _ in h.runs()}) == 3


def test_daily_crontab_across_fall_back_runs_once_in_the_repeated_hour() -> None:
    h = Harness(_local(2026, 10, 23, 12), {"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}})
    h.sync()
    for _ in range(3):
        h.fire_next("nightly")
    utc = [when.astimezone(timezone.utc).strftime("%m-%d %H:%M") for _, when in h.runs()]
    # 02:30 CEST on the 25th, not again at 02:30 CET an hour later; then CET
    assert utc == ["10-24 00:30", "10-25 00:30", "10-26 01:30"]


def test_hours_that_dst_puts_on_one_instant_each_run_once() -> None:
    """01:00, 02:00 and 03:00 every night: on the spring night 02:00 is skipped and moves to the
    jump, which is also 03:00. Both periods run (with their own task ids), none is lost."""
    h = Harness(_local(2026, 3, 28, 23), {"h": {"task": "t.h", "schedule": crontab(minute=0, hour="1,2,3")}})
    h.sync()
    for _ in range(2):
        h.fire_next("h")  # 01:00, then both periods due at 03:00 CEST in one firing
    runs = h.runs()
    assert [when for _, when in runs] == [_local(2026, 3, 29, 1), _local(2026, 3, 29, 3), _local(2026, 3, 29, 3)]
    assert len({task_id for task_id, _ in runs}) == 3
    assert h.store.get(item_id("h")).ready_ms == _local(2026, 3, 30, 1).timestamp() * 1000  # type: ignore[union-attr]


def test_hourly_crontab_runs_in_both_repeated_hours_and_skips_none() -> None:
    """Hour field "every hour": by the real clock, like cron's wildcard jobs."""
    h = Harness(_local(2026, 10, 25, 0, 30), {"hourly": {"task": "t.h", "schedule": crontab(minute=0)}})
    h.sync()
    for _ in range(4):
        h.fire_next("hourly")
    utc = [when.astimezone(timezone.utc).strftime("%H:%M") for _, when in h.runs()]
    assert utc == ["23:00", "00:00", "01:00", "02:00"]  # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET


def test_a_crontab_with_both_day_fields_runs_on_days_matching_both_as_celery_reads_it() -> None:
    """Celery's crontab ANDs day-of-month and day-of-week (cron and `rq cron` OR them): the 1st
    that is a Monday, stored in the format every release reads, as before day_or existed."""
    schedule = crontab(minute=0, hour=9, day_of_month=1, day_of_week=1)
    h = Harness(_local(2026, 6, 2, 12), {"monday-1st": {"task": "t.m", "schedule": schedule}})
    h.sync()
    h.fire_next("monday-1st")
    assert [when for _, when in h.runs()] == [_local(2027, 2, 1, 9)]
    item = h.store.get(item_id("monday-1st"))
    assert item is not None and item.envelope[2] == FORMAT_VERSION
    assert "day_or" not in Envelope.decode(item.envelope).meta["periodic"]["schedule"]


def test_crontab_follows_utc_when_the_app_has_no_timezone() -> None:
    h = Harness(datetime(2026, 3, 28, 12, tzinfo=timezone.utc), {"n": {"task": "t", "schedule": crontab(0, 2)}})
    h.app.conf.timezone = None
    h.sync()
    h.fire_next("n")
    assert h.runs()[0][1].astimezone(timezone.utc) == datetime(2026, 3, 29, 2, tzinfo=timezone.utc)


# -- misfires -------------------------------------------------------------------------------------


def _outage(policy: dict[str, Any], outage: timedelta) -> Harness:
    """An every-minute entry whose forwarders were all down for ``outage`` after its first due time."""
    start = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
    h = Harness(start, {"m": {"task": "t.m", "schedule": 60.0, "options": policy}})
    h.sync()
    first = h.store.get(item_id("m")).ready_ms  # type: ignore[union-attr]
    h.clock.set(first / 1000 + outage.total_seconds())
    h.forwarder.run_once()
    return h


def test_misfire_default_runs_once_for_the_missed_periods_then_on_schedule() -> None:
    h = _outage({}, timedelta(minutes=10, seconds=30))
    assert len(h.runs()) == 1
    [status] = statuses(h.store)
    assert status.last_missed == 10 and status.runs == 1
    # the next run is the next period after now, on the entry's grid
    assert status.next_run_ms == status.last_run_ms + 60_000  # type: ignore[operator]


def test_misfire_run_all_sends_each_missed_period_bounded_by_max() -> None:
    h = _outage({"delayq_misfire": "run_all", "delayq_misfire_max": 5}, timedelta(minutes=10, seconds=30))
    runs = h.runs()
    assert len(runs) == 5 and len({task_id for task_id, _ in runs}) == 5
    assert [b - a for (_, a), (_, b) in zip(runs, runs[1:])] == [timedelta(minutes=1)] * 4  # the latest 5
    [status] = statuses(h.store)
    assert status.last_missed == 6


def test_misfire_skip_drops_late_runs_and_keeps_on_time_ones() -> None:
    late = _outage({"delayq_misfire": "skip", "delayq_misfire_grace": 20}, timedelta(minutes=3, seconds=30))
    assert late.runs() == []
    [status] = statuses(late.store)
    assert status.last_missed == 4 and status.next_run_ms > late.clock()  # type: ignore[operator]
    on_time = _outage({"delayq_misfire": "skip", "delayq_misfire_grace": 20}, timedelta(seconds=10))
    assert len(on_time.runs()) == 1


def test_a_bad_misfire_option_is_refused_by_name_and_the_others_sync() -> None:
    h = Harness(
        datetime(2026, 5, 4, 12, tzinfo=timezone.utc),
        {
            "bad": {"task": "t", "schedule": 5, "options": {"delayq_misfire": "sometimes"}},
            "sun": {"task": "t", "schedule": solar.__new__(solar)},  # a real one needs ephem
            "good": {"task": "t", "schedule": 5},
        },
    )
    report = h.sync()
    assert report.added == ["good"]
    assert "delayq_misfire='sometimes'" in report.errors["bad"] and "solar" in report.errors["sun"]


# -- sync -----------------------------------------------------------------------------------------


def test_resync_adds_changes_and_removes_and_is_idempotent() -> None:
    start = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
    h = Harness(start, {"a": {"task": "t.a", "schedule": 60.0}, "b": {"task": "t.b", "schedule": 30.0}})
    first = h.sync()
    assert sorted(first.added) == ["a", "b"]
    assert h.sync().unchanged == ["a", "b"]  # a second forwarder starting changes nothing
    next_a = h.store.get(item_id("a")).ready_ms  # type: ignore[union-attr]
    h.clock.advance(timedelta(seconds=10))
    report = h.sync(
        {
            "a": {"task": "t.a", "schedule": 60.0, "args": [1]},  # new args: same next run
            "b": {"task": "t.b", "schedule": crontab(minute=0)},  # new schedule: its own next run
            "c": {"task": "t.c", "schedule": 5.0},
        }
    )
    assert (report.added, sorted(report.changed), report.removed) == (["c"], ["a", "b"], [])
    assert h.store.get(item_id("a")).ready_ms == next_a  # type: ignore[union-attr]
    assert h.store.get(item_id("b")).ready_ms == datetime(2026, 5, 4, 13, tzinfo=timezone.utc).timestamp() * 1000  # type: ignore[union-attr]
    h.fire_next("a")
    [a_run] = [m for m in map(StoredMessage.from_envelope, (d.envelope for d in h.sent.delivered)) if m.task == "t.a"]
    assert a_run.headers["argsrepr"] == "(1,)"
    report = h.sync({"c": {"task": "t.c", "schedule": 5.0}})
    assert sorted(report.removed) == ["a", "b"] and report.unchanged == ["c"]
    assert h.store.get(item_id("a")) is None and [s.name for s in statuses(h.store)] == ["c"]
    with pytest.raises(CodeEntryError, match="Remove it from the code"):
        remove(h.store, ["c"])  # the next sync would add it back
    assert remove(h.store, ["c", "nope"], force=True) == ["c"]


def test_sync_leaves_an_entry_a_newer_release_stored(caplog: Any) -> None:
    """A rolling upgrade: the entry's item has a newer envelope format. Sync skips it with a
    warning naming it (never "cancel it"), and syncs the others."""
    h = Harness(datetime(2026, 5, 4, 12, tzinfo=timezone.utc), {"a": {"task": "t.a", "schedule": 60.0}})
    h.sync()
    keys = h.store.keys(h.store.shard_of(item_id("a")))
    newer = bytearray(h.store.client.hget(keys.items, item_id("a")))
    newer[2] = 99  # format version byte
    h.store.client.hset(keys.items, item_id("a"), bytes(newer))
    with caplog.at_level("WARNING", logger="delayq.celery.periodic"):
        report = h.sync({"a": {"task": "t.a", "schedule": 30.0}, "b": {"task": "t.b", "schedule": 5.0}})
    assert (report.newer, report.added, report.errors) == (["a"], ["b"], {})
    assert "1 left to a newer release" in report.describe()
    assert h.store.client.hget(keys.items, item_id("a")) == bytes(newer), "left as the newer release stored it"
    assert "periodic entry 'a'" in caplog.text and "newer release" in caplog.text
    assert {s.name: s.state for s in statuses(h.store)}["a"] == "newer format 99: upgrade this reader"


def test_sync_waits_for_a_forwarder_firing_the_entry_and_never_undoes_its_run() -> None:
    start = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
    h = Harness(start, {"a": {"task": "t.a", "schedule": 60.0}})
    h.sync()
    item = h.store.get(item_id("a"))
    h.clock.set(item.ready_ms / 1000)  # type: ignore[union-attr]
    claim = h.store.claim(h.store.shard_of(item_id("a")))
    assert [i.id for i in claim.items] == [item_id("a")]
    h.app.conf.beat_schedule = {"a": {"task": "t.a", "schedule": 60.0, "args": [2]}}
    report = sync(h.app, h.store, wait=0.1)
    assert "leased" in report.errors["a"]  # not replaced under a live lease
    # the forwarder holding it fires it; then the sync applies the change to the next run
    target = PeriodicTarget(h.sent)
    published = target.publish_claimed([_delivery(claim.items[0])], Lease(h.store, claim))
    assert published.acked == [item_id("a")]
    assert sync(h.app, h.store).changed == ["a"]
    after = h.store.get(item_id("a"))
    assert after.ready_ms == item.ready_ms + 60_000  # type: ignore[union-attr]


def _delivery(claimed: Any) -> Any:
    from delayq_backends.targets import Delivery

    return Delivery(claimed.id, Envelope.decode(claimed.envelope), claimed.attempts, claimed.ready_ms)


# -- the rearm ------------------------------------------------------------------------------------


def test_a_kill_between_publish_and_rearm_resends_that_period_with_its_task_id_and_schedules_once() -> None:
    """Forwarder A claims and publishes, then dies before its rearm. When A's lease runs out, B
    fires the same period again (same task id) and schedules the next run; A's late rearm (had it
    lived) finds nothing of its own. One next run, never two, never none."""
    start = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
    h = Harness(start, {"a": {"task": "t.a", "schedule": 60.0}}, zone="UTC")
    h.sync()
    ident = item_id("a")
    due = h.store.get(ident).ready_ms  # type: ignore[union-attr]
    h.clock.set(due / 1000)
    shard = h.store.shard_of(ident)
    claim_a = h.store.claim(shard)  # A claims; its publish goes out; A dies before its rearm
    h.clock.advance(timedelta(seconds=h.store.config.lease_seconds + 1))
    claim_b = h.store.claim(shard)
    assert [i.id for i in claim_b.items] == [ident]  # the same period, claimed again
    report = PeriodicTarget(h.sent).publish_claimed([_delivery(claim_b.items[0])], Lease(h.store, claim_b))
    assert report.acked == [ident]
    stale = h.store.rearm(claim_a, ident, due / 1000 + 60, Envelope.decode(claim_a.items[0].envelope))
    assert stale is RearmOutcome.HELD
    item = h.store.get(ident)
    assert item is not None and item.ready_ms == due + 60_000 and item.leased_until_ms is None
    [(task_id, _)] = h.runs()
    assert task_id == run_task_id("a", _slot(due))  # A's send of this period had this id too
    assert Envelope.decode(item.envelope).target == KIND


def _slot(ms: int) -> Any:
    from delayq_backends.periodic.schedules import Slot

    return Slot(str(ms), ms)


def test_an_every_2_seconds_entry_fires_once_per_period_with_two_forwarders() -> None:
    start = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
    h = Harness(start, {"e": {"task": "t.e", "schedule": 2.0, "options": {"delayq_misfire": "run_all"}}})
    h.sync()
    other = TestingForwarder(h.store, [h.sent, PeriodicTarget(h.sent)])
    for step in range(60):  # 30 s in steps of 500 ms, the two forwarders taking turns
        h.clock.advance(timedelta(milliseconds=500))
        (h.forwarder if step % 2 else other).run_once()
    ids = [task_id for task_id, _ in h.runs()]
    assert len(ids) == 15 and len(set(ids)) == 15


# -- on real servers ------------------------------------------------------------------------------


def test_sync_fire_and_rearm_on_real_servers(store: Any) -> None:
    """The registry, rearm.lua and the compare-and-set on Valkey, Redis and a Redis Cluster."""
    app = Celery("real", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"fast": {"task": "t.fast", "schedule": 0.2}, "slow": {"task": "t.slow", "schedule": 3600}}
    assert sorted(sync(app, store).added) == ["fast", "slow"]
    sent = CollectingTarget("celery")
    forwarder = TestingForwarder(store, [sent, PeriodicTarget(sent)])
    deadline = datetime.now(timezone.utc) + timedelta(seconds=20)
    while len(sent.delivered) < 3 and datetime.now(timezone.utc) < deadline:
        forwarder.run_once()
    ids = [StoredMessage.from_envelope(d.envelope).task_id for d in sent.delivered]
    assert len(ids) >= 3 and len(set(ids)) == len(ids)
    fast = {s.name: s for s in statuses(store)}["fast"]
    assert fast.runs == len(ids) and fast.next_run_ms > fast.last_run_ms  # type: ignore[operator]
    app.conf.beat_schedule = {"slow": {"task": "t.slow", "schedule": 60}}
    report = sync(app, store)
    assert (report.removed, report.changed) == (["fast"], ["slow"])
    assert [s.name for s in statuses(store)] == ["slow"]
