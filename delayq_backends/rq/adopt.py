"""The forwarder's watch over RQ's own ``rq:scheduled:<queue>`` registries.

A worker or ``rq enqueue --schedule-in`` run without ``--queue-class delayq_backends.rq.Queue``
schedules into RQ's registry, which only an RQ scheduler moves: without one the job would
stall silently. ``delayq forward --rq-redis`` runs a :class:`RegistryAdopter` (on by default;
``--no-rq-adopt`` turns it off), which every ``interval`` seconds moves such entries into the
store (:func:`~delayq_backends.rq.migrate.adopt`: no ``meta`` read, nothing deserialized) and
logs a warning naming the queue, so the misconfigured process can be found and fixed.
"""

from __future__ import annotations

import logging
import threading

import redis

from ..store import DelayStore
from .migrate import adopt

__all__ = ["RegistryAdopter"]

log = logging.getLogger("delayq.rq")


class RegistryAdopter:
    """A daemon thread adopting stray ``rq:scheduled:*`` entries every ``interval`` seconds.

    Any number of forwarders may run one: adopting is idempotent (the store keeps an id it
    has; the registry entry is turned into a mirror entry only if still there).
    """

    def __init__(self, connection: redis.Redis, store: DelayStore, *, interval: float = 1.0) -> None:
        self.connection = connection
        self.store = store
        self.interval = interval
        self._closed = threading.Event()
        self._skipped: set[str] = set()  # keys of another type, each said once
        self._thread = threading.Thread(target=self._run, name="delayq-rq-adopt", daemon=True)

    def start(self) -> RegistryAdopter:
        self._thread.start()
        return self

    def adopt_once(self) -> int:
        """Adopt what is there now; returns how many jobs were added to the store."""
        report = adopt(self.connection, self.store)
        for key, count in report.moved.items():
            log.warning(
                "adopted %d job(s) from RQ's %s: a process scheduled them without "
                "--queue-class delayq_backends.rq.Queue (run workers and `rq enqueue` with it)",
                count,
                key,
            )
        for key, members in report.garbage.items():
            log.warning(
                "removed %d entr%s from RQ's %s that are no job id (%s): written by another tool",
                len(members), "y" if len(members) == 1 else "ies", key, ", ".join(repr(m[:40]) for m in members[:3]),
            )  # fmt: skip
        for key, why in report.skipped.items():
            if key not in self._skipped:
                self._skipped.add(key)
                log.error("skipped RQ's %s: %s", key, why)
        return report.total_moved

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self.adopt_once()
            except Exception as exc:  # a Redis blip must not end the watch
                log.error("adopting rq:scheduled:* entries failed (%s: %s); retrying", type(exc).__name__, exc)
            self._closed.wait(self.interval)
