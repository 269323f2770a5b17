"""Sweeps: passes until nothing claimed is full, the next claim overlapping the current publish."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ..models import Claim
from .passes import Claimed, Pass

__all__ = ["Sweeper"]

log = logging.getLogger("delayq.forwarder")


class Sweeper:
    """Runs passes over the due shards until no claim comes back full.

    With ``overlap``, two stages: while the publisher thread publishes and settles pass *n*, one
    claimer thread claims pass *n+1* from the shards whose claim *n* came back full, so a
    forwarder's throughput approaches the slower of client and server, not their sum. At most
    one pass is claimed ahead; the heartbeat holds its leases from its claim. Per shard, the
    order is kept: claim *n+1* takes the items after those leased by claim *n*, and is published
    after it. A claim ahead is delivered even after a stop (it is in flight); a crash loses
    nothing (its leases expire); if delivering pass *n* raises (an outage), the claim ahead is
    given back (released, no attempt counted) before the error goes up to the loop.
    """

    def __init__(self, pass_: Pass, stop: threading.Event, overlap: bool) -> None:
        self.pass_ = pass_
        self.stop = stop
        self.overlap = overlap
        self._claimer: ThreadPoolExecutor | None = None

    def sweep(self, due: list[int]) -> int:
        """The items claimed while passes ran from ``due`` on."""
        if not self.overlap:
            claimed = 0
            while due and not self.stop.is_set():
                got, due = self.pass_.run(due)
                claimed += got
            return claimed
        return self._overlapped(due)

    def _overlapped(self, due: list[int]) -> int:
        if not due or self.stop.is_set():
            return 0
        if self._claimer is None:
            self._claimer = ThreadPoolExecutor(1, thread_name_prefix="delayq-claimer")
        claimed = 0
        current: Claimed | None = self.pass_.claim(due)
        while current is not None:
            more = current.more()
            ahead = self._claimer.submit(self.pass_.claim, more) if more and not self.stop.is_set() else None
            try:
                got, _ = self.pass_.deliver(current)
            except BaseException:
                if ahead is not None:
                    self._give_back(ahead)
                raise
            claimed += got
            current = None if ahead is None else ahead.result()
        return claimed

    def _give_back(self, ahead: Future[Claimed]) -> None:
        """Release a claim made ahead of a pass that failed; if that fails too, its leases expire."""
        try:
            claimed = ahead.result()
        except Exception:
            return
        self.pass_.heartbeat.drop(claimed.held)
        for _, claim in claimed.claims:
            if isinstance(claim, Claim) and claim.items:
                try:
                    self.pass_.store.release(claim)
                except Exception as exc:
                    log.warning("shard %d: cannot give back a claim made ahead (%s); its lease will expire",
                                claim.shard, exc)  # fmt: skip

    def close(self) -> None:
        if self._claimer is not None:
            self._claimer.shutdown(wait=True)
            self._claimer = None
