"""Periodic entries' history (periodic/history.py, periodic_run.lua) on real servers: events in
any order make one record per run, the bound and the TTL hold, the counters count, a hand write
reads as absent and never raises, and a store that cannot be reached costs a log line only."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from delayq_backends import DelayStore
from delayq_backends.keys import periodic_key
from delayq_backends.periodic.gauges import OTHER, PeriodicCollector
from delayq_backends.periodic.history import (
    HISTORY_TTL_MS,
    LATE_MS,
    RunMark,
    SentRun,
    history_keys,
    read_histories,
    read_history,
    record_finished,
    record_published,
    record_started,
    report_published,
)
from delayq_backends.periodic.schedules import Every, Misfire, Period
from delayq_backends.periodic.state import PeriodicState, with_state
from delayq_backends.targets import RedisListTarget
from delayq_backends.timeutil import MAX_MS, from_ms
from tests.harness import make_store

DUE = 1_800_000_000_000


class Clock:
    """A store clock the test moves."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clocked(store: DelayStore) -> tuple[DelayStore, Clock]:
    clock = Clock(DUE)
    store.clock = clock
    return store, clock


def test_events_in_any_order_make_one_record_per_run(clocked: tuple[DelayStore, Clock]) -> None:
    store, clock = clocked
    mark = RunMark("tick", DUE)
    clock.now = DUE + 20
    record_started(store, mark, "r1")  # a worker can start a run before its forwarder records the publish
    clock.now = DUE + 5
    assert record_published(store, mark, "r1")
    clock.now = DUE + 70
    record_finished(store, mark, "r1", "success")
    clock.now = DUE + 9000
    assert not record_published(store, mark, "r1")  # sent again after a forwarder died: counted once
    found = read_history(store, "tick")
    [run] = found.runs
    assert (run.run_id, run.due_ms, run.kind) == ("r1", DUE, "scheduled")
    assert (run.published_ms, run.lateness_ms, run.started_ms, run.finished_ms) == (DUE + 5, 5, DUE + 20, DUE + 70)
    assert run.outcome == "success" and found.last_success_ms == DUE + 70
    assert (found.missed, found.late) == (0, 0)


def test_a_retry_clears_the_outcome_and_a_failure_keeps_the_last_success(clocked: tuple[DelayStore, Clock]) -> None:
    store, clock = clocked
    ok, bad = RunMark("tick", DUE), RunMark("tick", DUE + 1000)
    record_finished(store, ok, "ok", "success")
    clock.now = DUE + 1500
    record_started(store, bad, "bad")
    record_finished(store, bad, "bad", "retry")
    clock.now = DUE + 1600
    record_started(store, bad, "bad")
    assert read_history(store, "tick").runs[0].outcome is None  # running again
    record_finished(store, bad, "bad", "failure")
    found = read_history(store, "tick")
    assert [(r.run_id, r.outcome) for r in found.runs] == [("bad", "failure"), ("ok", "success")]
    assert found.last_success_ms == DUE
    assert found.unsucceeded_since_ms() == DUE + 1000
    with pytest.raises(ValueError, match="outcome 'done'"):
        record_finished(store, bad, "bad", "done")


def test_missed_and_late_periods_are_counted(clocked: tuple[DelayStore, Clock]) -> None:
    store, clock = clocked
    clock.now = DUE + LATE_MS + 1
    runs = [SentRun(RunMark("tick", DUE - 1000), "a"), SentRun(RunMark("tick", DUE), "b")]
    report_published(store, "tick", runs, missed=3)
    report_published(store, "tick", [], missed=2)  # a firing that ran none of its periods
    found = read_history(store, "tick")
    assert (found.missed, found.late) == (5, 2)
    assert [r.lateness_ms for r in found.runs] == [LATE_MS + 1, LATE_MS + 1001]


def test_the_history_is_bounded_and_expires(clocked: tuple[DelayStore, Clock]) -> None:
    store, _ = clocked
    for i in range(7):
        record_published(store, RunMark("tick", DUE + i * 1000, "manual" if i == 6 else "scheduled"), f"r{i}", keep=5)
    found = read_history(store, "tick")
    assert [r.run_id for r in found.runs] == ["r6", "r5", "r4", "r3", "r2"]  # the oldest by due time dropped
    assert found.runs[0].kind == "manual"
    hist, order = history_keys(store, "tick")
    assert len(store.client.hkeys(hist)) == 5  # their records too
    for key in (hist, order):
        assert 0 < store.client.pttl(key) <= HISTORY_TTL_MS
    assert len(read_history(store, "tick", limit=2).runs) == 2


