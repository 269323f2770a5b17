"""Entries as data, on a fake clock: runtime entries beside code ones, pause/resume, run now,
backfill, start/end, maximum runs, jitter, one-offs, and the sync rules (source-scoped, an
empty schedule removes nothing, versions)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from delayq_backends.celery.message import StoredMessage
from delayq_backends.celery.periodic import entry_spec
from delayq_backends.envelope import ENTRY_FORMAT_VERSION, FORMAT_VERSION, Envelope
from delayq_backends.periodic import ops
from delayq_backends.periodic.firing import BACKFILL, MANUAL, Run
from delayq_backends.periodic.gauges import entry_gauges
from delayq_backends.periodic.history import read_history
from delayq_backends.periodic.ops import CodeEntryError, EntryNotFound, item_id
from delayq_backends.periodic.registry import PeriodicError
from delayq_backends.periodic.schedules import Every, Once, Period, run_task_id
from delayq_backends.periodic.state import jitter_offset, state_of
from delayq_backends.timeutil import MAX_MS
from tests.test_celery.test_periodic import Harness

T0 = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
MS0 = int(T0.timestamp() * 1000)


def _add(h: Harness, name: str, schedule: Any = 10.0, **options: Any) -> str:
    conf = {"task": f"t.{name}", "schedule": schedule, "options": options}
    return ops.upsert(h.store, entry_spec(h.app, name, conf))


def _ready(h: Harness, name: str) -> int:
    item = h.store.get(item_id(name))
    assert item is not None
    return item.ready_ms


def _state(h: Harness, name: str) -> Any:
    item = h.store.get(item_id(name))
    assert item is not None
    return state_of(Envelope.decode(item.envelope))


def _forward_at(h: Harness, ms: int) -> list[StoredMessage]:
    """Forward what is due at ``ms``; the messages sent by that pass."""
    before = len(h.sent.delivered)
    h.clock.set(ms / 1000)
    h.forwarder.run_once()
    return [StoredMessage.from_envelope(d.envelope) for d in h.sent.delivered[before:]]


def test_a_runtime_entry_fires_beside_code_entries_and_no_sync_touches_it() -> None:
    h = Harness(T0, {"code": {"task": "t.code", "schedule": 10.0}})
    h.sync()
    assert _add(h, "rt", 5.0) == "added"
    assert _ready(h, "rt") == MS0 + 5000
    [run] = _forward_at(h, MS0 + 5000)
    assert (run.task, run.task_id) == ("t.rt", run_task_id("rt", Period(str(MS0 + 5000), MS0 + 5000)))
    report = h.sync({"other": {"task": "t.o", "schedule": 10.0}})  # "code" left the config
    assert (report.removed, report.added) == (["code"], ["other"])
    rt = ops.get(h.store, "rt")
    assert rt is not None and (rt.source, rt.kind, rt.task, rt.state) == ("runtime", "celery", "t.rt", "scheduled")
    assert _add(h, "rt", 5.0) == "unchanged" and _add(h, "rt", 7.0) == "changed"


def test_pause_stops_every_period_and_resume_applies_the_misfire_policy() -> None:
    h = Harness(T0, {})
    _add(h, "p", 10.0, delayq_misfire="run_all")
    ops.pause(h.store, "p")
    assert _ready(h, "p") == MAX_MS and ops.get(h.store, "p").state == "paused"  # type: ignore[union-attr]
    assert _forward_at(h, MS0 + 35_000) == []  # three periods and more: nothing while paused
    status = ops.resume(h.store, "p")
    assert status.enabled and status.next_run_ms == MS0 + 10_000  # due at once: its periods passed
    runs = _forward_at(h, MS0 + 35_000)
    assert [r.task_id for r in runs] == [
        run_task_id("p", Period(str(at), at)) for at in (MS0 + 10_000 * k for k in (1, 2, 3))
    ]
    assert _ready(h, "p") == MS0 + 40_000


def test_resume_under_run_once_sends_one_run_for_the_paused_periods_none_missed_or_late() -> None:
    h = Harness(T0, {})
    _add(h, "p", 10.0)
    ops.pause(h.store, "p")
    h.clock.set((MS0 + 45_000) / 1000)
    ops.resume(h.store, "p")
    assert len(_forward_at(h, MS0 + 45_000)) == 1  # the latest paused period's, 5 s after it
    assert ops.get(h.store, "p").last_missed == 0  # type: ignore[union-attr]
    history = read_history(h.store, "p")
    assert (history.missed, history.late, [r.due_ms for r in history.runs]) == (0, 0, [MS0 + 40_000])
    assert _state(h, "p").paused_ms is None, "the pause's periods are planned: a later outage counts"
    [later] = _forward_at(h, MS0 + 75_000)  # an outage after the resume: 50 s and 60 s missed
    assert later.task_id == run_task_id("p", Period(str(MS0 + 70_000), MS0 + 70_000))
    assert read_history(h.store, "p").missed == 2


def test_a_resumed_entry_owes_a_success_from_its_resume_not_from_its_paused_periods() -> None:
    """``delayq_periodic_overdue_seconds`` after a pause of 3.5 periods: the "no success for 3
    periods" alert compares it with 3 periods, and fired on every planned pause."""
    h = Harness(T0, {})
    _add(h, "p", 10.0)
    ops.pause(h.store, "p")
    h.clock.set((MS0 + 45_000) / 1000)
    ops.resume(h.store, "p")
    h.clock.set((MS0 + 45_500) / 1000)
    [gauge] = entry_gauges(h.store)
    assert (gauge.enabled, gauge.overdue_ms) == (True, 500)
    _forward_at(h, MS0 + 46_000)  # its run went out, no worker has run it yet
    [gauge] = entry_gauges(h.store)
    assert gauge.overdue_ms == 1000


