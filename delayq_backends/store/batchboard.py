"""Many batches at once, as the dashboard and the API list them: each batch's progress read in
pipelined rounds, in progress first, with the counts over all of them.

Apart from :mod:`.batches` (a batch's life, and how its status is read), which the board sorts
and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import BatchError
from ..models import BatchStatus
from .batches import Batches

__all__ = ["BatchBoard", "UnreadableBatch", "batch_board", "batch_state"]


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


def batch_board(batches: Batches, keys: Sequence[str], *, offset: int = 0, limit: int | None = None) -> BatchBoard:
    """The statuses of ``keys`` in progress first (open or closed; the last opened first), then
    completed (the last completed first), ``limit`` of them from ``offset`` on, with the counts
    over all (read-only)."""
    statuses: list[BatchStatus] = []
    unreadable: list[UnreadableBatch] = []
    for key, status in zip(keys, batches.batch_statuses(keys)):
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
