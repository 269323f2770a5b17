"""The HTTP API, ``/api/v1``: schedule, inspect, cancel and reschedule items; stats and dead letters.

Every route needs the token (see :mod:`.auth`). Bad input is a 4xx whose ``detail`` says what
to fix; an unreachable store is a 503 (see :mod:`.app`); never a 500 for anything a client sent.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from ..audit import FORWARDED, stream_record
from ..entries import around_bad_shards, dead_entry, iso, item_entry, listed_at, stats_entry, why_entry
from ..errors import DelayqError
from ..keys import normalize_id
from ..models import WHY_STATES, CancelOutcome, RescheduleOutcome, ShardStats
from ..percentile import percentile
from ..store import DelayStore, SlotKeyList
from ..store.groupboard import GroupKeyList
from ..store.keylist import KeyList
from ..timeutil import to_ms
from .guard import API_PREFIX
from .producers import CeleryProducer, ProducerUnavailable, RQProducer, ScheduleResult

__all__ = ["RESPONSES", "Services", "UnreadableData", "router"]

#: Longer than any schedule (10,000 years): a bigger number is a unit mistake, and Python's
#: timedelta could not even hold it.
MAX_COUNTDOWN = 315_576_000_000

#: Most items one listing or one dead-letter action takes: a page, not a dump of the store.
MAX_PAGE = 1000

#: Deepest item a listing reaches (offset + limit): each shard reads that many entries per call,
#: so a deep offset would hold Redis for as long as a scan of the store.
MAX_DEPTH = 10_000
MAX_OFFSET = MAX_DEPTH - MAX_PAGE


@dataclass
class Services:
    """What the routes work with; :func:`~delayq_backends.web.app.create_app` builds it."""

    store: DelayStore
    celery: CeleryProducer | ProducerUnavailable
    rq: RQProducer | ProducerUnavailable
    audit_stream: str | None
    #: the slot keys in use, listed again every few seconds (:mod:`.slots`)
    slot_keys: SlotKeyList
    #: the batch keys, listed again every few seconds (:mod:`.batches`)
    batch_keys: KeyList
    #: the groups in use, listed again every few seconds (:mod:`.groups`)
    group_keys: GroupKeyList


class UnreadableData(DelayqError):
    """A value in the store this server cannot read: written around delayq, or corrupt (a 503)."""


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Turn a value that cannot be parsed into a 503 naming ``what``: one bad value fails the one
    request (and the one dashboard section) that met it, with the reason, never as a 500."""
    try:
        yield
    except DelayqError:
        raise
    except (ValueError, TypeError, OverflowError, IndexError) as exc:  # UnicodeDecodeError is a ValueError
        raise UnreadableData(
            f"{what} cannot be read: the store holds a value delayq did not write ({type(exc).__name__}: {exc}); "
            "the other routes still answer; find the bad entry with `delayq list --shard N` or `delayq dlq list`"
        ) from exc


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


Svc = Annotated[Services, Depends(services)]


def _digits(value: Any) -> Any:
    """A query number as digits only: ``offset=0.0`` or ``limit=1e3`` is a client's mistake, not a number."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError(f"{value!r} is not a whole number: send digits only, like 50")
    return value


def _shallow(value: Any) -> Any:
    """Refuse a deep offset with the way out (the bound itself is the schema's maximum)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and int(value) > MAX_OFFSET:
        raise ValueError(
            f"offset {value} is over {MAX_OFFSET}: listings reach {MAX_DEPTH} items deep at most, so that "
            "one request cannot hold Redis; look an item up by id, or use `delayq list --shard N` for a shard"
        )
    return value


Digits = BeforeValidator(_digits)
#: paging of the list routes: offset + limit stays within MAX_DEPTH
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET), Digits, BeforeValidator(_shallow)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE), Digits]


# -- models -----------------------------------------------------------------------------------


class ErrorOut(BaseModel):
    detail: str


