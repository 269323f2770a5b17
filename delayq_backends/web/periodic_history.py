"""A periodic entry's history in the API (``delayq periodic history NAME`` over HTTP): its last
runs (due, published, started, finished, outcome, lateness, kind), its last success and its
missed and late periods. Read-only: forwarders and workers write it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field

from ..entries import iso
from ..periodic.history import HISTORY_SIZE, RunRecord, entry_history
from .api import RESPONSES, Digits, Svc
from .entry_paths import EntryRoute
from .guard import API_PREFIX
from .periodic import NOT_FOUND, PathName, acting

__all__ = ["router"]

router = APIRouter(prefix=API_PREFIX, responses=RESPONSES, route_class=EntryRoute)


class RunOut(BaseModel):
    run_id: str = Field(description="The run's task (job) id.")
    kind: str = Field(description="scheduled, manual (run now) or backfill.")
    due: str = Field(description="Its period's due time (UTC).")
    published: str | None = Field(description="When a forwarder published it, the broker having confirmed.")
    lateness_ms: int | None = Field(description="published - due, in ms.")
    started: str | None = Field(description="When a worker last started it (a retry starts it again).")
    finished: str | None = Field(description="When it last ended.")
    outcome: str | None = Field(description="success, failure, retry or revoked; null: not ended (yet).")


class HistoryOut(BaseModel):
    name: str
    now: str = Field(description="The store's time of this answer (UTC).")
    last_success: str | None = Field(description="When a run last succeeded (UTC); null: none kept.")
    last_success_age_ms: int | None
    missed: int = Field(description="Periods missed (misfire policy), so far (the history's TTL).")
    late: int = Field(description="Runs published over 1 s after their due time, so far.")
    runs: list[RunOut] = Field(description="The newest first.")


HistoryLimit = Annotated[int, Query(ge=1, le=HISTORY_SIZE), Digits]


def _run(r: RunRecord) -> RunOut:
    return RunOut(
        run_id=r.run_id,
        kind=r.kind,
        due=iso(r.due_ms) or "",
        published=iso(r.published_ms),
        lateness_ms=r.lateness_ms,
        started=iso(r.started_ms),
        finished=iso(r.finished_ms),
        outcome=r.outcome,
    )


@router.get(
    "/periodic/{name:path}/history", response_model=HistoryOut, responses=NOT_FOUND, summary="A periodic entry's runs"
)
def periodic_history(name: PathName, svc: Svc, limit: HistoryLimit = HISTORY_SIZE) -> HistoryOut:
    """Its last runs, newest first, with its last success and missed and late periods."""
    store = svc.store
    try:
        with acting():
            found = entry_history(store, name, limit=limit)
    except ValueError as exc:  # no entry can have this name (its item id would be too long)
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"entry name {name!r}: {exc}") from None
    now = store.clock()
    return HistoryOut(
        name=name,
        now=iso(now) or "",
        last_success=iso(found.last_success_ms),
        last_success_age_ms=found.last_success_age_ms(now),
        missed=found.missed,
        late=found.late,
        runs=[_run(r) for r in found.runs],
    )
