"""Overlap policies of periodic entries (``options={"delayq_overlap": ...}``) on the fake-clock
harness of ``test_periodic.py``: the worker's side is played by ``hold_slots`` with the member
the worker's ``task_prerun`` hook derives from the run's message, so the test also pins that the
forwarder and the worker name a run's slot alike. Real workers: ``test_periodic_overlap_processes.py``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from delayq_backends.celery.message import StoredMessage
from delayq_backends.celery.slots import SLOT_HEADER, slot_of_request
from delayq_backends.cli.periodic import show_periodic
from delayq_backends.envelope import Envelope
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.overlap_policy import POLICIES
from delayq_backends.periodic.ops import item_id, statuses
from delayq_backends.store import RUN_HOLD_MS
from delayq_backends.targets import SLOT_TOKEN
from delayq_backends.testing import TestingForwarder
from delayq_backends.timeutil import from_ms
from tests.test_celery.test_periodic import Harness

START = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
KEY = "periodic:m"


def _harness(policy: str | None) -> Harness:
    options = {} if policy is None else {"delayq_overlap": policy}
    h = Harness(START, {"m": {"task": "t.m", "schedule": 60.0, "options": options}})
    assert h.sync().errors == {}
    return h


def _messages(h: Harness) -> list[StoredMessage]:
    return [StoredMessage.from_envelope(d.envelope) for d in h.sent.delivered]


#: a hold that outlasts the test: a worker whose heartbeat keeps renewing it
BEATING = 3_600_000


def _worker(h: Harness, message: StoredMessage, mode: str, hold_ms: int = BEATING) -> None:
    """What ``install(app)``'s task_prerun (start) or task_postrun (end) does for this message."""
    token = next(d.slot_token for d in h.sent.delivered if d.envelope == message.to_envelope())  # its header
    found = slot_of_request(SimpleNamespace(**{**message.headers, "retries": 0, SLOT_TOKEN: token}))
    assert found is not None, "the run carries no slot the worker would hold"
    slot, run = found
    h.store.hold_slots({slot.key: [run]}, mode, hold_ms=hold_ms)


def _entry(h: Harness) -> Any:
    (entry,) = statuses(h.store)
    return entry


def test_skip_skips_and_counts_the_periods_while_the_run_holds_its_slot() -> None:
    h = _harness("skip")
    h.fire_next("m")
    (first,) = _messages(h)
    assert first.headers[SLOT_HEADER] == {"key": KEY, "limit": 1}
    _worker(h, first, "start")
    assert h.store.slot_status(KEY).running == 1  # the worker holds the forwarder's member: one hold
    h.fire_next("m")
    h.fire_next("m")
    assert len(_messages(h)) == 1  # both periods fell due while the run ran
    assert (_entry(h).skipped, _entry(h).overlap, _entry(h).runs) == (2, "skip", 1)
    _worker(h, first, "end")
    h.fire_next("m")
    assert len(_messages(h)) == 2 and _entry(h).skipped == 2
    assert h.store.slot_status(KEY).running == 1  # the new run's slot, taken at release


def test_skip_counts_a_crashed_workers_period_until_its_hold_lapses() -> None:
    """A worker killed mid-run never ends its hold: periods are skipped for one run hold (60 s)
    after its last beat, then the entry runs again."""
    h = _harness("skip")
    h.fire_next("m")
    h.clock.advance(30)
    _worker(h, _messages(h)[0], "start", RUN_HOLD_MS)  # 30 s into the period, then killed: no beat, no end
    h.fire_next("m")  # 30 s after the start: held
    assert len(_messages(h)) == 1 and _entry(h).skipped == 1
    h.fire_next("m")  # 90 s after it: lapsed 30 s ago
    assert len(_messages(h)) == 2 and _entry(h).skipped == 1


def test_buffer_one_keeps_one_run_waiting_and_skips_the_rest() -> None:
    metrics = ForwarderMetrics()
    h = _harness("buffer_one")
    h.forwarder = TestingForwarder(h.store, [h.sent, h.periodic], metrics=metrics)  # the skipped periods reported
    h.fire_next("m")
    (first,) = _messages(h)
    _worker(h, first, "start")
    h.fire_next("m")  # waits: its own slotted item, first in the slot's line
    h.fire_next("m")  # one waits already: skipped
    h.fire_next("m")
    assert len(_messages(h)) == 1
    assert h.store.slot_status(KEY).waiting == 1
    assert (_entry(h).skipped, _entry(h).runs) == (2, 2)  # runs: the one sent and the one buffered
    assert metrics.periodic_skipped.labels("m")._value.get() == 2
    _worker(h, first, "end")
    h.clock.advance(1)
    h.forwarder.run_once()
    second = _messages(h)[1]
    assert second.task_id != first.task_id and second.headers[SLOT_HEADER]["key"] == KEY
    assert h.store.get(second.task_id) is None  # the buffered item went out and was acked
    assert h.store.slot_status(KEY).waiting == 0


def test_allow_is_the_default_and_carries_no_slot() -> None:
    h = _harness(None)
    h.fire_next("m")
    h.fire_next("m")
    assert len(_messages(h)) == 2
    assert all(SLOT_HEADER not in m.headers for m in _messages(h))
    assert (_entry(h).overlap, _entry(h).skipped) == ("allow", 0)
    assert h.store.slot_keys_in_use() == []


