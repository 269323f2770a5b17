"""Fire lateness of periodic entries when each round trip to the store is slow (a busy machine,
where every wait for a reply is also a wait for the CPU): a claim's entries are rearmed in one
round trip and their runs recorded in one more, not two per entry, so entries falling due
together are fired within a few round trips of their period.

Before, the pass of a claim of n entries cost 2n round trips (rearm, then history, per entry);
the benchmark at 278 fires/s on 2 loaded cores showed passes of 13 entries taking ~470 ms, and
the entries falling due meanwhile waiting for them (p99 117-276 ms, max ~1 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from redis.connection import Connection

from delayq_backends import DelayStore
from delayq_backends.celery.periodic import PeriodicTarget, entry_spec
from delayq_backends.forwarder import Forwarder
from delayq_backends.periodic import ops
from delayq_backends.periodic.history import read_histories
from delayq_backends.targets import Delivery
from delayq_backends.testing import CollectingTarget
from tests.harness import make_store
from tests.helpers import wait_for

#: what each round trip to the store costs the forwarder here
ROUND_TRIP_S = 0.02
ENTRIES = 30


@pytest.fixture
def slowed(valkey_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A URL of the server whose clients wait :data:`ROUND_TRIP_S` more on each round trip
    (each command or pipeline sent); other clients are as fast as ever."""
    real = Connection.send_packed_command

    def send_packed_command(self: Connection, *args: Any, **kwargs: Any) -> None:
        if self.client_name == "slowed":
            time.sleep(ROUND_TRIP_S)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Connection, "send_packed_command", send_packed_command)
    return f"{valkey_url}?client_name=slowed"


class Landed(CollectingTarget):
    """Collects runs, stamping when each entry's first run arrived (epoch ms)."""

    def __init__(self) -> None:
        super().__init__("celery", self._stamp)
        self.first: dict[str, tuple[int, float]] = {}  # entry item -> (its period, landed ms)

    def _stamp(self, d: Delivery) -> None:
        entry, _, _ = d.id.partition("#")  # a run's id: <entry item id>#<task id>
        self.first.setdefault(entry, (d.ready_ms, time.time() * 1000))


@pytest.fixture
def forwarding(valkey_url: str, slowed: str, prefix: str) -> Iterator[tuple[DelayStore, Landed]]:
    """A forwarder of Celery entries on a slowed store, running in a thread, listening."""
    landed = Landed()
    store = make_store(slowed, prefix, shards=1)
    forwarder = Forwarder(store, [landed, PeriodicTarget(landed)])
    thread = threading.Thread(target=forwarder.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    probe = make_store(valkey_url, prefix, shards=1)
    wait_for(lambda: probe.client.pubsub_numsub(probe.wake_channel)[0][1] > 0, 10, "the forwarder listening")
    yield make_store(valkey_url, prefix, shards=1), landed
    forwarder.stop()
    thread.join(10)


def test_entries_due_together_fire_within_a_few_round_trips(forwarding: tuple[DelayStore, Landed]) -> None:
    store, landed = forwarding
    app = Celery("late", broker="memory://", set_as_current=False)
    names = [f"tick{i:02d}" for i in range(ENTRIES)]
    for name in names:  # each first due 1 s after it is added: one every 10 ms
        assert ops.upsert(store, entry_spec(app, name, {"task": "t.tick", "schedule": 1.0})) == "added"
        time.sleep(0.01)
    items = [ops.item_id(n) for n in names]
    wait_for(lambda: set(landed.first) >= set(items), 10, "every entry's first run")
    lateness = sorted(at - due for due, at in (landed.first[i] for i in items))
    # the firing that paid 2 round trips per entry of a claim (after its publish): 116-751 ms
    # late, the entries falling due during a pass waiting for its rearms; now 32-253 ms
    assert lateness[-1] < 25 * ROUND_TRIP_S * 1000, lateness

    def recorded() -> bool:  # after the rearm, which follows the publish
        return all(h.runs and h.runs[-1].published_ms is not None for h in read_histories(store, names))

    wait_for(recorded, 10, "every entry's runs in its history")