class ValidationErrorOut(BaseModel):
    detail: str = Field(description="Every problem of the request, one per line.")
    errors: list[dict[str, Any]] = Field(
        description="The same problems, each with its location (loc) and message (msg)."
    )


def _json_number(value: Any) -> Any:
    """Refuse ``true`` and ``"5"`` where the schema wants a number (pydantic would turn them into 1
    and 5); ``5.0`` stays, since JSON Schema counts it as an integer."""
    if isinstance(value, (bool, str)):
        raise ValueError(f"{value!r} is not a number: send a JSON number")
    return value


#: Goes after a type's constraints (``Annotated[int, Field(ge=0), JsonNumber]``): placed before them,
#: pydantic would leave ``ge``/``le`` untranslated in the JSON schema.
JsonNumber = BeforeValidator(_json_number)


def _json_time(value: Any) -> Any:
    """Refuse a number where the schema wants an ISO-8601 string: pydantic would read ``255`` as
    seconds since 1970, and seconds or milliseconds is exactly the guess an API must not make."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{value!r} is not a time: send an ISO-8601 string with an offset, like 2030-01-31T12:00:00Z")
    return value


#: The string-only twin of :data:`JsonNumber`, for times.
JsonTime = BeforeValidator(_json_time)


def json_values(value: Any) -> Any:
    """Refuse NaN and infinities in arguments: they are not JSON, and workers' parsers would choke on them."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError("NaN and Infinity are not JSON: send finite numbers") from None
    return value


def _not_null(value: Any) -> Any:
    """Refuse an explicit null where the schema has none: leaving the field out is the way to say "not this"."""
    if value is None:
        raise ValueError("null is not allowed here: leave the field out instead")
    return value


class DueTime(BaseModel):
    """A ready time: ``eta`` (ISO-8601 with an offset) or ``countdown`` (seconds from now).

    Neither field takes null, and the schema says "exactly one" (``oneOf``), so generated clients
    and schema-driven tests know the rule the validator enforces.
    """

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["eta"]}, {"required": ["countdown"]}]})

    eta: Annotated[AwareDatetime, JsonTime] | SkipJsonSchema[None] = Field(
        None, description="When it is due, ISO-8601 with an offset: 2030-01-31T12:00:00Z."
    )
    countdown: (
        Annotated[float, Field(ge=0, le=MAX_COUNTDOWN, allow_inf_nan=False), JsonNumber] | SkipJsonSchema[None]
    ) = Field(None, description="Seconds from now; instead of eta.")

    @field_validator("eta", "countdown", mode="before")
    @classmethod
    def not_null(cls, value: Any) -> Any:
        return _not_null(value)

    @model_validator(mode="after")
    def one_of(self) -> DueTime:
        if (self.eta is None) == (self.countdown is None):
            raise ValueError("give exactly one of eta (ISO-8601 with an offset) or countdown (seconds from now)")
        return self

    def ready_ms(self, store: DelayStore) -> int:
        """Integer ms; a countdown counts from the store server's clock, as forwarders do."""
        if self.eta is not None:
            return to_ms(self.eta)
        return to_ms(timedelta(seconds=self.countdown or 0.0), clock=store.clock)


#: A task, queue, exchange or routing key name: printable text (no control characters).
Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]


class CallIn(DueTime):
    """What every scheduled call has: a ready time, arguments and an optional id."""

    args: list[Any] = Field(default_factory=list, description="Positional arguments (JSON values).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments (JSON values).")
    id: str | None = Field(None, min_length=1, max_length=200, description="The task/job id; a UUID by default.")

    @field_validator("args", "kwargs")
    @classmethod
    def json_only(cls, value: Any) -> Any:
        return json_values(value)


class CeleryIn(CallIn):
    task: Name = Field(description="The task name, as the workers register it.")
    queue: Name | None = Field(None, description="The queue; by default Celery's routing decides.")
    routing_key: Name | None = None
    exchange: Name | None = None
    priority: Annotated[int, Field(ge=0, le=255), JsonNumber] | None = None
    mode: Literal["replace", "keep"] = Field("replace", description="An existing id: replace it, or keep it as it is.")


