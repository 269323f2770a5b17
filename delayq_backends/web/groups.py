"""Groups in the API: each group's policy (limit, rate, weight, paused), items running and
parked, busiest first a page at a time; a policy set, a pause and a resume at runtime
(``delayq groups …`` over HTTP; the dashboard's Groups panel).

Same token and the same store credential as the slot limits (a slot key is a group: ``/slots``
stays as its view by the old name). The list of groups is a SCAN, so
:class:`~delayq_backends.store.groupboard.GroupKeyList` makes it at most every
:data:`~delayq_backends.store.groupboard.GROUP_KEYS_TTL` seconds; the listed groups' counts are
read fresh on every request, and a write lists them again. Every key is reachable by query
(``?key=``); the path forms take keys that are plain path segments.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..entries import group_board_entry, group_entry
from ..envelope import MAX_RATE_KEY, MAX_SLOT_LIMIT
from ..group_policies import MAX_WEIGHT
from ..store.groupboard import group_board
from .api import RESPONSES, Digits, ErrorOut, JsonNumber, Limit, Name, Services, Svc
from .guard import API_PREFIX
from .periodic import ActionIn

__all__ = ["router"]

router = APIRouter(prefix=API_PREFIX, responses=RESPONSES)


class GroupOut(BaseModel):
    key: str
    limit: int | None = Field(description="At most this many run at once (set at runtime); null: none set here.")
    rate: str | None = Field(description='At most this many released per s, m or h ("10/s"); null: none set here.')
    weight: float | None = Field(description="Its share when groups compete (1: equal); null: none set here (1).")
    paused_by: str | None = Field(description='Who paused it ("operator"); null: not paused.')
    throttled_until: str | None = Field(description="A worker's throttle holds it until then; null: none now.")
    throttled_by: str | None = Field(description='Who throttled it ("operator", "worker:<item>"); null: none now.')
    held: str | None = Field(description='"paused" or "throttled": it releases nothing now; null: it releases.')
    running: int = Field(description="Items holding a place in its limit: running, or released and not started.")
    parked: int = Field(description="Items waiting in the group's lines (every shard).")


class GroupsOut(BaseModel):
    groups: int = Field(description="Groups in use (holds, a line, a policy), on this page or not.")
    running: int = Field(description="Items running, over every group.")
    parked: int = Field(description="Items waiting in a group's line, over every group.")
    paused: int = Field(description="Groups paused by an operator.")
    throttled: int = Field(description="Groups a worker's throttle holds now.")
    page: list[GroupOut] = Field(description="The page asked for, busiest first (running + parked, then key).")


class GroupPolicyIn(BaseModel):
    """The parts of a group's policy to set: a part left out stays as it is, null removes it."""

    limit: Annotated[int, Field(ge=1, le=MAX_SLOT_LIMIT), JsonNumber] | None = Field(
        None, description="At most this many items of the group run at once."
    )
    rate: Annotated[str, Field(max_length=40, pattern=r"^[0-9]{1,12}(\.[0-9]{1,6})?/[smh]$")] | None = Field(
        None,
        description="At most N items (their cost) released per second, minute or hour, by every forwarder "
        'together: "10/s", "600/m", "0.5/s" (N > 0, at most 10^6 a second).',
    )
    weight: Annotated[float, Field(gt=0, le=MAX_WEIGHT, allow_inf_nan=False), JsonNumber] | None = Field(
        None, description="Its share when groups compete (default 1): weight 3 gets 3 releases to another's 1."
    )

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["limit"]}, {"required": ["rate"]}, {"required": ["weight"]}]}
    )

    @model_validator(mode="after")
    def some(self) -> GroupPolicyIn:
        if not self.model_fields_set:
            raise ValueError("send at least one of limit, rate, weight (null removes one)")
        return self

    def changes(self) -> dict[str, Any]:
        """The parts sent (``set_group``'s keyword arguments): the others stay as they are."""
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}


class PauseIn(BaseModel):
    """``{}`` (paused by "operator") or ``{"by": "alice"}``: every write is JSON (the guard
    refuses any other POST)."""

    by: Name = Field("operator", description="Who pauses it (shown with the pause).")