def test_periods_missed_before_a_pause_still_count_and_a_second_pause_extends_the_first() -> None:
    h = Harness(T0, {})
    _add(h, "p", 10.0)  # periods at MS0 + 10 s, 20 s, ...; no forwarder fires 10 s and 20 s
    h.clock.set((MS0 + 25_000) / 1000)
    ops.pause(h.store, "p")
    h.clock.set((MS0 + 32_000) / 1000)
    ops.resume(h.store, "p")  # no forwarder fires the 30 s period either: paused again
    h.clock.set((MS0 + 33_000) / 1000)
    ops.pause(h.store, "p")
    h.clock.set((MS0 + 45_000) / 1000)
    ops.resume(h.store, "p")
    [run] = _forward_at(h, MS0 + 45_000)
    assert run.task_id == run_task_id("p", Period(str(MS0 + 40_000), MS0 + 40_000))
    assert ops.get(h.store, "p").last_missed == 2  # type: ignore[union-attr]
    assert (read_history(h.store, "p").missed, read_history(h.store, "p").late) == (2, 0)


def test_a_paused_entry_claimed_in_a_race_is_rearmed_without_a_run() -> None:
    h = Harness(T0, {})
    _add(h, "p", 10.0)
    ops.pause(h.store, "p")
    item = h.store.get(item_id("p"))
    assert item is not None  # a forwarder read it before the pause: it comes due now
    h.store.replace_if(item_id("p"), item.envelope, T0, item.envelope)
    assert _forward_at(h, MS0 + 20_000) == []
    assert _ready(h, "p") == MAX_MS and not _state(h, "p").enabled


def test_run_now_sends_one_extra_run_and_leaves_the_schedule() -> None:
    h = Harness(T0, {})
    _add(h, "r", 60.0)
    h.clock.set((MS0 + 1_000) / 1000)
    status = ops.run_now(h.store, "r")
    assert status.run_now == 1 and status.next_run_ms == MS0 + 1_000
    [run] = _forward_at(h, MS0 + 1_000)
    assert run.task_id == Run(Period(str(MS0 + 1_000), MS0 + 1_000), MANUAL).task_id("r")
    assert _ready(h, "r") == MS0 + 60_000 and _state(h, "r").runs == 0 and not _state(h, "r").pending
    assert len(_forward_at(h, MS0 + 60_000)) == 1  # on schedule, once


def test_run_now_on_a_paused_entry_runs_it_once_and_it_stays_paused() -> None:
    h = Harness(T0, {})
    _add(h, "r", 60.0, delayq_enabled=False)
    assert ops.get(h.store, "r").state == "paused"  # type: ignore[union-attr]
    ops.run_now(h.store, "r")
    assert len(_forward_at(h, MS0)) == 1
    assert _ready(h, "r") == MAX_MS


