"""Many batches at once, as the dashboard and the API list them: each batch's progress read in
pipelined rounds, in progress first, with the counts over all of them.

Apart from :mod:`.batches` (one batch's life, and :meth:`~.batches.Batches.batch_status`), whose
reading of a batch's hash it reuses, so the two read a batch alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from redis.exceptions import ResponseError

from ..errors import BatchError
from ..models import BatchStatus
from .batches import Batches, _batch_keys, _refused, _status, check_batch_key
from .slots import STATUS_CHUNK

__all__ = ["BatchBoard", "UnreadableBatch", "batch_board", "batch_state", "batch_statuses"]


class UnreadableBatch(NamedTuple):
    """A batch whose keys hold data delayq did not write, and what to do about it."""

    key: str
    reason: str


@dataclass(frozen=True)
class BatchBoard:
    """Batches in progress first (the last opened first), then completed (the last completed
    first): a page of ``batches``, and the counts over every batch listed.

    Attributes:
        open, closed, completed: batches taking sub-jobs, closed and waiting for sub-jobs to
            finish, and completed (their keys expire 7 days later).
        unreadable: the batches whose keys hold garbage, in key order: skipped, never a failure.
        batches: the statuses asked for, without their failed ids (one batch's status has them).
    """

    open: int
    closed: int
    completed: int
    unreadable: list[UnreadableBatch]
    batches: list[BatchStatus]


def batch_state(status: BatchStatus) -> str:
    """The batch's state: open (it takes sub-jobs), closed (it waits for its sub-jobs to finish)
    or completed."""
    return "completed" if status.completed else "closed" if status.closed else "open"


def batch_statuses(
    batches: Batches, keys: Sequence[str], *, failed_ids: int = 0
) -> list[BatchStatus | BatchError | None]:
    """The status of each of ``keys``, in their order, with the first ``failed_ids`` failed ids
    (0: none, the list's cost): one pipelined round of three reads a batch (four with failed ids)
    per :data:`~.slots.STATUS_CHUNK` batches. None: no such batch (expired since it was listed);
    a :class:`BatchError`: garbage, or a key that names no batch.

    Raises:
        RedisError: a reply that is no plain error of a key's value (a refused permission, a
            lost connection): a batch the ACL hides must not read as garbage.
    """
    reads = 4 if failed_ids else 3
    found: list[BatchStatus | BatchError | None] = []
    for start in range(0, len(keys), STATUS_CHUNK):
        chunk = keys[start : start + STATUS_CHUNK]
        named: list[BatchError | None] = []  # per key: why it names no batch, or None
        with batches.client.pipeline(transaction=False) as pipe:
            for key in chunk:
                try:
                    own = _batch_keys(batches, check_batch_key(key))
                except BatchError as exc:  # a hash written by hand under a key no batch can have
                    named.append(exc)
                    continue
                named.append(None)
                pipe.hgetall(own.batch(key))
                pipe.scard(own.batch_members(key))
                pipe.scard(own.batch_done(key))
                if failed_ids:
                    pipe.lrange(own.batch_failed(key), 0, failed_ids - 1)
            replies = iter(pipe.execute(raise_on_error=False) if len(pipe) else [])
        for key, refused in zip(chunk, named):
            found.append(refused or _read(key, [next(replies) for _ in range(reads)]))
    return found


def _read(key: str, replies: list[object]) -> BatchStatus | BatchError | None:
    """A batch's status from its replies (hash, members, done[, failed]), None if it has none,
    a BatchError for garbage."""
    for reply in replies:
        if isinstance(reply, Exception) and type(reply) is not ResponseError:
            raise reply
    fields, total, done, *failed = replies
    if isinstance(fields, dict) and not fields:
        return None
    try:
        if not (isinstance(fields, dict) and isinstance(total, int) and isinstance(done, int)):
            raise TypeError("a batch key of another type")
        return _status(key, fields, total, done, failed[0] if failed else [])
    except (TypeError, ValueError, KeyError, AttributeError):
        return _refused(key, -1, "nothing")


def batch_board(batches: Batches, keys: Sequence[str], *, offset: int = 0, limit: int | None = None) -> BatchBoard:
    """The statuses of ``keys`` in progress first (open or closed; the last opened first), then
    completed (the last completed first), ``limit`` of them from ``offset`` on, with the counts
    over all (read-only)."""
    statuses: list[BatchStatus] = []
    unreadable: list[UnreadableBatch] = []
    for key, status in zip(keys, batch_statuses(batches, keys)):
        if isinstance(status, BatchError):
            unreadable.append(UnreadableBatch(key, str(status)))
        elif status is not None:
            statuses.append(status)
    statuses.sort(key=lambda s: (s.completed, -(s.completed_ms or s.created_ms), s.key))
    states = [batch_state(s) for s in statuses]
    end = None if limit is None else offset + limit
    return BatchBoard(
        open=states.count("open"),
        closed=states.count("closed"),
        completed=states.count("completed"),
        unreadable=unreadable,
        batches=statuses[offset:end],
    )
