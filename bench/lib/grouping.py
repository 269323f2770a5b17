"""Groups for the benches, on whichever code they measure, and the drain of a group at its limit.

Issue 31 names the API ``envelope.Group`` / ``with_groups`` and ``DelayStore.set_group``; the code
before it has the concurrency slot they alias (``Slot`` / ``with_slot``, ``set_slot_limit``). The
benches write through :func:`grouped` and :func:`set_policy`, so the same bench measures the code
before groups (the "before") and after. A weight has no alias: on the code before, :data:`API` is
``"slot"`` and a weighted group runs unweighted (the benches say so in their output).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from delayq_backends import DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget

from .items import OUT_LIST
from .server import BenchServer

__all__ = ["API", "Drain", "drain", "grouped", "set_policy"]

try:  # issue 31's names
    from delayq_backends.envelope import Group, with_groups  # type: ignore[attr-defined]

    API = "group"
except ImportError:  # the code before: the slot API they alias
    from delayq_backends.envelope import Slot, with_slot

    API = "slot"


def grouped(env: Envelope, key: str, *, limit: int | None = None, weight: float | None = None) -> Envelope:
    """``env`` carrying group ``key`` (its own ``limit`` and ``weight``, None: none)."""
    if API == "group":
        return with_groups(env, (Group(key, limit=limit, weight=weight),))  # type: ignore[no-any-return]
    return with_slot(env, Slot(key, limit))


def set_policy(store: DelayStore, key: str, **policy: Any) -> None:
    """Set ``key``'s runtime policy (``limit``, ``weight``) through ``set_group``; on the code
    before, its limit through ``set_slot_limit`` (a weight is dropped there: it has no alias)."""
    if API == "group":
        store.set_group(key, **policy)  # type: ignore[attr-defined]
    elif "limit" in policy:
        store.set_slot_limit(key, policy["limit"])


class Drain(NamedTuple):
    """A drain's items/s, and the most items released and not yet ended at once: a limit's
    drain means nothing unless this stayed within the limit."""

    rate: float
    most_running: int


def drain(server: BenchServer, n: int, load: Callable[[DelayStore], None], key: str | None) -> Drain:
    """A forwarder thread releasing ``n`` items that ``load`` schedules (all of group ``key``,
    None: ungrouped) into :data:`OUT_LIST` while a worker thread pops each and at once ends it:
    gives its slot back (``give_back_slots``, the forwarder's give-back: a Redis list carries no
    token for a worker's report), so the group's next item may go. Running at a pop: the items
    still in the list, and the one popped (ended just after)."""
    server.wipe()
    store = server.store()
    load(store)
    client = server.connect()
    forwarder = Forwarder(server.store(client=client), [RedisListTarget(client)], poll_interval=0.05)
    runner = threading.Thread(target=forwarder.run, kwargs={"install_signals": False}, daemon=True)
    worker = server.connect()
    most = 0
    start = time.perf_counter()
    runner.start()
    try:
        for _ in range(n):
            popped, waited = None, time.monotonic()
            while popped is None and time.monotonic() - waited < 60:
                popped = worker.blpop([OUT_LIST], timeout=1)  # under the client's 5 s socket timeout
            if popped is None:
                raise RuntimeError("no item reached the list in 60 s")
            most = max(most, int(worker.llen(OUT_LIST)) + 1)
            if key is not None:
                store.give_back_slots({key: [json.loads(popped[1])["id"]]})
        return Drain(n / (time.perf_counter() - start), most)
    finally:
        forwarder.stop()
        runner.join(30)
