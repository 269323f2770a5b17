"""Batches in the store: one request split into sub-jobs, and an ``on_complete`` released once
when the batch is closed and every sub-job has finished (see :mod:`delayq_backends.batches`).

A batch ``key``'s keys share the hash tag of the shard of its on_complete item
(:func:`~delayq_backends.keys.batch_item_id`), so the one script call that records the last
finish (or the close) also writes that item, ready now, and publishes the summary: completion
depends on no process surviving past that call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import islice

from redis.exceptions import RedisError, ResponseError

from ..envelope import Envelope
from ..errors import BatchClosedError, BatchError, DelayqError
from ..keys import ShardKeys, batch_item_id, normalize_id, shard_of
from ..models import BatchStatus
from ..scripts.store import BatchAdd, BatchEnd, BatchEnding, BatchOpen
from .base import Payload, StoreCore
from .slots import STATUS_CHUNK, _glob_escaped

__all__ = [
    "BATCH_META", "BATCH_TTL_MS", "MAX_FAILED_IDS", "MAX_MEMBERS", "Batches", "add_to_batch", "batch_of",
    "check_batch_key", "end_batch", "fail_in_batches", "take_back", "with_batch",
]  # fmt: skip

log = logging.getLogger("delayq.batches")

#: The envelope meta field naming a sub-job's batch (``schedule(..., batch=key)``).
BATCH_META = "batch"
#: How long a completed batch's keys stay readable (``batch_status``, ``delayq batches``).
BATCH_TTL_MS = 7 * 86_400_000
#: Failed sub-job ids a batch keeps (and its summary lists); the count goes on past it.
MAX_FAILED_IDS = 1000
#: Sub-jobs a batch holds at most (``MAX_MEMBERS`` of scripts/includes/batch_own.lua): counting a
#: batch's finished members is bounded by it, whatever is written into its sets by hand.
MAX_MEMBERS = 100_000


def check_batch_key(key: object) -> str:
    """``key`` if it can name a batch (printable text; its on_complete id at most 512 bytes).

    Raises:
        BatchError: anything else; nothing was written.
    """
    if not isinstance(key, str) or not key:
        raise BatchError(f"batch key {key!r}: pass non-empty text, e.g. an order or request id")
    try:
        normalize_id(batch_item_id(key))
    except ValueError as exc:
        raise BatchError(f"batch key {key!r} is no usable key ({exc})") from exc
    return key


def _batch_keys(store: StoreCore, key: str) -> ShardKeys:
    """The keys of the shard whose hash tag batch ``key``'s keys share."""
    return store.keys(shard_of(batch_item_id(key), store.config.shards))


def _refused(key: str, reply: int, what: str) -> BatchError:
    """The error of a batch script's negative reply."""
    closed, use = BatchClosedError, f"`delayq batches show {key}`"
    errors: dict[int, tuple[type[BatchError], str]] = {
        -2: (BatchError, f"no batch {key!r}: open it first (open_batch, or the Batch class of your adapter)"),
        -3: (closed, f"batch {key!r} is closed: {what} was NOT added (nor scheduled); open a new batch for more "
             "sub-jobs"),
        -5: (closed, f"batch key {key!r} is in use: its batch is closed or completed, and its record is kept for its "
             f"TTL (7 days by default; {use}): open the new batch under a new key (e.g. {key + '-2'!r})"),
        -6: (BatchError, f"batch {key!r}: the script was given keys that are not the batch's (a hand-made call)"),
        -7: (BatchError, f"batch {key!r}: {what} would take it past {MAX_MEMBERS:,} sub-jobs, nothing was added; "
             "split the work into several batches"),
    }  # fmt: skip
    kind, message = errors.get(reply, (BatchError, ""))
    return kind(
        message
        or f"batch {key!r}: its keys hold data delayq did not write (a hand write); inspect them with {use} and "
        "delete them (they start with the batch's hash tag) to use the key again"
    )