def test_backfill_runs_each_period_of_the_range_once_with_its_own_ids() -> None:
    h = Harness(T0, {})
    _add(h, "b", 60.0)  # periods at MS0 + k min
    h.clock.set((MS0 + 5_000) / 1000)
    ops.backfill(h.store, "b", MS0 - 180_000, MS0 - 1)  # 3 periods of the same grid, before
    runs = _forward_at(h, MS0 + 5_000)
    ats = [MS0 - 120_000, MS0 - 60_000, MS0]
    expected = [Run(Period(str(at), at), BACKFILL).task_id("b") for at in [MS0 - 180_000, *ats[:2]]]
    assert [r.task_id for r in runs] == expected
    assert not set(expected) & {run_task_id("b", Period(str(at), at)) for at in ats}
    assert _ready(h, "b") == MS0 + 60_000 and _forward_at(h, MS0 + 30_000) == []
    history = read_history(h.store, "b")
    assert (len(history.runs), history.late, history.missed) == (3, 0, 0), "asked for now: not late"


def test_a_backfill_out_of_bounds_is_refused_with_the_fix() -> None:
    h = Harness(T0, {})
    _add(h, "b", 1.0)
    with pytest.raises(PeriodicError, match="swap the times"):
        ops.backfill(h.store, "b", MS0, MS0 - 1)
    with pytest.raises(PeriodicError, match="split it into shorter ranges"):
        ops.backfill(h.store, "b", MS0, MS0 + 20_000_000)
    with pytest.raises(PeriodicError, match="no period"):
        ops.backfill(h.store, "b", MS0 + 1, MS0 + 999)
    with pytest.raises(EntryNotFound, match="periodic list"):
        ops.backfill(h.store, "nope", MS0, MS0 + 1)


def test_start_end_and_max_runs_bound_the_runs_then_the_entry_is_finished() -> None:
    h = Harness(T0, {})
    _add(h, "s", 10.0, delayq_start=(MS0 + 100_000) / 1000, delayq_end=(MS0 + 125_000) / 1000)
    assert _ready(h, "s") == MS0 + 100_000  # an interval starting later runs first at its start
    assert len(_forward_at(h, MS0 + 100_000)) == 1 and len(_forward_at(h, MS0 + 110_000)) == 1
    assert len(_forward_at(h, MS0 + 120_000)) == 1
    status = ops.get(h.store, "s")
    assert status is not None and (status.state, status.finished, status.next_run_ms) == ("finished", True, None)
    _add(h, "m", 10.0, delayq_max_runs=2)
    for _ in range(2):
        assert len(_forward_at(h, _ready(h, "m"))) == 1
    assert ops.get(h.store, "m").finished and _forward_at(h, MS0 + 1_000_000) == []  # type: ignore[union-attr]


def test_jitter_delays_each_period_deterministically_and_keeps_its_task_id() -> None:
    h = Harness(T0, {})
    _add(h, "j", 60.0, delayq_jitter=30)
    slot = Period(str(MS0 + 60_000), MS0 + 60_000)
    offset = jitter_offset("j", slot, 30_000)
    assert 0 <= offset < 30_000 and _ready(h, "j") == MS0 + 60_000 + offset
    assert _forward_at(h, MS0 + 60_000 + offset - 1) == []
    [run] = _forward_at(h, MS0 + 60_000 + offset)
    assert run.task_id == run_task_id("j", slot)
    following = Period(str(MS0 + 120_000), MS0 + 120_000)
    assert _ready(h, "j") == MS0 + 120_000 + jitter_offset("j", following, 30_000)
    offsets = {jitter_offset("j", Period(str(k), k), 30_000) for k in range(0, 6_000_000, 60_000)}
    assert len(offsets) > 50, "spread, not one constant offset"


def test_a_one_off_runs_once_at_its_time_then_is_finished_and_listed() -> None:
    h = Harness(T0, {})
    _add(h, "once", Once(MS0 + 90_000))
    assert _ready(h, "once") == MS0 + 90_000
    [run] = _forward_at(h, MS0 + 95_000)
    assert run.task_id == run_task_id("once", Period(str(MS0 + 90_000), MS0 + 90_000))
    status = ops.get(h.store, "once")
    assert status is not None and status.state == "finished" and status.schedule.startswith("once at")
    assert _forward_at(h, MS0 + 10_000_000) == []


