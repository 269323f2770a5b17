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
broker's at-least-once. If the store cannot be reached, the start is retried for a few seconds
(a restart, a failover); then the delivery runs (logged, counted as ``unchecked``): a duplicate
is better than a lost task. Its record is written once the store answers again, so a
forwarder in lossless mode, which publishes again what has no record, does not run it twice.
"""

from __future__ import annotations

import itertools
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
from .store import NOT_A_STRING, DelayStore, is_start_record

__all__ = ["DEDUPE_OUTCOMES", "DEFAULT_WAIT_MS", "Decision", "RunGuard", "Verdict", "holder_name"]

log = logging.getLogger("delayq.dedupe")

#: How long a start retries an unreachable store before the run goes unchecked: about what a
#: store restart (AOF) or a replica's promotion takes.
DEFAULT_WAIT_MS = 5000
#: Most records of unchecked runs kept to write once the store is back (beyond: not recorded).
MAX_LATE_RECORDS = 100_000
#: Pause between two tries to write those records.
_LATE_RETRY_S = 0.5


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
        wait_ms: how long a start retries an unreachable store before the run goes unchecked.
    """

    def __init__(self, store: DelayStore, *, ttl_ms: int, wait_ms: int = DEFAULT_WAIT_MS) -> None:
        self.store = store
        self.ttl_ms = ttl_ms
        self.wait_ms = wait_ms
        self._holder = holder_name()
        self._lock = threading.Lock()
        self._counts = {verdict: 0 for verdict in Verdict}
        self._late: dict[str, str] = {}  # record key -> value of unchecked runs, written when the store is back
        self._late_writer: threading.Thread | None = None
        self._starts = itertools.count()  # makes each start's value unique within this process

    def key(self, item_id: str, run: int) -> str:
        """The record's key: a pure function of the id and the run (a forwarder can derive it)."""
        return self.store.keys(self.store.shard_of(item_id)).started(item_id, run)

    def start(self, item_id: str, run: int) -> Decision:
        """Record that run ``run`` of ``item_id`` starts now, unless it started before.

        An unreachable store is retried for :attr:`wait_ms`; then the run goes unchecked and its
        record is written later, once the store answers (see :meth:`pending`).
        """
        key = ""
        # one value for every try: a write that landed but whose reply was lost (a restart, a
        # cut) reads back as ours on the next try, not as an earlier start
        value = f"{self._holder} {time.time_ns() // 1_000_000} {next(self._starts)}"
        deadline, pause = time.monotonic() + self.wait_ms / 1000, 0.05
        shard = self.store.shard_of(item_id)
        while True:
            try:
                key = self.key(item_id, run)
                first = self.store.record_start(shard, key, value, px=self.ttl_ms)  # waits when durable
                if first == value.encode():
                    return self._count(Decision(Verdict.FIRST, key))
                if first is None:
                    continue  # the earlier record expired between SET and GET
                if not is_start_record(first):
                    self._replace_garbage(shard, key, first, value)
                    continue  # recorded again: its write waits for the replicas
                break
            except (RedisError, DelayqError, OSError) as exc:
                if time.monotonic() + pause < deadline:
                    time.sleep(pause)  # a restart or failover: the store answers again soon
                    pause = min(1.0, pause * 2)
                    continue
                log.warning(
                    "dedupe: the store cannot record run %d of %s (%s): running it anyway, a duplicate "
                    "delivery of it would run too (at-least-once); its record is written once the store answers",
                    run,
                    item_id,
                    exc,
                )
                if key:
                    self._record_later(key, value)
                return self._count(Decision(Verdict.UNCHECKED))
        started = first.decode("utf-8", "replace") if isinstance(first, bytes) else "(record expired since)"
        return self._count(Decision(Verdict.DUPLICATE, key, started))

    def _replace_garbage(self, shard: int, key: str, held: bytes, value: str) -> None:
        """``key`` holds no start record (a hand write, another type): no run started, so it is
        replaced (once, among racing workers) and this run goes ahead; said with the key."""
        if self.store.replace_garbage(shard, key, value, px=self.ttl_ms):
            log.warning(
                "dedupe: %s held %s, no start record (written by another tool); replaced, the run goes ahead",
                key,
                "a value of another type" if held == NOT_A_STRING else repr(held[:40]),
            )

    def pending(self) -> int:
        """Records of unchecked runs still waiting for the store."""
        with self._lock:
            return len(self._late)

    def _record_later(self, key: str, value: str) -> None:
        with self._lock:
            if len(self._late) >= MAX_LATE_RECORDS:
                log.error(
                    "dedupe: %d records wait for the store already; run %s stays unrecorded", len(self._late), key
                )
                return
            self._late[key] = value
            if self._late_writer is None or not self._late_writer.is_alive():
                self._late_writer = threading.Thread(target=self._write_late, name="delayq-dedupe-late", daemon=True)
                self._late_writer.start()

    def _write_late(self) -> None:
        """Write the waiting records (SET NX PX) until none is left; a lossless forwarder then
        finds these runs started instead of publishing them again."""
        while True:
            time.sleep(_LATE_RETRY_S)
            with self._lock:
                late = dict(self._late)
            try:
                self.store.record_starts(late, px=self.ttl_ms)
            except (RedisError, OSError):
                continue  # still out of reach
            with self._lock:
                for key in late:
                    self._late.pop(key, None)
                left = len(self._late)
            log.info("dedupe: recorded %d runs that started while the store was out of reach", len(late))
            if not left:
                with self._lock:
                    if not self._late:
                        self._late_writer = None
                        return

    def counts(self) -> dict[Verdict, int]:
        """Deliveries decided by this guard, by verdict (this process only)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, decision: Decision) -> Decision:
        with self._lock:
            self._counts[decision.verdict] += 1
        DEDUPE_OUTCOMES.labels(decision.verdict.value).inc()
        return decision