def add_to_batch(store: StoreCore, key: str, ids: Sequence[str], *, remove: bool = False) -> int:
    """Count ``ids`` into batch ``key`` before they are scheduled (with ``remove``: take back
    those whose schedule failed); returns the batch's total.

    Raises:
        BatchClosedError: the batch is closed and an id is new. BatchError: no such batch, or garbage.
    """
    store.check_meta()
    reply = store.scripts.run(BatchAdd.call(_batch_keys(store, key), key, "remove" if remove else "add", ids))
    if reply < 0:
        raise _refused(key, reply, f"sub-job {ids[0]!r}" if len(ids) == 1 else f"{len(ids)} sub-jobs")
    return reply


def take_back(store: StoreCore, key: str, item_id: str) -> None:
    """Take sub-job ``item_id`` back out of batch ``key`` after its schedule raised, unless the
    item is in the store after all (a reply lost on its way back): the batch must neither wait
    for a sub-job that never runs nor complete without one that does. Never raises (the
    schedule's error is the one to raise); logged when it cannot be done."""
    try:
        if not store.exists(item_id):
            add_to_batch(store, key, [item_id], remove=True)
    except Exception as exc:
        log.warning("batch %r: %s was not scheduled and could not be taken back (%s)", key, item_id, exc)


def with_batch(envelope: Payload, key: str) -> Envelope:
    """``envelope`` naming batch ``key`` in its meta, so a cancel or a purge of the item (it will
    never run) can report it to its batch as failed (:func:`fail_in_batches`)."""
    decoded = envelope if isinstance(envelope, Envelope) else Envelope.decode(envelope)
    return replace(decoded, meta={**decoded.meta, BATCH_META: key})


def batch_of(envelope: object) -> str | None:
    """The batch an item's stored envelope names, None for none (or one no batch key can be)."""
    if not isinstance(envelope, bytes) or not envelope:
        return None
    try:
        key = Envelope.decode(envelope).meta.get(BATCH_META)
        return check_batch_key(key) if key is not None else None
    except DelayqError:
        return None


def fail_in_batches(store: StoreCore, envelopes: Mapping[str, object]) -> dict[str, str]:
    """Report each item of ``envelopes`` that names a batch (see :func:`with_batch`) to it as
    failed: it was cancelled or purged and will never run, and its batch would wait for ever.
    Returns the batch of each item reported. Never raises: a batch that cannot take the report
    (gone, garbage) is logged, the cancel or purge stands."""
    reported: dict[str, str] = {}
    for item_id, envelope in envelopes.items():
        key = batch_of(envelope)
        if key is None:
            continue
        try:
            end_batch(store, key, "finish", item_id, False)
        except (DelayqError, RedisError) as exc:
            log.warning("batch %r: sub-job %s will never run, but was not reported as failed: %s", key, item_id, exc)
            continue
        reported[item_id] = key
        log.info("batch %r: sub-job %s will never run (cancelled or purged): reported as failed", key, item_id)
    return reported


def end_batch(store: StoreCore, key: str, mode: str, member: str, ok: bool) -> bool:
    """batch_end.lua: close batch ``key`` or record ``member``'s end; whether that completed it."""
    store.check_meta()
    ending = BatchEnding(max_failed_ids=MAX_FAILED_IDS, wake=store.wake_channel, prefix=store.config.prefix)
    call = BatchEnd.call(_batch_keys(store, key), key, mode, ending=ending, now=store.clock(), member=member, ok=ok)
    code, completed = store.scripts.run(call)
    if code == -4:
        raise BatchError(f"{member!r} is no sub-job of batch {key!r}: it was not added (or its schedule failed)")
    if code < 0:
        raise _refused(key, code, "nothing")
    return completed