class RQIn(CallIn):
    func: str = Field(
        max_length=256,
        pattern=r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$",
        description="The job function's import path, module.function; imported by the worker only.",
    )
    queue: str = Field("default", min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.:-]+$")
    timeout: Annotated[int, Field(ge=-1, le=10**9), JsonNumber] | None = Field(
        None, description="Seconds the job may run (-1: no limit)."
    )
    result_ttl: Annotated[int, Field(ge=-1, le=10**9), JsonNumber] | None = Field(
        None, description="Seconds its result is kept (-1: for ever)."
    )
    ttl: Annotated[int, Field(ge=1, le=10**9), JsonNumber] | None = Field(
        None, description="Seconds it may wait in its queue."
    )
    failure_ttl: Annotated[int, Field(ge=-1, le=10**9), JsonNumber] | None = Field(
        None, description="Seconds a failure is kept (-1: for ever)."
    )
    description: str | None = Field(None, max_length=1000)


class ScheduledOut(BaseModel):
    id: str
    shard: int
    ready: str
    result: ScheduleResult


class ItemOut(BaseModel):
    id: str
    shard: int
    ready: str
    attempts: int
    leased_until: str | None
    awaiting_start: bool = Field(
        default=False,
        description="Published in lossless mode, kept until a worker records its start; leased_until is when "
        "a forwarder looks again (and publishes it again if it has not started).",
    )
    parked: str | None = Field(
        default=None,
        description="Why the item is parked (`format:<n>`: an envelope format newer than the forwarders that "
        "claimed it read; `target:<kind>`: they have no such target): out of the due index, looked at again "
        "every 30 s by each forwarder, released by one that can deliver it; else null.",
    )
    rank: int = Field(description="Backlog priority: higher ranks are forwarded first (0..255).")
    target: str | None
    destination: str | None
    corrupt: str | None = Field(description="Why the stored envelope cannot be read, else null.")
    newer_format: int | None = Field(
        default=None,
        description="The envelope's format when a newer delayq wrote it (not corrupt: upgrade this reader to "
        "read it; forwarders of that release deliver it), else null.",
    )
    size: int
    task: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A Celery message's task, args/kwargs (JSON bodies only), eta, queue and priority; a periodic entry's "
            "next run (Celery: as a task; RQ: its job id, function, description and queue), with the entry's name "
            "in `periodic`; else null."
        ),
    )
    collapsed: dict[str, Any] | None = Field(
        default=None,
        description="A debounced or throttled item's mode, key and the schedules its pending run collapsed "
        "(`calls`); else null.",
    )


class WhyOut(BaseModel):
    """Why an item is where it is (``delayq why``): its state, the answer in one line, and the
    details its state has (null where it has none)."""

    id: str
    state: Literal[WHY_STATES] = Field(  # type: ignore[valid-type]
        description="unknown, dead, scheduled (not due yet), due, leased (a forwarder holds it), awaiting_start "
        "(lossless mode), flow (held by flow control), group_paused, group_throttled, group_limit, group_rate, "
        "group_line (behind other items of its group), parked."
    )
    line: str = Field(description="The answer in one line, as `delayq why` prints it.")
    until: str | None = Field(description="When the state ends or is looked at again, when known.")
    since: str | None = Field(description="When the state began, when known (a dead letter's death).")
    ready: str | None = Field(description="The item's own ready time.")
    attempts: int | None = Field(description="A dead letter's delivery attempts.")
    group: str | None = Field(description="The group that holds it back.")
    running: int | None = Field(description="Items holding that group's slots.")
    running_ids: list[str] = Field(description="The first of their ids.")
    limit: int | None = Field(description="The group's limit as applied (null: none).")
    ahead: int | None = Field(description="Items before it in its group's line.")
    queue: str | None = Field(description="Its destination queue (what flow control holds).")
    forwarder: str | None = Field(description="The forwarder holding its lease, when its claim names one.")
    reason: str | None = Field(description="A parked item's reason, a dead letter's error, a group's pauser.")


