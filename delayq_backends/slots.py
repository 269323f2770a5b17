"""Concurrency slots: at most N items of a key run at once, across every worker.

An item scheduled with a slot (``schedule(..., slot="customer-42")``, ``{"key": ..., "limit":
N}``; Celery's ``delayq_slot`` header, RQ's ``delayq_slot=``) is released by a forwarder only
while fewer than the key's limit of its items hold a slot (:mod:`delayq_backends.forwarder.slots`);
the others wait in the store, in line by rank then ready time, and other keys flow.

A slot is a **lease**, one member of the key's ``holds`` set scored with the time it lapses:

- taken by the forwarder at release, held :data:`~delayq_backends.store.START_HOLD_MS` (5 min)
  for the message to reach a worker;
- held by the worker (:class:`SlotGuard`) from the task's start for
  :data:`~delayq_backends.store.RUN_HOLD_MS` (60 s), extended by a heartbeat every third of
  that while the task runs, so a long task keeps it;
- given back when the task ends (success, failure, a retry, a revoke), and passed at once to
  the head of the key's line, whose item is brought forward (so the key runs at its limit).

So a key never stays blocked (a worker that dies mid-task gives its slot back at most 60 s after
its last beat; a message lost before any worker started it, after 5 min), and a second copy
never gets in while the first holds the slot (a forwarder that re-releases a held item finds its
member held and keeps that one slot).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter

from redis.exceptions import RedisError

from .errors import DelayqError
from .store import RUN_HOLD_MS, DelayStore

__all__ = ["SlotGuard"]

log = logging.getLogger("delayq.slots")


class SlotGuard:
    """A worker process's slot holds: started with a task, beaten while it runs, ended with it.

    A store error is logged and the task goes on: the hold lapses by itself (a crash must not
    block a key, and neither may a store outage stop a worker).

    Args:
        store: the delay store whose slot keys the forwarders take.
        hold_ms: how long a hold lasts after its start or last beat (a beat every third of it).
    """

    def __init__(self, store: DelayStore, *, hold_ms: int = RUN_HOLD_MS) -> None:
        self.store = store
        self.hold_ms = hold_ms
        #: the process that made the guard: a forked child makes its own (the beat thread is not inherited)
        self.pid = os.getpid()
        self._held: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._beat: threading.Thread | None = None

    def start(self, key: str, member: str) -> None:
        """Hold ``key``'s slot for ``member`` from now: its task starts."""
        with self._lock:
            self._held[(key, member)] += 1
            if self._beat is None:
                self._beat = threading.Thread(target=self._beat_loop, name="delayq-slot-beat", daemon=True)
                self._beat.start()
        self._send({key: [member]}, "start")

    def end(self, key: str, member: str) -> None:
        """Give back ``key``'s slot of ``member``: its task ended (or never will run)."""
        with self._lock:
            self._held[(key, member)] -= 1
            if self._held[(key, member)] <= 0:
                del self._held[(key, member)]
        self._send({key: [member]}, "end")

    def held(self) -> dict[str, list[str]]:
        """The members this process holds, by key."""
        with self._lock:
            by_key: dict[str, list[str]] = {}
            for key, member in self._held:
                by_key.setdefault(key, []).append(member)
            return by_key

    def close(self) -> None:
        """Stop the heartbeat (the holds lapse unless ended)."""
        self._wake.set()

    def _beat_loop(self) -> None:
        while not self._wake.wait(self.hold_ms / 3000):
            held = self.held()
            if held:
                self._send(held, "beat")

    def _send(self, holds: dict[str, list[str]], mode: str) -> None:
        try:
            replies = self.store.hold_slots(holds, mode, hold_ms=self.hold_ms)
        except (RedisError, DelayqError, OSError) as exc:
            replies = {key: exc for key in holds}
        for key, reply in replies.items():
            if isinstance(reply, Exception):
                log.warning("slot %r: %s of %s failed (%s); the hold lapses by itself", key, mode, holds[key], reply)
            elif reply < 0:
                log.warning("slot %r: its holds key is no sorted set (a hand write); the next release drops it", key)
            elif mode == "start" and reply < len(holds[key]):  # it runs all the same
                log.warning(
                    "slot %r: %s started without its slot held (its hold lapsed before this start: a "
                    "redelivery later than the slot hold, or a run sent around the store); the key "
                    "may run over its limit while it runs",
                    key,
                    holds[key],
                )
