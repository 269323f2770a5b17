"""Batches: one request split into sub-jobs, and one ``on_complete`` once all have finished.

A producer opens a batch (``store.open_batch(key, on_complete=...)``; Celery's and RQ's ``Batch``),
schedules its sub-jobs into it (``schedule(..., batch=key)``: each is counted into the batch
before it is stored, and taken back out if that fails), then closes it. Workers report each
sub-job's **final** end (:func:`report_end`): a success, or a failure after its last retry (a
Celery retry is not final; a revoke is a failure). The report that finds the batch closed with
every sub-job finished completes it, in that one script call: the ``on_complete`` item is written
into the store ready now (a forwarder releases it like any item), the summary ``{"batch", "total",
"succeeded", "failed", "failed_ids"}`` is published on :func:`~delayq_backends.keys.batch_channel`
(``<prefix>:batch:<key>``), and the batch is marked completed, so it completes exactly once
whichever process dies when. A sub-job reported twice (a redelivery) counts once.

What it costs: a worker killed after a sub-job ran and before its end was reported leaves the
batch waiting until the sub-job is delivered again (Celery ``acks_late``, lossless forwarding)
and ends; a sub-job that is never delivered again holds the batch open (``delayq batches show``
names what it waits for: total minus done).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TypeVar

from prometheus_client import Counter
from redis.exceptions import RedisError

from .errors import DelayqError
from .store import DelayStore

__all__ = ["BATCHES_COMPLETED", "OpenBatch", "report_close", "report_end"]

log = logging.getLogger("delayq.batches")
_Open = TypeVar("_Open", bound="OpenBatch")

#: Batches completed by this process's report or close, in the process's default registry (as
#: the dedupe counter), so a worker's or producer's own exporter serves it.
BATCHES_COMPLETED = Counter(
    "delayq_batch_completed",
    "Batches this process completed: its sub-job end report or close found every sub-job finished, "
    "and released the batch's on_complete (once per batch, across all processes)",
)


def report_end(store: DelayStore, key: str, member: str, ok: bool) -> bool:
    """Report sub-job ``member``'s final end to batch ``key``; whether that completed the batch.

    A worker calls this from its hooks, so nothing raises out of it: a store error or garbage in
    the batch's keys is logged (the batch waits; a redelivery of the sub-job reports again).
    """
    try:
        completed = store.finish_in_batch(key, member, ok)
    except (RedisError, DelayqError, OSError) as exc:
        log.warning("batch %r: the end of sub-job %s (%s) was not recorded: %s", key, member, _word(ok), exc)
        return False
    if completed:
        BATCHES_COMPLETED.inc()
        log.info("batch %r completed by the end of sub-job %s", key, member)
    return completed


def report_close(store: DelayStore, key: str) -> bool:
    """Close batch ``key`` (errors raise: the producer must know); whether that completed it."""
    completed = store.close_batch(key)
    if completed:
        BATCHES_COMPLETED.inc()
    return completed


class OpenBatch:
    """A batch a producer adds to, then closes: Celery's and RQ's ``Batch`` add their own ``add``.

    As a context manager it closes on leaving the block, unless the block raised: a batch cut
    short stays open (its on_complete does not run on a part); close it once the rest is added.
    """

    store: DelayStore
    key: str

    def close(self) -> bool:
        """No more sub-jobs; whether that completed the batch (all had finished, or none was added)."""
        return report_close(self.store, self.key)

    def __enter__(self: _Open) -> _Open:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()


def _word(ok: bool) -> str:
    return "succeeded" if ok else "failed"