class ItemsOut(BaseModel):
    items: list[ItemOut]
    problems: list[str] = Field(default_factory=list, description="Shards that could not be read, and why.")


class CancelledOut(BaseModel):
    id: str
    cancelled: bool


class ShardOut(BaseModel):
    shard: int | Literal["total"]
    scheduled: int
    due: int
    leased: int
    dead: int
    parked: int = Field(default=0, description="Items parked out of the due index (see ItemOut.parked).")
    next_due: str | None
    oldest_overdue_ms: int
    problem: str | None = Field(
        description="Why the counts are incomplete (the shards that cannot be read), else null."
    )


class StatsOut(BaseModel):
    now: str
    prefix: str
    shards: list[ShardOut]
    totals: ShardOut


class DueOut(BaseModel):
    start: str = Field(description="Start of the first bucket (the server's clock, whole minute).")
    bucket_minutes: int
    overdue: int = Field(description="Items already due before start (leased ones count at their lease deadline).")
    counts: list[int] = Field(description="Items falling due in each bucket.")


class DeadOut(BaseModel):
    id: str
    shard: int
    died_at: str
    attempts: int
    error: str
    ready: str | None


class DeadListOut(BaseModel):
    items: list[DeadOut]
    problems: list[str] = Field(default_factory=list, description="Shards that could not be read, and why.")


