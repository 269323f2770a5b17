"""Worker-side dedupe: one "started" record per run of an item, so a second delivery is dropped.

A forwarder killed between its publish and its ack publishes the item again once its lease
runs out: the broker then holds two messages of one task. Workers with dedupe on call
:meth:`RunGuard.start` just before running a delivery. The first start of a run writes
``<prefix>:{shard tag}:started:<run>:<id>`` with ``SET NX PX`` (see :meth:`ShardKeys.started
<delayq_backends.keys.ShardKeys.started>`); a later start of the same run finds it and is
dropped. A *run* is what the adapter says it is: Celery's ``retries`` count, so a retry (same
id, next run) still runs.

What it does not cover: a worker that dies *during* a run. Its broker re-delivers the message
(Celery's ``acks_late``); the adapters let such a re-delivery through, so that stays the
broker's at-least-once. If the store cannot be reached, the delivery runs (logged, counted as
``unchecked``): a duplicate is better than a lost task.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from enum import Enum

from prometheus_client import Counter
from redis.exceptions import RedisError

from .errors import DelayqError
from .store import DelayStore

__all__ = ["DEDUPE_OUTCOMES", "Decision", "RunGuard", "Verdict", "holder_name"]

log = logging.getLogger("delayq.dedupe")


class Verdict(Enum):
    """What :meth:`RunGuard.start` decided about one delivery."""

    #: the first start of this run: it is recorded, run it
    FIRST = "ran"
    #: this run was started before: drop the delivery
    DUPLICATE = "dropped"
    #: the store could not be asked: run it (at-least-once)
    UNCHECKED = "unchecked"


#: One counter in the process's default registry, so the application's own exporter (or
#: ``celery`` / ``rq`` metrics exporters) serves it beside theirs.
DEDUPE_OUTCOMES = Counter(
    "delayq_dedupe_deliveries",
    "Deliveries seen by worker-side dedupe, by outcome: ran (first start of a run), "
    "dropped (a duplicate, not run), unchecked (store unreachable, run anyway)",
    ["outcome"],
)


@dataclass(frozen=True)
class Decision:
    """The verdict on one delivery; ``first`` names the earlier start of a duplicate."""

    verdict: Verdict
    key: str = ""
    first: str | None = None

    @property
    def run(self) -> bool:
        """Whether the worker should run the delivery."""
        return self.verdict is not Verdict.DUPLICATE


def holder_name() -> str:
    """``host:pid``: who started a run, as written in its record (shown when a duplicate drops)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RunGuard:
    """Records the start of each run of an item in the delay store's server.

    Args:
        store: the delay store; the record lives in the item's shard slot.
        ttl_ms: how long a record is kept. A duplicate arriving later runs again, so keep it
            above a forwarder's lease plus the longest time a message waits in the broker.
    """

    def __init__(self, store: DelayStore, *, ttl_ms: int) -> None:
        self.store = store
        self.ttl_ms = ttl_ms
        self._holder = holder_name()
        self._lock = threading.Lock()
        self._counts = {verdict: 0 for verdict in Verdict}

    def key(self, item_id: str, run: int) -> str:
        """The record's key: a pure function of the id and the run (a forwarder can derive it)."""
        return self.store.keys(self.store.shard_of(item_id)).started(item_id, run)

    def start(self, item_id: str, run: int) -> Decision:
        """Record that run ``run`` of ``item_id`` starts now, unless it started before."""
        try:
            key = self.key(item_id, run)
            value = f"{self._holder} {time.time_ns() // 1_000_000}"
            if self.store.client.set(key, value, nx=True, px=self.ttl_ms):
                return self._count(Decision(Verdict.FIRST, key))
            first = self.store.client.get(key)
        except (RedisError, DelayqError, OSError) as exc:
            log.warning(
                "dedupe: the store cannot record run %d of %s (%s): running it anyway, a duplicate "
                "delivery of it would run too (at-least-once)",
                run,
                item_id,
                exc,
            )
            return self._count(Decision(Verdict.UNCHECKED))
        started = first.decode("utf-8", "replace") if isinstance(first, bytes) else "(record expired since)"
        return self._count(Decision(Verdict.DUPLICATE, key, started))

    def counts(self) -> dict[Verdict, int]:
        """Deliveries decided by this guard, by verdict (this process only)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, decision: Decision) -> Decision:
        with self._lock:
            self._counts[decision.verdict] += 1
        DEDUPE_OUTCOMES.labels(decision.verdict.value).inc()
        return decision
