"""Arguments evaluated at fire time (Celery's ``BeatLazyFunc``), on a fake clock: fresh values per
run from a forwarder that has the app, a wait (never a send, never a dead letter) from one that
has not, and the refusals at sync that name the fix."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest
from celery.beat import BeatLazyFunc

from delayq_backends.celery.lazy import lazy_parts
from delayq_backends.celery.message import StoredMessage
from delayq_backends.celery.periodic import PeriodicTarget, entry_spec, task_view
from delayq_backends.envelope import ENTRY_FORMAT_VERSION, Envelope
from delayq_backends.periodic import ops
from delayq_backends.periodic.ops import item_id
from delayq_backends.periodic.registry import PeriodicError
from delayq_backends.periodic.state import LAZY_META
from delayq_backends.testing import TestingForwarder
from tests.test_celery import lazy_values
from tests.test_celery.test_periodic import Harness

T0 = datetime(2026, 5, 4, 12, tzinfo=timezone.utc)
MS0 = int(T0.timestamp() * 1000)
LAZY = {
    "task": "t.lazy",
    "schedule": 10.0,
    "args": ["fixed", BeatLazyFunc(lazy_values.counter)],
    "kwargs": {"p": BeatLazyFunc(lazy_values.pair, 1, b="two"), "plain": 3},
    "options": {"delayq_misfire": "run_all"},
}


def _with_app(schedule: dict[str, Any]) -> Harness:
    """A harness whose forwarder has the app (``celery -A proj delayq forward``)."""
    h = Harness(T0, schedule)
    h.periodic = PeriodicTarget(h.sent, app=h.app)
    h.forwarder = TestingForwarder(h.store, [h.sent, h.periodic])
    return h


def _sent_args(h: Harness) -> list[tuple[list[Any], dict[str, Any]]]:
    out = []
    for d in h.sent.delivered:
        args, kwargs, _ = json.loads(StoredMessage.from_envelope(d.envelope).body)
        out.append((args, kwargs))
    return out


def test_each_run_gets_the_values_its_lazy_functions_return_at_its_send() -> None:
    h = _with_app({"lazy": LAZY})
    assert h.sync().added == ["lazy"]
    start = lazy_values.counter()
    h.clock.set((MS0 + 30_000) / 1000)  # three periods due: run_all sends three runs, each evaluated
    h.forwarder.run_once()
    h.fire_next("lazy")
    sent = _sent_args(h)
    assert [args for args, _ in sent] == [["fixed", start + k] for k in (1, 2, 3, 4)]
    assert {json.dumps(kwargs) for _, kwargs in sent} == {json.dumps({"p": [1, "two"], "plain": 3})}
    message = StoredMessage.from_envelope(h.sent.delivered[-1].envelope)
    assert f"'fixed', {start + 4}" in message.headers["argsrepr"], "its repr is the evaluated one's"


def test_a_forwarder_without_the_app_waits_and_sends_nothing(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(T0, {"lazy": LAZY})  # its PeriodicTarget has no app: `delayq forward --celery-broker`
    h.sync()
    h.clock.set((MS0 + 10_000) / 1000)
    with caplog.at_level(logging.ERROR, logger="delayq.forwarder"):
        h.forwarder.run_once()
    assert h.sent.delivered == []
    item = h.store.get(item_id("lazy"))
    assert item is not None and item.attempts == 0 and h.store.dead_letters() == [], "it waits, no attempt counted"
    assert item.leased_until_ms is not None and item.leased_until_ms > MS0 + 10_000
    assert "celery -A proj delayq forward" in caplog.text and "BeatLazyFunc" in caplog.text
    # the same entry, fired by a forwarder with the app, runs: nothing was lost
    h.periodic = PeriodicTarget(h.sent, app=h.app)
    h.forwarder = TestingForwarder(h.store, [h.sent, h.periodic])
    h.clock.set(item.leased_until_ms / 1000)
    h.forwarder.run_once()
    assert len(h.sent.delivered) == 1


def test_a_lazy_function_that_raises_makes_the_entry_wait_not_die(caplog: pytest.LogCaptureFixture) -> None:
    h = _with_app({"b": {"task": "t.b", "schedule": 10.0, "args": [BeatLazyFunc(lazy_values.broken)]}})
    h.sync()
    h.clock.set((MS0 + 10_000) / 1000)
    with caplog.at_level(logging.ERROR, logger="delayq.forwarder"):
        h.forwarder.run_once()
    assert h.sent.delivered == [] and "the lazy function failed" in caplog.text
    item = h.store.get(item_id("b"))
    assert item is not None and item.attempts == 0 and h.store.dead_letters() == []


def test_a_function_the_app_does_not_name_is_never_called() -> None:
    """A hand write in the store cannot make a forwarder call any function it likes."""
    h = _with_app({})
    conf = {"task": "t.x", "schedule": 10.0, "args": [BeatLazyFunc(lazy_values.counter)]}
    ops.upsert(h.store, entry_spec(h.app, "x", conf))  # a runtime entry: not in beat_schedule
    before = lazy_values.counter()
    h.fire_next("x")
    assert h.sent.delivered == [] and lazy_values.counter() == before + 1, "not called"
    h.app.conf.delayq_lazy_functions = ["tests.test_celery.lazy_values:counter"]
    h.periodic = PeriodicTarget(h.sent, app=h.app)
    h.forwarder = TestingForwarder(h.store, [h.sent, h.periodic])
    item = h.store.get(item_id("x"))
    assert item is not None and item.leased_until_ms is not None  # waiting, after the refusal
    h.clock.set(item.leased_until_ms / 1000)
    h.forwarder.run_once()
    assert len(h.sent.delivered) == 1


def test_a_lazy_entry_is_stored_in_the_format_older_forwarders_leave_alone_and_listed_with_placeholders() -> None:
    h = _with_app({"lazy": LAZY})
    h.sync()
    item = h.store.get(item_id("lazy"))
    assert item is not None and item.envelope[2] == ENTRY_FORMAT_VERSION
    view = task_view(Envelope.decode(item.envelope))
    assert view is not None and view.args[1] == "<evaluated per run: tests.test_celery.lazy_values:counter()>"
    assert h.sync().unchanged == ["lazy"], "an unchanged lazy entry syncs as unchanged"
    h.fire_next("lazy")  # its rearm keeps the format
    item = h.store.get(item_id("lazy"))
    assert item is not None and item.envelope[2] == ENTRY_FORMAT_VERSION


def test_a_damaged_lazy_marker_is_dead_lettered_never_sent_with_its_placeholders() -> None:
    h = _with_app({"lazy": LAZY})
    h.sync()
    item = h.store.get(item_id("lazy"))
    assert item is not None
    envelope = Envelope.decode(item.envelope)
    damaged = replace(envelope, meta={**envelope.meta, LAZY_META: "{not json"}).encode_entry()
    assert h.store.replace_if(item_id("lazy"), item.envelope, T0, damaged).value == "replaced"
    h.fire_next("lazy")
    assert h.sent.delivered == []
    [dead] = h.store.dead_letters()
    assert dead.id == item_id("lazy") and "BeatLazyFunc arguments cannot be read" in dead.error


def _refused(value: Any) -> str:
    h = Harness(T0, {})
    with pytest.raises(PeriodicError) as caught:
        entry_spec(h.app, "bad", {"task": "t", "schedule": 1.0, "args": [value]})
    return str(caught.value)


def test_lambdas_closures_and_unimportable_functions_are_refused_naming_the_fix() -> None:
    def local() -> int:
        return 1

    for value in (BeatLazyFunc(lambda: 1), BeatLazyFunc(local)):
        assert "top level of an importable module" in _refused(value)
    assert "JSON values" in _refused_with_plain(object())
    h = Harness(T0, {})
    with pytest.raises(PeriodicError, match="inside the args list"):
        entry_spec(h.app, "bad", {"task": "t", "schedule": 1.0, "args": BeatLazyFunc(lazy_values.counter)})


def _refused_with_plain(plain: Any) -> str:
    h = Harness(T0, {})
    conf = {"task": "t", "schedule": 1.0, "args": [BeatLazyFunc(lazy_values.counter), plain]}
    with pytest.raises(PeriodicError) as caught:
        entry_spec(h.app, "bad", conf)
    return str(caught.value)


def test_builtin_and_classmethod_functions_are_stored_by_path() -> None:
    import time
    from datetime import datetime as dt

    h = Harness(T0, {})
    for func, path in ((time.time, "time:time"), (dt.now, "datetime:datetime.now")):
        spec = entry_spec(h.app, "ok", {"task": "t", "schedule": 1.0, "kwargs": {"at": BeatLazyFunc(func)}})
        assert path in spec.template.envelope.meta["lazy"]


def test_lazy_parts_reads_celerys_beat_lazy_func() -> None:
    """Pins the one contact with BeatLazyFunc's private attributes."""
    assert lazy_parts(BeatLazyFunc(lazy_values.pair, 1, b=2)) == (lazy_values.pair, (1,), {"b": 2})