def test_an_entrys_keys_share_its_items_shard(store: DelayStore) -> None:
    hist, order = history_keys(store, "tick")
    item_tag = store.keys(store.shard_of("periodic:tick")).tag
    assert item_tag in hist and item_tag in order


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(lambda c, h, o: c.set(h, "x"), id="history-not-a-hash"),
        pytest.param(lambda c, h, o: c.set(o, "x"), id="runs-not-a-zset"),
        pytest.param(lambda c, h, o: c.hset(h, mapping={"missed": "lots", "last_success": "{}"}), id="counters"),
        pytest.param(lambda c, h, o: (c.zadd(o, {"r0": DUE}), c.hset(h, "run:r0", "{not json")), id="record"),
        pytest.param(lambda c, h, o: (c.zadd(o, {"r0": DUE}), c.hset(h, "run:r0", '{"due": []}')), id="record-fields"),
    ],
)
def test_a_hand_write_reads_as_absent_and_is_replaced(store: DelayStore, garbage: object) -> None:
    hist, order = history_keys(store, "tick")
    garbage(store.client, hist, order)  # type: ignore[operator]
    found = read_history(store, "tick")  # never raises
    assert found.missed == 0 and found.last_success_ms is None and all(r.run_id != "r0" for r in found.runs)
    mark = RunMark("tick", DUE)
    report_published(store, "tick", [SentRun(mark, "r0")], missed=1)
    record_finished(store, mark, "r0", "success")
    found = read_history(store, "tick")
    assert found.missed == 1 and found.last_success_ms is not None
    assert [(r.run_id, r.outcome) for r in found.runs] == [("r0", "success")]


def test_histories_of_many_entries_read_in_one_call(store: DelayStore) -> None:
    record_published(store, RunMark("a", DUE), "ra")
    store.client.hset(periodic_key(store.config.prefix), "b", "periodic:b")
    a, b = read_histories(store, ["a", "b"])
    assert [r.run_id for r in a.runs] == ["ra"] and b.runs == [] and b.name == "b"


@pytest.mark.parametrize(
    "value",
    [None, "tick", {"name": "tick"}, {"name": "", "due": 1}, {"name": "t", "due": "1"},
     {"name": "t", "due": 1, "kind": "x"}, {"name": "t\x00", "due": 1}],
)  # fmt: skip
def test_a_header_no_release_wrote_is_no_mark(value: object) -> None:
    assert RunMark.parse(value) is None


def test_a_mark_round_trips_through_its_header() -> None:
    for mark in (RunMark("tick", DUE), RunMark("tick", DUE, "backfill")):
        assert RunMark.parse(mark.header()) == mark
    assert RunMark("tick", DUE).header() == {"name": "tick", "due": DUE}


def test_an_unreachable_store_is_logged_never_raised(
    valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(valkey_url, prefix)
    store.client.connection_pool.reset()
    store.client.connection_pool.connection_kwargs.update(port=1, host="127.0.0.1")  # the store went away
    with caplog.at_level(logging.WARNING, "delayq.periodic.history"):
        report_published(store, "tick", [SentRun(RunMark("tick", DUE), "r1")], missed=1)
    assert "run r1 of 'tick' published not recorded" in caplog.text


def test_the_gauges_name_the_worst_entries_and_sum_the_rest(clocked: tuple[DelayStore, Clock]) -> None:
    """``delayq exporter --periodic-entries 2``: the most overdue first, then the longest without
    a success; the rest as entry="_other" (missed and late summed, overdue the largest)."""
    store, clock = clocked
    registry = periodic_key(store.config.prefix)
    entries = {  # name: (next ready, last success's due, missed, enabled)
        "fine": (DUE + 500, DUE - 1000, 1, True),
        "owing": (DUE + 500, None, 2, True),  # never succeeded: owes from its first run on
        "stalled": (DUE - 9000, DUE - 10_000, 0, True),  # no forwarder fired it for 9 s
        "paused": (MAX_MS, None, 4, False),
    }
    for name, (ready, success_due, missed, enabled) in entries.items():
        state = PeriodicState(name, Every(1000, aligned=True), Misfire(), "", Period("k", ready), enabled=enabled)
        envelope = replace(RedisListTarget.envelope("x", b""), target="celery-periodic")
        store.schedule(f"periodic:{name}", from_ms(ready), with_state(envelope, state))
        store.client.hset(registry, name, f"periodic:{name}")
        first = RunMark(name, DUE - 3000)
        clock.now = DUE - 3000
        record_published(store, first, "first", missed=missed)
        if success_due is not None:
            record_finished(store, RunMark(name, success_due), f"ok-{name}", "success")
    clock.now = DUE
    samples = {
        (s.name, s.labels["entry"]): s.value
        for family in PeriodicCollector(store, max_entries=2).collect()
        for s in family.samples
        if "entry" in s.labels
    }
    named = {entry for _, entry in samples} - {OTHER}
    assert named == {"stalled", "owing"}  # 9 s and 3 s overdue; "fine" succeeded, "paused" owes nothing
    assert samples["delayq_periodic_overdue_seconds", "stalled"] == 9.0
    assert samples["delayq_periodic_overdue_seconds", "owing"] == 3.0
    assert samples["delayq_periodic_period_seconds", "owing"] == 1.0
    assert ("delayq_periodic_last_success_timestamp_seconds", "owing") not in samples
    assert samples["delayq_periodic_missed_total", OTHER] == 5  # fine 1 + paused 4
    assert samples["delayq_periodic_enabled", OTHER] == 1  # of fine and paused, one enabled
    assert ("delayq_periodic_next_run_timestamp_seconds", OTHER) not in samples