class Batches(StoreCore):
    """Batches: producers open, add (``schedule(..., batch=key)``) and close; workers report each
    sub-job's final end (:meth:`finish_in_batch`); anyone reads progress (:meth:`batch_status`)."""

    def open_batch(
        self, key: str, *, on_complete: Payload | None = None, mark: str = "", ttl_ms: int = BATCH_TTL_MS
    ) -> bool:
        """Open batch ``key`` (total 0, not closed); True if opened, False if it was open already
        (taken up again as it is: a retried open, a producer starting again).

        Args:
            on_complete: the item released once the batch completes, as the item
                :func:`~delayq_backends.keys.batch_item_id` (``"batch-<key>"``); None: only the notice.
            mark: a string that stands, JSON-quoted, in ``on_complete``'s body for the summary:
                completion writes the summary's JSON in its place (the Celery adapter's way to
                pass it as the callback's first argument); "" for none.
            ttl_ms: how long the batch's keys stay once it completed (7 days).

        Raises:
            BatchClosedError: the key's batch is closed, or completed less than its TTL ago (its
                fired mark is there): open the new batch under a new key.
            BatchError: a bad key, or its hash holds garbage.
        """
        check_batch_key(key)
        if type(ttl_ms) is not int or ttl_ms < 1:
            raise BatchError(f"ttl_ms={ttl_ms!r}: pass a whole number of ms, at least 1")
        self.check_meta()
        envelope = b"" if on_complete is None else self.check_payload(batch_item_id(key), on_complete)
        keys = _batch_keys(self, key)
        reply = self.scripts.run(
            BatchOpen.call(keys, key, on_complete=envelope, mark=mark, now=self.clock(), ttl_ms=ttl_ms)
        )
        if reply < 0:
            raise _refused(key, reply, "nothing")
        return reply == 1

    def add_to_batch(self, key: str, ids: Sequence[str]) -> int:
        """Count sub-jobs ``ids`` into batch ``key`` without scheduling them (an adapter that
        schedules them itself; ``schedule(..., batch=key)`` does both); returns the total."""
        return add_to_batch(self, check_batch_key(key), [normalize_id(i) for i in ids])

    def close_batch(self, key: str) -> bool:
        """Close batch ``key``: no more sub-jobs; it completes now if all have finished (an empty
        batch at once). Returns whether this call completed it. Closing twice is harmless, and
        completes a batch whose completion a garbage shard key held up once that is fixed.

        Raises:
            BatchError: no such batch, or its keys hold garbage.
        """
        return end_batch(self, check_batch_key(key), "close", "", True)

    def finish_in_batch(self, key: str, member: str, ok: bool) -> bool:
        """Record sub-job ``member``'s final end (``ok``: it succeeded); a second report of it
        counts nothing. Returns whether this call completed the batch.

        Raises:
            BatchError: no such batch, ``member`` is not one of its sub-jobs, or garbage.
        """
        return end_batch(self, check_batch_key(key), "finish", member, ok)

    def pending_in_batch(self, key: str, *, limit: int = 100) -> list[str]:
        """Up to ``limit`` sub-jobs of batch ``key`` that have not finished (a SSCAN of its
        members against its done set: bounded by the batch's :data:`MAX_MEMBERS`): what a closed
        batch waits for, a member written by hand included. ``finish_in_batch(key, id, False)``
        (``delayq batches fail``) ends one that will never run."""
        keys = _batch_keys(self, check_batch_key(key))
        members, done = keys.batch_members(key), keys.batch_done(key)
        pending: list[str] = []
        scan = self.client.sscan_iter(members, count=1000)
        while chunk := list(islice(scan, 1000)):
            finished = self.client.smismember(done, chunk)
            pending += [_id_text(m) for m, end in zip(chunk, finished) if not end]
            if len(pending) >= limit:
                break
        return sorted(pending[:limit])

    def batch_status(self, key: str) -> BatchStatus | None:
        """Batch ``key``'s progress with its failed ids; None when there is none (never opened,
        or expired).

        Raises:
            BatchError: its keys hold garbage (the message says how to clear them).
            RedisError: a refused permission or a lost connection (never read as garbage).
        """
        found = self.batch_statuses([check_batch_key(key)], failed_ids=MAX_FAILED_IDS)[0]
        if isinstance(found, BatchError):
            raise found
        return found

    def batch_statuses(self, keys: Sequence[str], *, failed_ids: int = 0) -> list[BatchStatus | BatchError | None]:
        """The status of each of ``keys``, in their order, with the first ``failed_ids`` failed
        ids (0: none, the list's cost): one pipelined round of four reads a batch (five with
        failed ids) per :data:`STATUS_CHUNK` batches, for a dashboard listing many. Done counts
        the finished ids that are members (an id written into the done set by hand is none), and
        completed is the fired mark as much as the hash's flag (a hand write cannot undo it). None: no
        such batch (expired since it was listed); a :class:`BatchError`: garbage, or a key that
        names no batch.

        Raises:
            RedisError: a reply that is no plain error of a key's value (a refused permission, a
                lost connection): a batch the ACL hides must not read as garbage.
        """
        reads = 5 if failed_ids else 4
        found: list[BatchStatus | BatchError | None] = []
        for start in range(0, len(keys), STATUS_CHUNK):
            chunk = keys[start : start + STATUS_CHUNK]
            named: list[BatchError | None] = []  # per key: why it names no batch, or None
            with self.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    try:
                        own = _batch_keys(self, check_batch_key(key))
                    except BatchError as exc:  # a hash written by hand under a key no batch can have
                        named.append(exc)
                        continue
                    named.append(None)
                    pipe.hgetall(own.batch(key))
                    pipe.scard(own.batch_members(key))
                    pipe.sintercard(2, [own.batch_members(key), own.batch_done(key)])
                    pipe.hget(own.batch_fired(key), "at")
                    if failed_ids:
                        pipe.lrange(own.batch_failed(key), 0, failed_ids - 1)
                replies = iter(pipe.execute(raise_on_error=False) if len(pipe) else [])
            for key, refused in zip(chunk, named):
                found.append(refused or _read(key, [next(replies) for _ in range(reads)]))
        return found

    def batch_keys_in_use(self) -> list[str]:
        """Every batch key with a hash, sorted (a SCAN of the prefix's batch hashes, every
        primary's on a cluster: for ``delayq batches list`` and an HTTP API, not a hot path)."""
        prefix = _glob_escaped(self.config.prefix)
        found: set[str] = set()
        for raw in self.client.scan_iter(match=f"{prefix}:{{{prefix}:*}}:batch:*", count=1000):
            name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            _, sep, key = name.partition("}:batch:")
            if sep and key:
                found.add(key)
        return sorted(found)


