"""One clock: the store's (``store.clock``), read by its forwarders, leases, periodic firing and
targets; a test's fake clock is given to the store once and reaches all of them.

These fail if a second clock comes back: a reader building its own, a ``clock=`` of its own, or a
new module reading the host's wall clock without saying why.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import delayq_backends
from delayq_backends import timeutil
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.periodic.firing import FiringTarget
from delayq_backends.store import DelayStore
from delayq_backends.targets import Delivery
from delayq_backends.testing import (
    CollectingTarget,
    FakeClock,
    TestingForwarder,
    advance_and_run,
    run_due,
    testing_store,
)
from delayq_backends.timeutil import CLOCK_RESAMPLE_S, ServerClock

PACKAGE = Path(delayq_backends.__file__).parent
FAR = datetime(2031, 6, 1, tzinfo=timezone.utc)  # years from the real clock: no other clock reads it


def test_the_forwarder_and_every_stage_hold_the_stores_clock_instance() -> None:
    clock = FakeClock(FAR)
    store = testing_store(shards=2, clock=clock)
    forwarder = Forwarder(store, [CollectingTarget("mail")])
    readers = {
        "forwarder": forwarder.clock,
        "context": forwarder.pass_.ctx.clock,
        "loop": forwarder.loop.ctx.clock,
        "heartbeat": forwarder.heartbeat.now_ms,
        "shard back-off": forwarder.shards.clock,
        "release step": forwarder.lines.clock,
    }
    assert {name: reader is clock for name, reader in readers.items()} == dict.fromkeys(readers, True)
    assert forwarder.server_now_ms() == store.lease(0).now_ms() == clock.ms


def test_a_real_store_makes_one_server_clock_its_forwarder_reads(store: DelayStore) -> None:
    assert isinstance(store.clock, ServerClock)
    assert Forwarder(store, [CollectingTarget("mail")]).clock is store.clock
    before = store.server_time_ms()
    assert before <= store.clock() <= store.server_time_ms() + 1000  # never behind the server


def _boom(_: Delivery) -> None:
    raise RuntimeError("refused")


def test_a_fake_clock_given_once_reaches_the_forwarder_the_firing_and_the_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Years from the real clock, each reader's "now" is the fake one: the forwarder's retry time,
    the periodic firing's misfire "now", the RQ target's (through the lease)."""
    pytest.importorskip("rq")
    from delayq_backends.rq import RQTarget
    from delayq_backends.rq.entries import RQRuns

    clock = FakeClock(FAR)
    store = testing_store(shards=1, clock=clock)
    seen: dict[str, int] = {}

    def noted(name: str, read: Any) -> Any:
        def wrapper(self: Any, *args: Any) -> Any:
            seen[name] = args[-1] if name == "firing" else read(self, *args)
            return read(self, *args)

        return wrapper

    monkeypatch.setattr(FiringTarget, "_prepare", noted("firing", FiringTarget._prepare))
    monkeypatch.setattr(RQTarget, "_now_ms", noted("rq target", RQTarget._now_ms))
    for item, kind in (("mail-1", "mail"), ("rq-1", "rq"), ("entry-1", "rq-periodic")):
        store.schedule(item, clock.now(), Envelope(target=kind, destination="q", body=b"x"))
    rq = RQTarget(store.client)
    firing = FiringTarget(RQRuns(), rq)

    run_due(store, [CollectingTarget("mail", _boom), rq, firing], retry_delay=5.0)

    assert seen == {"firing": clock.ms, "rq target": clock.ms}
    retried = store.get("mail-1")
    assert retried is not None and retried.ready_ms == clock.ms + 5000  # the forwarder's retry_at


def test_no_reader_takes_a_clock_of_its_own() -> None:
    """The fake clock is given in one place, the store: none of these has a ``clock=`` beside it."""
    for reader in (Forwarder, TestingForwarder, FiringTarget, run_due, advance_and_run):
        assert "clock" not in inspect.signature(reader).parameters, reader


def test_advance_and_run_moves_the_stores_clock() -> None:
    clock = FakeClock(FAR)
    store = testing_store(shards=1, clock=clock)
    store.schedule("a", clock.ms / 1000 + 60, Envelope(target="mail", destination="q", body=b"x"))
    assert [d.id for d in advance_and_run(store, 60, CollectingTarget("mail"))] == ["a"]
    assert clock.ms == timeutil.to_ms(FAR) + 60_000


