"""The lease heartbeat: claimed batches stay ours from claim to settle, however long they take."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..models import Claim
from ..store import DelayStore

__all__ = ["Heartbeat", "HeldLease"]

log = logging.getLogger("delayq.forwarder")


class HeldLease:
    """A claim in hand: until when its items are ours (moved by extensions), and the ids found no
    longer ours (acked, cancelled, or claimed again after the lease ran out). Only
    :meth:`Heartbeat.extend` changes it, from the heartbeat's thread or the pass's."""

    def __init__(self, store: DelayStore, claim: Claim) -> None:
        self.store = store
        self.claim = claim
        self.deadline_ms = claim.deadline_ms
        self.lost: frozenset[str] = frozenset()

    @property
    def shard(self) -> int:
        return self.claim.shard


class Heartbeat:
    """Keeps batches' items ours from claim to ack: a thread of the forwarder looks at the
    batches in hand (those of the pass being published, and of the one claimed ahead of it) every
    sixth of the lease, and extends a lease (``extend.lua``) once less than half of it is left.
    A batch acked sooner (almost all) costs nothing: no lock and no wake-up per batch.

    Why extend rather than give the batch back: a publish that runs long (a RabbitMQ memory
    alarm blocking confirms, a slow broker) has often reached the broker already; giving the
    batch back would let another forwarder publish it again. Extending keeps it exclusive as
    long as this forwarder is alive; a forwarder that is stopped (SIGSTOP, a long GC pause)
    stops extending too, so its items are taken over after the lease, and on waking it finds
    them gone (the pass's check before each publish) and publishes nothing twice.
    """

    def __init__(self, lease_ms: int, now_ms: Callable[[], int]) -> None:
        self.lease_ms = lease_ms
        self.now_ms = now_ms
        self.every = lease_ms / 6000
        self._closed = threading.Event()
        self._holdings: list[list[HeldLease]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self) -> list[HeldLease]:
        """A list whose leases are extended (if they run long) until :meth:`drop`; several may
        be held at once (a pass, and the one claimed ahead of it)."""
        held: list[HeldLease] = []
        with self._lock:
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._run, name="delayq-lease-heartbeat", daemon=True)
                self._thread.start()
            self._holdings.append(held)
        return held

    def drop(self, held: list[HeldLease]) -> None:
        """Stop extending the leases of ``held`` (they are settled)."""
        with self._lock:
            self._holdings = [h for h in self._holdings if h is not held]

    def extend(self, held: HeldLease) -> None:
        """Extend every item of ``held`` still ours; the others are added to ``held.lost``."""
        extension = held.store.extend(held.claim, lease_ms=self.lease_ms)
        held.lost = held.lost | ({item.id for item in held.claim.items} - set(extension.held))
        held.deadline_ms = extension.deadline_ms

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._closed.wait(self.every):
            with self._lock:
                in_hand = [held for holding in self._holdings for held in holding]
            for held in in_hand:
                if held.deadline_ms - self.now_ms() > self.lease_ms // 2:
                    continue
                try:
                    self.extend(held)
                except Exception as exc:  # the publish goes on; the pre-publish check gives back what is lost
                    log.warning("shard %d: cannot extend a lease (%s: %s)", held.shard, type(exc).__name__, exc)