def test_a_bad_policy_is_refused_at_sync_naming_the_entry_and_the_policies() -> None:
    h = Harness(START, {"m": {"task": "t.m", "schedule": 60.0, "options": {"delayq_overlap": "queue"}}})
    report = h.sync()
    assert report.added == [] and list(report.errors) == ["m"]
    assert "'m'" in report.errors["m"] and "'queue'" in report.errors["m"]
    assert all(repr(p) in report.errors["m"] for p in POLICIES)
    assert h.store.get(item_id("m")) is None


def test_changing_the_policy_is_a_change_and_keeps_the_count() -> None:
    h = _harness("skip")
    h.fire_next("m")
    _worker(h, _messages(h)[0], "start")
    h.fire_next("m")  # skipped: the run holds its slot
    assert _entry(h).skipped == 1
    report = h.sync({"m": {"task": "t.m", "schedule": 60.0, "options": {"delayq_overlap": "buffer_one"}}})
    assert report.changed == ["m"]
    assert (_entry(h).overlap, _entry(h).skipped) == ("buffer_one", 1)
    assert h.sync().unchanged == ["m"]


@pytest.mark.parametrize("policy", ["skip", "buffer_one"])
def test_a_run_the_broker_refuses_gives_its_slot_back(policy: str) -> None:
    """Else the slot stays taken for its start window (60 s) and every period meanwhile is skipped."""
    h = _harness(policy)
    refuse = [True]

    def broker(d: Any) -> None:
        if refuse[0]:
            raise ConnectionRefusedError("refused")

    h.sent.callback = broker
    h.fire_next("m")
    assert h.sent.delivered == [] and h.store.slot_status(KEY).running == 0
    refuse[0] = False
    h.clock.advance(120)  # past the entry's retry back-off, and its next period
    h.forwarder.run_once()
    assert len(_messages(h)) == 1 and _entry(h).skipped == 0


def test_garbage_in_the_entrys_slot_keys_or_its_counts_never_stops_it() -> None:
    """The slot keys of an overlap entry and its stored policy and count can be written by
    anyone with the producer role: a key of another type costs one skipped period (it is dropped
    at once), a count or policy no release wrote reads as 0 or ``allow``; the entry keeps firing."""
    h = _harness("skip")
    holds, waiting, waits, limit, _, _ = h.store.slot_keys(KEY)
    h.store.client.set(holds, "garbage")
    h.store.client.zadd(waiting, {"no-wait-behind-it": 1})
    h.store.client.set(limit, "-3")
    h.fire_next("m")
    h.fire_next("m")
    assert len(_messages(h)) == 1 and _entry(h).skipped == 1  # the period that met the garbage
    h.store.client.delete(waiting)
    h.store.client.zadd(waiting, {"no-wait-behind-it": 1})
    _worker(h, _messages(h)[0], "end")
    h.fire_next("m")
    assert len(_messages(h)) == 2  # a line entry with no wait is no item's place: dropped
    assert h.store.client.zcard(waiting) == 0 and h.store.client.zcard(waits) == 0
    item = h.store.get(item_id("m"))
    assert item is not None
    envelope = Envelope.decode(item.envelope)
    state = dict(envelope.meta["periodic"])
    state.update(skipped="many", overlap="sometimes")
    forged = replace(envelope, meta={**envelope.meta, "periodic": state})
    h.store.schedule(item_id("m"), from_ms(item.ready_ms), forged, mode="replace")
    h.fire_next("m")
    assert len(_messages(h)) == 3 and (_entry(h).skipped, _entry(h).overlap) == (0, "allow")


def test_a_misspelt_option_names_the_overlap_option_among_the_known_ones() -> None:
    h = Harness(START, {"m": {"task": "t.m", "schedule": 60.0, "options": {"delayq_overlapp": "skip"}}})
    assert "'delayq_overlap'" in h.sync().errors["m"]


def test_periodic_list_shows_the_skipped_periods_and_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    h = _harness("skip")
    h.fire_next("m")
    _worker(h, _messages(h)[0], "start")
    h.fire_next("m")  # skipped: the first run's slot is still held
    show_periodic(h.store, as_json=False)
    table = capsys.readouterr().out
    assert "skipped" in table and "1 (skip)" in table
    show_periodic(h.store, as_json=True)
    [entry] = json.loads(capsys.readouterr().out)
    assert (entry["overlap"], entry["skipped"], entry["runs"]) == ("skip", 1, 1)


def test_a_sync_restores_a_policy_an_older_forwarder_dropped() -> None:
    """An older release's rearm writes the state it knows: the fingerprint, not the policy."""
    h = _harness("skip")
    item = h.store.get(item_id("m"))
    assert item is not None
    envelope = Envelope.decode(item.envelope)
    state = {k: v for k, v in envelope.meta["periodic"].items() if k not in ("overlap", "skipped")}
    old = replace(envelope, meta={**envelope.meta, "periodic": state})
    h.store.schedule(item_id("m"), from_ms(item.ready_ms), old, mode="replace")
    assert _entry(h).overlap == "allow"
    assert h.sync().changed == ["m"] and _entry(h).overlap == "skip"