class _Server:
    """A server clock that moves only when told, counting its readings."""

    def __init__(self) -> None:
        self.ms, self.reads = 1_000_000, 0

    def __call__(self) -> int:
        self.reads += 1
        return self.ms


@pytest.fixture
def mono(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    now = [100.0]
    monkeypatch.setattr(timeutil.time, "monotonic", lambda: now[0])
    yield now


def test_the_server_clock_reads_the_server_once_a_resample_and_follows_it(mono: list[float]) -> None:
    server = _Server()
    clock = ServerClock(server)
    assert (clock(), server.reads) == (1_000_000, 1)
    mono[0] += 1.5
    server.ms += 1_500
    assert (clock(), server.reads) == (1_001_500, 1)  # advanced by the monotonic clock, not read
    mono[0] += CLOCK_RESAMPLE_S
    server.ms += int(CLOCK_RESAMPLE_S * 1000) + 250  # the server's clock ran 250 ms ahead meanwhile
    assert (clock(), server.reads) == (server.ms, 2)  # re-read: the drift is gone


def test_a_reading_that_waited_sets_no_lead_when_a_quick_one_follows(mono: list[float]) -> None:
    """The clock counts from when a reading was asked: a reading that waited 50 ms (a busy core)
    would make it lead the server by 50 ms for a minute, and a forwarder wake before its items are
    due and claim nothing (a spin). It keeps the shortest of a few round trips instead."""
    waits = [0.05]  # the first round trip waits 50 ms, the next none

    def server_ms() -> float:
        return 1_000_000 + (mono[0] - 100.0) * 1000

    def read() -> float:
        mono[0] += waits.pop() if waits else 0.0
        return server_ms()

    clock = ServerClock(read)
    assert 0 <= clock() - server_ms() <= 1


# -- no second clock in the source ------------------------------------------------------------

#: The modules that read the host's wall clock, and why that, not the store's clock, is right there.
WALL_CLOCK_READERS = {
    "timeutil.py": "now_ms(): the host's clock, for what has no store (a FakeClock's start)",
    "audit.py": "an audit file's name, on the host that writes it",
    "celery/audit.py": "a worker's executed record: the worker has no store",
    "rq/audit.py": "a worker's executed record: the worker has no store",
    "celery/watch.py": "a worker's heartbeat, written by the worker and judged by its peers' clocks",
    "rq/watch.py": "a worker's heartbeat, written by the worker and judged by its peers' clocks",
    "dedupe.py": "when a lock was taken, for a reader (the lock's expiry is the server's PX)",
    "celery/message.py": "a message's expiration left, in the frame of the worker that judges expires",
    "celery/target.py": "a message's expiration left, in the frame of the worker that judges expires",
    "rq/target.py": "an RQ job's enqueued_at, beside the started_at its RQ worker writes",
    "rq/enqueue.py": "an RQ job's enqueued_at, beside the started_at its RQ worker writes",
    "rq/entries.py": "an RQ job's created_at/enqueued_at, beside the started_at its RQ worker writes",
    "rq/failed.py": "an RQ job's failure time in RQ's FailedJobRegistry, as RQ writes it",
    "rq/queue.py": "RQ's enqueue_in: RQ's API counts from the host's clock",
    "rq/batches.py": "RQ's enqueue_in for batches: RQ's API counts from the host's clock",
    "rq/scheduler.py": "rq-scheduler's API counts from the host's clock (freezegun moves it in tests)",
    "spark/audit.py": "an offline audit's default as_of: no store is read",
}


def _reads_wall_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Attribute):
        return False
    owner = node.value
    name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
    return (name, node.attr) in {("time", "time"), ("time", "time_ns"), ("datetime", "now"), ("datetime", "utcnow")}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def test_only_the_modules_that_say_why_read_the_wall_clock() -> None:
    readers = {name for name, tree in _modules() if any(_reads_wall_clock(n) for n in ast.walk(tree))}
    assert readers == set(WALL_CLOCK_READERS)


def test_one_clock_class_made_in_one_place() -> None:
    """``ServerClock`` is built only by the store; the only other clock class is the test's fake."""
    clocks = {
        f"{name}:{n.name}"
        for name, tree in _modules()
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name.endswith("Clock")
    }
    assert clocks == {"timeutil.py:ServerClock", "testing.py:FakeClock"}
    made = {
        name
        for name, tree in _modules()
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "ServerClock"
    }
    assert made == {"store/base.py"}
