"""Concurrency slots: at most N items of a key run at once, across every worker.

An item scheduled with a slot (``schedule(..., slot="customer-42")``, ``{"key": ..., "limit":
N}``; Celery's ``delayq_slot`` header, RQ's ``delayq_slot=``) is released by a forwarder only
while fewer than the key's limit of its items hold a slot (:mod:`delayq_backends.forwarder.slots`);
the others wait in the store, in line by rank then ready time, and other keys flow.

A slot is a **lease**, one member of the key's ``holds`` set scored with the time it lapses,
written by forwarders only:

- taken by the forwarder at release with a fresh random token (its SHA-1 kept beside the hold,
  the token itself passed in the item's message: Celery header ``delayq_slot_token``, RQ job
  hash field ``delayq_slot_token``), held for the start window
  (:data:`~delayq_backends.store.START_HOLD_MS`, 60 s, the forwarder's ``slot_start_window``);
- reported started by the worker (:class:`SlotGuard`), which holds it
  :data:`~delayq_backends.store.RUN_HOLD_MS` (60 s) from then, beating every third of that while
  the task runs, so a long task keeps it (at most :data:`~delayq_backends.store.MAX_HOLD_MS`
  from now per report, whatever a worker asks);
- reported ended when the task ends (success, failure, a retry, a revoke): the head of the key's
  line is brought forward and takes the slot within a pass.

A worker's reports are HSETs into the key's ``reports`` hash, checked by the next take against
the hold's token: a report without it (another worker's member, a forged one) changes nothing.
So a key never stays blocked (a worker that dies mid-task gives its slot back at most 60 s after
its last beat; a message lost or never read, after the start window), a worker credential can
neither end nor extend a hold it was not given, and a second copy never gets in while the first
holds the slot (a forwarder that re-releases a held item keeps that one slot, under the new
token and the one before: either copy may report it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .envelope import Group, Slot, fold_groups, parse_groups
from .errors import DelayqError, InvalidGroupPolicyError
from .store import MAX_HOLD_MS, RUN_HOLD_MS, DelayStore, SlotRun

__all__ = ["SlotGuard", "held_groups"]

log = logging.getLogger("delayq.slots")


def held_groups(named: Any, slot: Slot | None, where: str) -> tuple[Group, ...]:
    """The groups a worker holds while a task runs: those its message names (``named``, a
    ``delayq_group`` header or job meta; None: none), then its slot, folded as
    :func:`~delayq_backends.envelope.groups_of` folds them from the stored envelope. Groups that
    are none are logged (as ``where``: which task, which field) and left out: the task runs."""
    found: list[Group] = []
    if named is not None:
        try:
            found += parse_groups(named)
        except DelayqError as exc:
            log.warning("%s: %s", where, exc)
    return fold_groups(found if slot is None else [*found, Group.parse(slot)])


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
        self._held: Counter[tuple[str, SlotRun]] = Counter()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._beat: threading.Thread | None = None

    def start(self, keys: Sequence[str], run: SlotRun) -> None:
        """Hold the slot of ``run`` in each of ``keys`` (its groups) from now: its task starts.
        One round trip for all of them."""
        if not run.token:
            log.info(
                "groups %r: %s carries no slot token (released by an earlier forwarder): its hold is "
                "reported tokenless, which counts only for a hold granted without one",
                list(keys),
                run.member,
            )
        with self._lock:
            for key in keys:
                self._held[(key, run)] += 1
            if self._beat is None:
                self._beat = threading.Thread(target=self._beat_loop, name="delayq-slot-beat", daemon=True)
                self._beat.start()
        self._send({key: [run] for key in keys}, "start")

    def end(self, keys: Sequence[str], run: SlotRun) -> None:
        """Give back the slot of ``run`` in each of ``keys``: its task ended (or never will run)."""
        with self._lock:
            for key in keys:
                self._held[(key, run)] -= 1
                if self._held[(key, run)] <= 0:
                    del self._held[(key, run)]
        self._send({key: [run] for key in keys}, "end")

    def throttle(self, key: str, run: SlotRun, seconds: float) -> None:
        """Stop group ``key`` releasing for ``seconds`` (at most an hour) at every forwarder:
        reported on ``run``'s hold, so it counts only while this process holds that slot with
        its token (the next take folds it into the group's policy). Items already released run;
        the ones that wait are not counted as attempts.

        Raises:
            InvalidGroupPolicyError: ``seconds`` not in (0, 3600]; nothing was reported.
        """
        ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not ok or not 0 < seconds <= MAX_HOLD_MS / 1000:
            raise InvalidGroupPolicyError(
                f"group {key!r}: throttle for {seconds!r} s: use seconds > 0 and <= {MAX_HOLD_MS // 1000}"
            )
        self._send({key: [run]}, "throttle", hold_ms=round(seconds * 1000))

    def held(self) -> dict[str, list[SlotRun]]:
        """The runs this process holds, by key."""
        with self._lock:
            by_key: dict[str, list[SlotRun]] = {}
            for key, run in self._held:
                by_key.setdefault(key, []).append(run)
            return by_key

    def close(self) -> None:
        """Stop the heartbeat (the holds lapse unless ended)."""
        self._wake.set()

    def _beat_loop(self) -> None:
        while not self._wake.wait(self.hold_ms / 3000):
            held = self.held()
            if held:
                self._send(held, "beat")

    def _send(self, holds: dict[str, list[SlotRun]], mode: str, *, hold_ms: int | None = None) -> None:
        ms = self.hold_ms if hold_ms is None else hold_ms
        try:
            replies: dict[str, Exception | None] = dict(self.store.hold_slots(holds, mode, hold_ms=ms))
        except (RedisError, DelayqError, OSError) as exc:
            replies = {key: exc for key in holds}
        for key, reply in replies.items():
            if reply is not None:
                members = [run.member for run in holds[key]]
                log.warning("slot %r: %s of %s failed (%s); the hold lapses by itself", key, mode, members, reply)