def _read(key: str, replies: list[object]) -> BatchStatus | BatchError | None:
    """A batch's status from its replies (hash, members, finished members, fired mark[, failed]),
    None if it has none, a BatchError for garbage."""
    for reply in replies:
        if isinstance(reply, Exception) and type(reply) is not ResponseError:
            raise reply
    fields, total, done, fired, *failed = replies
    if isinstance(fields, dict) and not fields:
        return None
    try:
        if not (isinstance(fields, dict) and isinstance(total, int) and isinstance(done, int)):
            raise TypeError("a batch key of another type")
        status = _status(key, fields, total, done, failed[0] if failed else [])
        if fired is None or status.completed:
            return status
        return replace(status, completed=True, completed_ms=_whole(fired))  # the hash says otherwise: a hand write
    except (TypeError, ValueError, KeyError, AttributeError):
        return _refused(key, -1, "nothing")


def _status(key: str, fields: dict[bytes, bytes], total: int, done: int, failed_ids: object) -> BatchStatus:
    """A batch's status from its hash's fields; raises on garbage (a field missing or not ours)."""
    flags = {f: fields[f.encode()] for f in ("closed", "completed")}
    if not all(v in (b"0", b"1") for v in flags.values()) or not isinstance(failed_ids, list):
        raise ValueError("closed/completed are no flags")
    failed = int(fields[b"failed"])
    if not 0 <= failed <= done:
        raise ValueError("a failed count that no batch can have")
    completed_at = fields.get(b"completed_at")
    return BatchStatus(
        key=key,
        total=total,
        done=done,
        succeeded=done - failed,
        failed=failed,
        failed_ids=tuple(i.decode("utf-8", "replace") for i in failed_ids),
        closed=flags["closed"] == b"1",
        completed=flags["completed"] == b"1",
        created_ms=int(fields[b"created"]),
        completed_ms=None if completed_at is None else int(completed_at),
        on_complete=bool(fields.get(b"on_complete")),
    )


def _whole(value: object) -> int | None:
    """A whole number read back (the fired mark's ms), None when it is none (a hand write)."""
    if not isinstance(value, (bytes, str)) or not value.isdigit():
        return None
    return int(value)


def _id_text(member: object) -> str:
    return member.decode("utf-8", "replace") if isinstance(member, bytes) else str(member)