#: A key in a path: printable text (``Group`` takes no other); a control character matches no route.
PathKey = Annotated[
    str, Path(min_length=1, max_length=MAX_RATE_KEY, pattern=r"^[^\x00-\x1f\x7f]+$", description="The group key.")
]
NO_ROUTE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "A key with a control character is no path segment: use ?key=."}
}
QueryKey = Annotated[str, Query(min_length=1, max_length=MAX_RATE_KEY, description="The group key.")]
#: Every group's counts are read for the busiest-first order anyway, so a deep page costs no more.
GroupOffset = Annotated[int, Query(ge=0, le=1_000_000), Digits]


def _one(svc: Services, key: str) -> GroupOut:
    status = svc.store.group_statuses([key])[0]
    return GroupOut(**group_entry(status, svc.store.clock()))


def _written(svc: Services, key: str) -> GroupOut:
    """The group as it is after a write, which lists the groups again (it may be a new one)."""
    svc.group_keys.forget()
    return _one(svc, key)


def _set(svc: Services, key: str, body: GroupPolicyIn) -> GroupOut:
    svc.store.set_group(key, **body.changes())  # a key that is not one: the store's error, a 400
    return _written(svc, key)


def _pause(svc: Services, key: str, body: PauseIn) -> GroupOut:
    svc.store.pause_group(key, by=body.by)
    return _written(svc, key)


def _resume(svc: Services, key: str) -> GroupOut:
    svc.store.resume_group(key)
    return _written(svc, key)


@router.get("/groups", response_model=GroupsOut, summary="Groups, busiest first")
def list_groups(svc: Svc, offset: GroupOffset = 0, limit: Limit = 50) -> GroupsOut:
    """Each group's policy, items running and parked (``delayq groups list``); the counts cover
    every group. Groups that appeared in the last few seconds may not be listed yet."""
    board = group_board(svc.store, svc.group_keys(), offset=offset, limit=limit)
    return GroupsOut(**group_board_entry(board))


@router.get("/group", response_model=GroupOut, summary="One group, by ?key=")
def get_group_by_query(key: QueryKey, svc: Svc) -> GroupOut:
    """A group nobody set or used has no policy and nothing running or parked."""
    return _one(svc, key)


@router.post("/group", response_model=GroupOut, summary="Set parts of a group's policy, by ?key=")
def set_group_by_query(body: GroupPolicyIn, key: QueryKey, svc: Svc) -> GroupOut:
    return _set(svc, key, body)


@router.post("/group/pause", response_model=GroupOut, summary="Pause a group, by ?key=")
def pause_group_by_query(body: PauseIn, key: QueryKey, svc: Svc) -> GroupOut:
    return _pause(svc, key, body)


@router.post("/group/resume", response_model=GroupOut, summary="Resume a group, by ?key=")
def resume_group_by_query(_: ActionIn, key: QueryKey, svc: Svc) -> GroupOut:
    return _resume(svc, key)


# the pause and resume paths before the key's own: "/groups/a/pause" is a pause of "a"
# ("/group/pause?key=a/pause" reaches a group of that name)


@router.post("/groups/{key:path}/pause", response_model=GroupOut, responses=NO_ROUTE, summary="Pause a group")
def pause_group(body: PauseIn, key: PathKey, svc: Svc) -> GroupOut:
    """Release no more of its items, at every forwarder from its next release on: those released
    run, the rest wait in its lines until a resume. ``POST /group/pause?key=`` reaches every key."""
    return _pause(svc, key, body)


@router.post("/groups/{key:path}/resume", response_model=GroupOut, responses=NO_ROUTE, summary="Resume a group")
def resume_group(_: ActionIn, key: PathKey, svc: Svc) -> GroupOut:
    """``POST /group/resume?key=`` reaches every key."""
    return _resume(svc, key)


@router.get("/groups/{key:path}", response_model=GroupOut, responses=NO_ROUTE, summary="One group")
def get_group(key: PathKey, svc: Svc) -> GroupOut:
    """For keys that are plain path segments; ``GET /group?key=`` reaches every key."""
    return _one(svc, key)


@router.post("/groups/{key:path}", response_model=GroupOut, responses=NO_ROUTE, summary="Set parts of a group's policy")
def set_group(body: GroupPolicyIn, key: PathKey, svc: Svc) -> GroupOut:
    """From the next release on, at every forwarder, over the items' own and the patterns'.
    ``POST /group?key=`` reaches every key."""
    return _set(svc, key, body)
