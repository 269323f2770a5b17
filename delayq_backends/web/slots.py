"""The concurrency slots in the API: each slot key's limit, items running and waiting, busiest
first, and its limit set at runtime (``delayq slots list`` / ``set`` over HTTP).

The list of slot keys is a SCAN, so :class:`~delayq_backends.store.SlotKeyList` makes it at
most every :data:`SLOT_KEYS_TTL` seconds (a dashboard refreshes every 2 s); the counts of the
listed keys are read fresh on every request, and setting a limit lists the keys again.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from ..envelope import MAX_RATE_KEY, MAX_SLOT_LIMIT
from ..models import SlotStatus
from .api import RESPONSES, Digits, ErrorOut, JsonNumber, Limit, Services, Svc
from .guard import API_PREFIX

__all__ = ["SLOT_KEYS_TTL", "router"]

#: Seconds the dashboard's list of slot keys is kept before it SCANs again.
SLOT_KEYS_TTL = 10.0

router = APIRouter(prefix=API_PREFIX, responses=RESPONSES)


class SlotOut(BaseModel):
    key: str
    limit: int | None = Field(description="The limit set at runtime; null: the items' own limit applies, or none.")
    running: int = Field(description="Items holding a slot: running, or released and not started yet.")
    waiting: int = Field(description="Items waiting in the key's line for a slot.")


class SlotsOut(BaseModel):
    keys: int = Field(description="Slot keys in use (holds, a line or a limit), listed here or not.")
    running: int = Field(description="Items holding a slot, over every key.")
    waiting: int = Field(description="Items waiting for a slot, over every key.")
    slots: list[SlotOut] = Field(description="The page asked for, busiest first (running + waiting, then key).")


class SlotLimitIn(BaseModel):
    limit: Annotated[int, Field(ge=1, le=MAX_SLOT_LIMIT), JsonNumber] | None = Field(
        description="At most this many items of the key run at once, from the next release on, over the "
        "items' own limit; null removes it."
    )


#: Setting a limit takes a key as ``Slot`` does (printable text): any other is a 400 saying so.
PathKey = Annotated[
    str, Path(min_length=1, max_length=MAX_RATE_KEY, pattern=r"^[^\x00-\x1f\x7f]+$", description="The slot key.")
]
#: A path with a control character matches no route (use ``?key=``).
NO_ROUTE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "A key with a control character is no path segment: use ?key=."}
}
QueryKey = Annotated[str, Query(min_length=1, max_length=MAX_RATE_KEY, description="The slot key.")]
#: Every key's counts are read for the busiest-first order anyway, so a deep page costs no more.
SlotOffset = Annotated[int, Query(ge=0, le=1_000_000), Digits]


def _out(status: SlotStatus) -> SlotOut:
    return SlotOut(key=status.key, limit=status.limit, running=status.running, waiting=status.waiting)


def _set_limit(svc: Services, key: str, body: SlotLimitIn) -> SlotOut:
    svc.store.set_slot_limit(key, body.limit)  # a key that is not one: InvalidSlotError, a 400
    svc.slot_keys.forget()
    return _out(svc.store.slot_status(key))


@router.get("/slots", response_model=SlotsOut, summary="Concurrency slot keys, busiest first")
def list_slots(svc: Svc, offset: SlotOffset = 0, limit: Limit = 50) -> SlotsOut:
    """Each key's runtime limit, items running and waiting (``delayq slots list``); the totals
    cover every key. Keys that appeared in the last few seconds may not be listed yet."""
    board = svc.store.slot_board(svc.slot_keys(), offset=offset, limit=limit)
    return SlotsOut(keys=board.keys, running=board.running, waiting=board.waiting, slots=[_out(s) for s in board.slots])


@router.get("/slot", response_model=SlotOut, summary="One slot key, by ?key=")
def get_slot_by_query(key: QueryKey, svc: Svc) -> SlotOut:
    """A key no item uses has no limit and nothing running or waiting."""
    return _out(svc.store.slot_status(key))


@router.put("/slot/limit", response_model=SlotOut, summary="Set or remove a slot key's limit, by ?key=")
def set_slot_limit_by_query(body: SlotLimitIn, key: QueryKey, svc: Svc) -> SlotOut:
    return _set_limit(svc, key, body)


@router.get("/slots/{key:path}", response_model=SlotOut, responses=NO_ROUTE, summary="One slot key")
def get_slot(key: PathKey, svc: Svc) -> SlotOut:
    """For keys that are plain path segments; ``GET /slot?key=`` reaches every key."""
    return _out(svc.store.slot_status(key))


@router.put(
    "/slots/{key:path}/limit", response_model=SlotOut, responses=NO_ROUTE, summary="Set or remove a slot key's limit"
)
def set_slot_limit(body: SlotLimitIn, key: PathKey, svc: Svc) -> SlotOut:
    """``PUT /slot/limit?key=`` reaches every key."""
    return _set_limit(svc, key, body)