def test_entries_with_new_fields_are_stored_in_the_format_older_forwarders_leave_alone() -> None:
    h = Harness(T0, {"plain": {"task": "t.p", "schedule": 10.0}})
    h.sync()
    _add(h, "rt", 10.0)
    plain, rt = (h.store.get(item_id(n)) for n in ("plain", "rt"))
    assert plain is not None and plain.envelope[2] == FORMAT_VERSION  # read by every release
    assert rt is not None and rt.envelope[2] == ENTRY_FORMAT_VERSION  # a newer format to older ones
    assert Envelope.decode(rt.envelope).meta["periodic"]["v"] == 2
    ops.pause(h.store, "plain")  # a code entry paused: the newer format too, while paused
    assert h.store.get(item_id("plain")).envelope[2] == ENTRY_FORMAT_VERSION  # type: ignore[union-attr]
    ops.resume(h.store, "plain")
    assert h.store.get(item_id("plain")).envelope[2] == FORMAT_VERSION  # type: ignore[union-attr]


# -- sync rules ------------------------------------------------------------------------------------


def test_an_empty_beat_schedule_removes_nothing() -> None:
    h = Harness(T0, {"a": {"task": "t.a", "schedule": 10.0}, "b": {"task": "t.b", "schedule": 10.0}})
    h.sync()
    report = h.sync({})
    assert (report.removed, report.kept) == ([], 2) and "2 code entries not in this sync kept" in report.describe()
    assert [s.name for s in ops.statuses(h.store)] == ["a", "b"]


def test_an_older_schedule_version_changes_nothing_and_an_equal_one_must_match() -> None:
    h = Harness(T0, {"a": {"task": "t.a", "schedule": 10.0}})
    h.app.conf.delayq_schedule_version = 20
    assert h.sync().added == ["a"]
    h.app.conf.delayq_schedule_version = 19  # an older deploy's forwarder starting late
    report = h.sync({"old": {"task": "t.old", "schedule": 10.0}})
    assert "older than the one synced last, version 20" in report.refused and report.added == []
    assert [s.name for s in ops.statuses(h.store)] == ["a"]
    h.app.conf.delayq_schedule_version = 20
    assert "bump the version" in h.sync({"x": {"task": "t.x", "schedule": 1.0}}).refused
    assert h.sync({"a": {"task": "t.a", "schedule": 10.0}}).unchanged == ["a"]  # the same deploy again
    h.app.conf.delayq_schedule_version = None
    report = h.sync({"new": {"task": "t.n", "schedule": 10.0}})  # unversioned after a versioned sync
    assert "delayq_schedule_version" in report.refused and ops.get(h.store, "new") is None
    h.app.conf.delayq_schedule_version = 21
    report = h.sync({"new": {"task": "t.n", "schedule": 10.0}})
    assert (report.added, report.removed) == (["new"], ["a"])


def test_a_runtime_entry_shadows_the_code_entry_of_its_name() -> None:
    h = Harness(T0, {})
    _add(h, "x", 5.0)
    report = h.sync({"x": {"task": "t.code", "schedule": 60.0}})
    assert report.shadowed == ["x"] and "1 shadowed" in report.describe()
    x = ops.get(h.store, "x")
    assert x is not None and (x.source, x.task) == ("runtime", "t.x")
    assert h.sync({}).removed == []  # never removed by a sync either


def test_a_code_entry_is_updated_only_detached_and_removed_only_forced() -> None:
    h = Harness(T0, {"c": {"task": "t.c", "schedule": 10.0}})
    h.sync()
    spec = entry_spec(h.app, "c", {"task": "t.c", "schedule": 30.0})
    with pytest.raises(CodeEntryError, match="--detach"):
        ops.upsert(h.store, spec)
    with pytest.raises(CodeEntryError, match="or pause it"):
        ops.remove(h.store, ["c"])
    assert ops.upsert(h.store, spec, detach=True) == "changed"
    assert ops.get(h.store, "c").source == "runtime"  # type: ignore[union-attr]
    report = h.sync()
    assert report.shadowed == ["c"] and _state(h, "c").schedule == Every(30_000)


def test_runtime_state_of_a_code_entry_survives_a_sync_that_changes_it() -> None:
    h = Harness(T0, {"c": {"task": "t.c", "schedule": 10.0}})
    h.sync()
    ops.pause(h.store, "c")
    ops.run_now(h.store, "c")
    assert h.sync({"c": {"task": "t.c", "schedule": 10.0, "args": [1]}}).changed == ["c"]
    state = _state(h, "c")
    assert not state.enabled and len(state.run_now) == 1 and state.source == "code"