class DeadActionIn(BaseModel):
    """Which dead letters: ``ids``, or ``all: true`` (exactly one of them; neither takes null)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["ids"]}, {"required": ["all"]}]})

    ids: Annotated[list[str], Field(min_length=1, max_length=MAX_PAGE)] | SkipJsonSchema[None] = Field(
        None, description="These dead letters..."
    )
    all: Literal[True] | SkipJsonSchema[None] = Field(None, description="...or every one.")

    @field_validator("ids", mode="before")
    @classmethod
    def not_null(cls, value: Any) -> Any:
        return _not_null(value)

    @field_validator("all", mode="before")
    @classmethod
    def only_true(cls, value: Any) -> Any:
        """Exactly ``true``: a Literal would also take 1."""
        if value is not True:
            raise ValueError("all must be true, or left out to pass ids")
        return value

    @model_validator(mode="after")
    def one_of(self) -> DeadActionIn:
        if (self.ids is None) == (self.all is None):
            raise ValueError("give either ids (a list of dead letter ids) or all=true, not both and not neither")
        return self


class DoneOut(BaseModel):
    done: int = Field(description="How many dead letters were requeued or purged.")


class LateOut(BaseModel):
    id: str
    target: str
    queue: str
    ready: str
    forwarded_at: str
    late_ms: int


class LatenessOut(BaseModel):
    source: str | None = Field(description="The audit stream read, or null when none is configured.")
    hint: str | None = Field(description="What to configure when there is nothing to show.")
    count: int
    p50_ms: int | None
    p95_ms: int | None
    max_ms: int | None
    records: list[LateOut] = Field(description="The most recent forwards, latest first.")


# -- routes -----------------------------------------------------------------------------------

#: What any route may answer besides its own result (every router of the API shares them).
RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "Bad input; detail says what to fix."},
    401: {"model": ErrorOut, "description": "No token."},
    403: {"model": ErrorOut, "description": "Wrong token, a cross-site write, or an RQ function not allowed."},
    408: {"model": ErrorOut, "description": "The body did not arrive in time."},
    413: {"model": ErrorOut, "description": "The body is over the cap, or the message over max_payload_bytes."},
    415: {"model": ErrorOut, "description": "A write that is not application/json."},
    422: {"model": ValidationErrorOut, "description": "The request does not match the schema."},
    501: {"model": ErrorOut, "description": "This server was not set up to schedule for that framework."},
    503: {"model": ErrorOut, "description": "The delay store is unreachable or refused the write."},
}

router = APIRouter(prefix=API_PREFIX, responses=RESPONSES)

ItemId = Annotated[str, Path(min_length=1, max_length=200, description="The item (task/job) id.")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "No such item is scheduled."}}
#: Cancel and reschedule also say when a forwarder holds the item.
IN_FLIGHT: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {"model": ErrorOut, "description": "The item is in flight: detail says what happened to it."},
}


def _available(producer: CeleryProducer | RQProducer | ProducerUnavailable) -> Any:
    if isinstance(producer, ProducerUnavailable):
        raise ProducerUnavailable(str(producer))  # a fresh one: the stored one would pile up tracebacks
    return producer


def _scheduled(svc: Services, item_id: str, ready_ms: int, result: ScheduleResult) -> ScheduledOut:
    return ScheduledOut(id=item_id, shard=svc.store.shard_of(item_id), ready=iso(ready_ms) or "", result=result)


@router.post(
    "/celery", status_code=status.HTTP_201_CREATED, response_model=ScheduledOut, summary="Schedule a Celery task"
)
def schedule_celery(body: CeleryIn, svc: Svc) -> ScheduledOut:
    """Store a call of a Celery task by name, exactly as the Celery adapter stores ``apply_async(eta=…)``."""
    producer: CeleryProducer = _available(svc.celery)
    item_id = normalize_id(body.id or str(uuid.uuid4()))
    ready = body.ready_ms(svc.store)
    options = {
        "queue": body.queue,
        "routing_key": body.routing_key,
        "exchange": body.exchange,
        "priority": body.priority,
    }
    result = producer.schedule(body.task, item_id, ready, body.args, body.kwargs, options=options, mode=body.mode)
    return _scheduled(svc, item_id, ready, result)


@router.post("/rq", status_code=status.HTTP_201_CREATED, response_model=ScheduledOut, summary="Schedule an RQ job")
def schedule_rq(body: RQIn, svc: Svc) -> ScheduledOut:
    """Save an RQ job of a function path and schedule it, as ``delayq_backends.rq.Queue.enqueue_at`` does."""
    producer: RQProducer = _available(svc.rq)
    item_id = normalize_id(body.id or str(uuid.uuid4()))
    ready = body.ready_ms(svc.store)
    options = {k: getattr(body, k) for k in ("timeout", "result_ttl", "ttl", "failure_ttl", "description")}
    existed = svc.store.exists(item_id)
    producer.schedule(body.func, item_id, ready, body.args, body.kwargs, queue=body.queue, job_options=options)
    return _scheduled(svc, item_id, ready, "replaced" if existed else "added")


def _item(svc: Services, item_id: str) -> ItemOut:
    with reading(f"item {item_id!r}"):
        item = svc.store.get(item_id)
        if item is not None:
            return ItemOut(**item_entry(item))
    raise HTTPException(
        status.HTTP_404_NOT_FOUND, f"no item {item_id!r} is scheduled (forwarded, cancelled, or never scheduled)"
    )


def _cancel(svc: Services, item_id: str) -> CancelledOut:
    outcome = svc.store.cancel(item_id)
    if outcome is CancelOutcome.NOT_FOUND:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no item {item_id!r} is scheduled, so nothing was cancelled")
    if outcome is CancelOutcome.IN_FLIGHT:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"item {item_id!r} was in flight: it is removed from the store, but a forwarder held it and may "
            "have published it already, so it may still run once",
        )
    return CancelledOut(id=item_id, cancelled=True)


def _reschedule(svc: Services, item_id: str, body: DueTime) -> ItemOut:
    # epoch seconds, the store's numeric form: ms / 1000 comes back to the same integer ms
    outcome = svc.store.reschedule(item_id, body.ready_ms(svc.store) / 1000)
    if outcome is RescheduleOutcome.NOT_FOUND:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no item {item_id!r} is scheduled, so nothing was moved")
    if outcome is RescheduleOutcome.IN_FLIGHT:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"item {item_id!r} is in flight (a forwarder holds it and may have published it): left as it is; "
            "retry once it is delivered or given back",
        )
    return _item(svc, item_id)


#: A shard filter; null is not in the schema (leaving it out means every shard).
Shard = Annotated[
    Annotated[int, Field(ge=0, le=65535)] | SkipJsonSchema[None], Query(description="Only this shard."), Digits
]


@router.get("/items", response_model=ItemsOut, summary="Upcoming items, earliest first")
def list_items(svc: Svc, offset: Offset = 0, limit: Limit = 50, shard: Shard = None) -> ItemsOut:
    with reading("the upcoming items"):
        items, problems = around_bad_shards(
            svc.store, shard, offset, limit, lambda s, n: svc.store.scheduled(shard=s, count=n), listed_at
        )
        return ItemsOut(items=[ItemOut(**item_entry(i)) for i in items], problems=problems)


#: Ids in the query: any id reaches these, ``.``, ``..`` and ``a/b`` included, which clients and
#: browsers rewrite or split as path segments.
QueryId = Annotated[str, Query(alias="id", min_length=1, max_length=200, description="The item (task/job) id.")]


@router.get("/item", response_model=ItemOut, responses=NOT_FOUND, summary="One scheduled item, by ?id=")
def get_item_by_query(item_id: QueryId, svc: Svc) -> ItemOut:
    return _item(svc, item_id)


@router.get("/item/why", response_model=WhyOut, summary="Why an item is where it is, by ?id=")
def why_item(item_id: QueryId, svc: Svc) -> WhyOut:
    """Answers for every id (200): an id the store does not hold has state ``unknown``."""
    with reading(f"item {item_id!r}"):
        return WhyOut(**why_entry(svc.store.why(item_id)))


@router.delete("/item", response_model=CancelledOut, responses=IN_FLIGHT, summary="Cancel an item, by ?id=")
def cancel_item_by_query(item_id: QueryId, svc: Svc) -> CancelledOut:
    return _cancel(svc, item_id)


@router.post("/item/reschedule", response_model=ItemOut, responses=IN_FLIGHT, summary="Move an item, by ?id=")
def reschedule_item_by_query(body: DueTime, item_id: QueryId, svc: Svc) -> ItemOut:
    """Move a scheduled item to a new time; its attempts start again and any lease on it is dropped."""
    return _reschedule(svc, item_id, body)


@router.get("/items/{item_id:path}", response_model=ItemOut, responses=NOT_FOUND, summary="One scheduled item")
def get_item(item_id: ItemId, svc: Svc) -> ItemOut:
    """For ids that are a plain path segment; ``GET /item?id=`` reaches every id."""
    return _item(svc, item_id)


@router.delete("/items/{item_id:path}", response_model=CancelledOut, responses=IN_FLIGHT, summary="Cancel an item")
def cancel_item(item_id: ItemId, svc: Svc) -> CancelledOut:
    """For ids that are a plain path segment; ``DELETE /item?id=`` reaches every id."""
    return _cancel(svc, item_id)


@router.post("/items/{item_id:path}/reschedule", response_model=ItemOut, responses=IN_FLIGHT, summary="Move an item")
def reschedule_item(body: DueTime, item_id: ItemId, svc: Svc) -> ItemOut:
    """Move a scheduled item to a new time; its attempts start again and any lease on it is dropped.
    ``POST /item/reschedule?id=`` reaches every id."""
    return _reschedule(svc, item_id, body)


def _shard_out(label: int | Literal["total"], group: list[ShardStats]) -> ShardOut:
    """A shard's (or the totals') counts; ``problem`` names the shards that could not be read."""
    problems = [s.error for s in group if s.error]
    return ShardOut(**stats_entry(label, group), problem="; ".join(problems) or None)


@router.get("/stats", response_model=StatsOut, summary="Counts per shard and in total")
def stats(svc: Svc) -> StatsOut:
    with reading("the shard counts"):
        per_shard = svc.store.stats()
        return StatsOut(
            now=iso(per_shard[0].now_ms) or "",
            prefix=svc.store.config.prefix,
            shards=[_shard_out(s.shard, [s]) for s in per_shard],
            totals=_shard_out("total", per_shard),
        )


@router.get("/due", response_model=DueOut, summary="How many items fall due per bucket from now on")
def due(
    svc: Svc,
    minutes: Annotated[int, Query(ge=1, le=7 * 1440, description="How far ahead to look."), Digits] = 1440,
    bucket_minutes: Annotated[
        int, Query(ge=1, le=1440, description="Bucket width; at most 1440 buckets in all."), Digits
    ] = 5,
) -> DueOut:
    """Counts from ZCOUNT per shard and bucket (no scan); cost grows with buckets x shards."""
    buckets = math.ceil(minutes / bucket_minutes)
    if buckets > 1440:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"{buckets} buckets is over 1440: raise bucket_minutes or lower minutes"
        )
    start = svc.store.clock() // 60_000 * 60_000
    with reading("the due counts"):
        overdue, counts = svc.store.due_histogram(start, bucket_minutes * 60_000, buckets)
    return DueOut(start=iso(start) or "", bucket_minutes=bucket_minutes, overdue=overdue, counts=counts)


@router.get("/dead", response_model=DeadListOut, summary="Dead letters, most recent first")
def dead(svc: Svc, offset: Offset = 0, limit: Limit = 50, shard: Shard = None) -> DeadListOut:
    with reading("the dead letters"):
        letters, problems = around_bad_shards(
            svc.store, shard, offset, limit, lambda s, n: svc.store.dead_letters(shard=s, count=n), lambda d: -d.died_ms
        )
        return DeadListOut(items=[DeadOut(**dead_entry(d)) for d in letters], problems=problems)


@router.post("/dead/requeue", response_model=DoneOut, summary="Schedule dead letters again, due now")
def requeue(body: DeadActionIn, svc: Svc) -> DoneOut:
    return DoneOut(done=svc.store.requeue_dead(body.ids))


@router.post("/dead/purge", response_model=DoneOut, summary="Delete dead letters for good")
def purge(body: DeadActionIn, svc: Svc) -> DoneOut:
    return DoneOut(done=svc.store.purge_dead(body.ids))


@router.get("/lateness", response_model=LatenessOut, summary="How late recent items were forwarded")
def lateness(svc: Svc, limit: Limit = 200) -> LatenessOut:
    """From the forwarders' audit stream (``delayq forward --audit-stream``) on the store's server."""
    if svc.audit_stream is None:
        return LatenessOut(
            source=None,
            hint="start forwarders with --audit-stream KEY and this dashboard with the same --audit-stream",
            count=0, p50_ms=None, p95_ms=None, max_ms=None, records=[],
        )  # fmt: skip
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], svc.store.client.xrevrange(svc.audit_stream, count=limit))
    with reading(f"the audit stream {svc.audit_stream!r}"):
        records = [
            r for r in (stream_record(raw) for _, raw in entries) if r.event == FORWARDED and r.ready_ms is not None
        ]
    out = [
        LateOut(
            id=r.id,
            target=r.target,
            queue=r.queue,
            ready=iso(r.ready_ms) or "",
            forwarded_at=iso(r.at_ms) or "",
            late_ms=max(0, r.at_ms - (r.ready_ms or 0)),
        )  # fmt: skip
        for r in records
    ]
    late = sorted(r.late_ms for r in out)
    hint = None if out else f"no forwards recorded in {svc.audit_stream!r} yet"
    return LatenessOut(
        source=svc.audit_stream, hint=hint, count=len(out),
        p50_ms=percentile(late, 0.5), p95_ms=percentile(late, 0.95), max_ms=late[-1] if late else None,
        records=out,
    )  # fmt: skip
