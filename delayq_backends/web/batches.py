"""Batches in the API: each batch's progress (sub-jobs added, finished, succeeded and failed) and
state, in progress first (``delayq batches list`` / ``show`` over HTTP). Read-only: batches are
opened, filled and closed by producers, and finished by workers.

The list of batch keys is a SCAN, made at most every :data:`BATCH_KEYS_TTL` seconds (a dashboard
refreshes every 2 s); the listed batches' progress is read fresh on every request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, status
from pydantic import BaseModel, Field

from ..entries import iso
from ..errors import BatchError
from ..keys import MAX_ID_BYTES, batch_item_id
from ..models import BatchStatus
from ..store.batchboard import batch_board, batch_state
from ..store.batches import MAX_FAILED_IDS, check_batch_key
from .api import RESPONSES, Digits, ErrorOut, Limit, Services, Svc, UnreadableData
from .guard import API_PREFIX

__all__ = ["BATCH_KEYS_TTL", "router"]

#: Seconds the dashboard's list of batch keys is kept before it SCANs again.
BATCH_KEYS_TTL = 10.0
#: Unreadable batches the list names (all are counted).
MAX_PROBLEMS = 10

router = APIRouter(prefix=API_PREFIX, responses=RESPONSES)

State = Literal["open", "closed", "completed"]


class BatchRowOut(BaseModel):
    key: str
    state: State = Field(
        description="open: it takes sub-jobs; closed: it waits for its sub-jobs to finish; completed: its "
        "on_complete was released and its notice published (once)."
    )
    total: int = Field(description="Sub-jobs added.")
    done: int = Field(description="Sub-jobs finished: succeeded + failed (a second report counts once).")
    succeeded: int
    failed: int = Field(description="Sub-jobs that failed after their last retry (or were revoked).")
    closed: bool
    completed: bool
    created: str = Field(description="When it was opened (UTC).")
    completed_at: str | None = Field(description="When it completed (UTC), else null.")
    on_complete: bool = Field(description="Whether an on_complete item is released at completion.")


class BatchOut(BatchRowOut):
    failed_ids: list[str] = Field(description="The first failed sub-job ids (at most 1,000; failed counts on).")


class BatchesOut(BaseModel):
    open: int = Field(description="Batches taking sub-jobs, listed here or not.")
    closed: int = Field(description="Batches closed and waiting for their sub-jobs to finish.")
    completed: int = Field(description="Batches completed (kept 7 days after completion).")
    unreadable: int = Field(description="Batches whose keys hold data delayq did not write: skipped.")
    batches: list[BatchRowOut] = Field(
        description="The page asked for: open and closed first (the last opened first), then completed (the "
        "last completed first)."
    )
    problems: list[str] = Field(default_factory=list, description="The first unreadable batches, and what to do.")


def _row(s: BatchStatus) -> dict[str, Any]:
    return {
        "key": s.key,
        "state": batch_state(s),
        "total": s.total,
        "done": s.done,
        "succeeded": s.succeeded,
        "failed": s.failed,
        "closed": s.closed,
        "completed": s.completed,
        "created": iso(s.created_ms),
        "completed_at": iso(s.completed_ms),
        "on_complete": s.on_complete,
    }


#: The longest key whose on_complete id (``batch-<key>``) is an id; longer (in bytes) is a 400.
MAX_KEY = MAX_ID_BYTES - len(batch_item_id(""))
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No such batch (never opened, or expired after completion)."}
}
PathKey = Annotated[
    str, Path(min_length=1, max_length=MAX_KEY, pattern=r"^[^\x00-\x1f\x7f]+$", description="The batch key.")
]
QueryKey = Annotated[str, Query(min_length=1, max_length=MAX_KEY, description="The batch key.")]
#: Every batch's progress is read for the order anyway, so a deep page costs no more.
BatchOffset = Annotated[int, Query(ge=0, le=1_000_000), Digits]


def _batch(svc: Services, key: str) -> BatchOut:
    try:
        check_batch_key(key)
    except BatchError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    # batch_status's read, but a refused permission is Redis's refusal, not garbage
    found = svc.store.batch_statuses([key], failed_ids=MAX_FAILED_IDS)[0]
    if isinstance(found, BatchError):  # garbage: a 503 (as any unreadable value), saying how to clear it
        raise UnreadableData(f"the batch cannot be read: {found}")
    if found is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no batch {key!r} in prefix {svc.store.config.prefix!r} (never opened, or expired after completion)",
        )
    return BatchOut(**_row(found), failed_ids=list(found.failed_ids))


@router.get("/batches", response_model=BatchesOut, summary="Batches: in progress first, then the last completed")
def list_batches(svc: Svc, offset: BatchOffset = 0, limit: Limit = 50) -> BatchesOut:
    """Each batch's progress and state (``delayq batches list``); the counts cover every batch.
    Batches opened in the last few seconds may not be listed yet."""
    board = batch_board(svc.store, svc.batch_keys(), offset=offset, limit=limit)
    problems = [b.reason for b in board.unreadable[:MAX_PROBLEMS]]  # each names its key
    if len(board.unreadable) > MAX_PROBLEMS:
        problems.append(f"and {len(board.unreadable) - MAX_PROBLEMS} more unreadable batches")
    return BatchesOut(
        open=board.open,
        closed=board.closed,
        completed=board.completed,
        unreadable=len(board.unreadable),
        batches=[BatchRowOut(**_row(s)) for s in board.batches],
        problems=problems,
    )


@router.get("/batch", response_model=BatchOut, responses=NOT_FOUND, summary="One batch, by ?key=")
def get_batch_by_query(key: QueryKey, svc: Svc) -> BatchOut:
    """Its progress, and the first failed sub-job ids (``delayq batches show KEY``)."""
    return _batch(svc, key)


@router.get("/batches/{key:path}", response_model=BatchOut, responses=NOT_FOUND, summary="One batch")
def get_batch(key: PathKey, svc: Svc) -> BatchOut:
    """For keys that are plain path segments; ``GET /batch?key=`` reaches every key."""
    return _batch(svc, key)