def test_a_celery_sync_never_removes_entries_of_another_kind() -> None:
    h = Harness(T0, {"c": {"task": "t.c", "schedule": 10.0}})
    h.sync()
    celery_spec = entry_spec(h.app, "other", {"task": "t.o", "schedule": 10.0}, source="code")
    # a kind no adapter registers (rq-periodic is RQ's, whose reader would refuse a Celery template)
    template = replace(celery_spec.template, envelope=replace(celery_spec.template.envelope, target="x-periodic"))
    assert ops.sync_code(h.store, [replace(celery_spec, template=template)], kind="x-periodic").added == ["other"]
    assert h.sync({}).kept == 1 and h.sync({"d": {"task": "t.d", "schedule": 5.0}}).removed == ["c"]
    assert {s.name: s.kind for s in ops.statuses(h.store)} == {"d": "celery", "other": "x-periodic"}


def test_actions_on_an_unknown_entry_name_the_listing() -> None:
    h = Harness(T0, {})
    for action in (ops.pause, ops.resume, ops.run_now):
        with pytest.raises(EntryNotFound, match="delayq periodic list"):
            action(h.store, "ghost")
    assert ops.get(h.store, "ghost") is None


def test_bad_entry_fields_are_refused_naming_the_fix() -> None:
    h = Harness(T0, {})
    with pytest.raises(PeriodicError, match="delayq_jitter=-1: use seconds"):
        _add(h, "j", 10.0, delayq_jitter=-1)
    with pytest.raises(PeriodicError, match="end is before its start"):
        _add(h, "j", 10.0, delayq_start=2_000_000_000, delayq_end=1_900_000_000)
    with pytest.raises(PeriodicError, match="delayq_max_runs=0"):
        _add(h, "j", 10.0, delayq_max_runs=0)
    report = h.sync({"bad": {"task": "t", "schedule": 1.0, "options": {"delayq_start": "tomorrow"}}})
    assert "delayq_start='tomorrow'" in report.errors["bad"]


def test_an_edit_moves_the_entry_without_waiting_for_its_old_time() -> None:
    h = Harness(T0, {})
    _add(h, "e", 3600.0)
    assert _ready(h, "e") == MS0 + 3_600_000
    h.clock.set((MS0 + timedelta(seconds=5) / timedelta(milliseconds=1)) / 1000)
    assert _add(h, "e", 10.0) == "changed"
    assert _ready(h, "e") == MS0 + 15_000  # the new schedule's first period after the edit


def test_a_new_schedule_waits_for_the_firing_of_a_period_that_is_due() -> None:
    """Issue 25, found by the edits-under-fire test: a schedule change landing while a period was
    due but not fired yet (a forwarder about to claim it, or a killed holder's lease just run out)
    replaced that period by the new schedule's first, so under ``run_all`` it never ran. The
    change now waits for that firing; the period runs under the old schedule, then the new one
    starts one period after the change."""
    h = Harness(T0, {})
    _add(h, "e", 10.0, delayq_misfire="run_all")
    h.clock.set((MS0 + 10_500) / 1000)  # its first period is due, no forwarder has fired it yet
    changed: list[str] = []
    edit = threading.Thread(target=lambda: changed.append(_add(h, "e", 20.0, delayq_misfire="run_all")))
    edit.start()
    edit.join(0.3)
    assert edit.is_alive() and not changed, "the change waits for the due period's firing"
    [run] = _forward_at(h, MS0 + 10_500)
    edit.join(5)
    assert changed == ["changed"] and run.task_id == run_task_id("e", Period(str(MS0 + 10_000), MS0 + 10_000))
    assert _ready(h, "e") == MS0 + 10_500 + 20_000


def test_a_new_schedule_replaces_a_period_due_long_ago_at_once() -> None:
    """With no forwarder running (its period due for longer than a firing takes), a schedule
    change does not wait: the missed period is an outage's."""
    h = Harness(T0, {})
    _add(h, "e", 10.0, delayq_misfire="run_all")
    h.clock.set((MS0 + 10_000 + 60_000) / 1000)
    began = time.monotonic()
    assert _add(h, "e", 20.0) == "changed"
    assert time.monotonic() - began < 1 and _ready(h, "e") == MS0 + 70_000 + 20_000
