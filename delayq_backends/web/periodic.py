"""Periodic entries in the API: list and show them, add or change one, pause, resume, run now,
backfill a range, remove (``delayq periodic …`` over HTTP; the dashboard's entry actions).

Every action is one call of :mod:`delayq_backends.periodic.ops` (one compare-and-set of the
entry's item), effective at every forwarder from its next claim. An entry's task is built as
``POST /api/v1/celery`` builds one (:class:`~.producers.CeleryProducer`), and an RQ entry's
function passes the same allowlist as ``POST /api/v1/rq``: whoever adds an entry chooses code
the workers run, at every period.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from fastapi import APIRouter, HTTPException, Path, Query, Response, status
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from ..entries import iso
from ..envelope import Envelope
from ..errors import ConfigError, DelayqError, EnvelopeError
from ..kinds import ENTRY_KINDS, view
from ..periodic import ops
from ..periodic.options import CELERY, IMPORT_PATH, MAX_SECONDS, OPTION_FIELDS, RQ, OptionField, RunOptions
from ..periodic.registry import PeriodicError
from ..periodic.schedules import Cron, Every, Misfire, Once, Schedule, interval, zone_named
from ..periodic.state import state_of
from ..timeutil import to_ms
from .api import (
    RESPONSES,
    ErrorOut,
    JsonNumber,
    JsonTime,
    Limit,
    Name,
    Services,
    Svc,
    _available,
    _not_null,
    json_values,
    reading,
)
from .entry_paths import EntryRoute
from .guard import API_PREFIX
from .producers import CeleryProducer, FunctionRefused, ProducerUnavailable, RQProducer

__all__ = ["router"]

router = APIRouter(prefix=API_PREFIX, responses=RESPONSES, route_class=EntryRoute)

#: Longest interval an entry may have (10 years, in seconds): more is a unit mistake.
MAX_EVERY = 315_576_000
#: Most runs an entry may be limited to.
MAX_RUNS = 10**9
#: The optional fields that take no null: leaving one out is the way to say "none".
NOT_NULL = ("task", "func", "every", "cron", "at", "queue", "start", "end", "max_runs", "enabled", "aligned")


class _EntryDefinition(BaseModel):
    """An entry to add, or the whole new definition of one (by ``name``).

    The schedule is exactly one of ``every`` (seconds), ``cron`` (five fields, in ``tz``) or
    ``at`` (one run at that time), ``aligned`` goes with ``every`` only, and a Celery entry names
    its ``task``, an RQ entry its ``func``: the schema says so (``allOf`` two ``oneOf`` and a
    ``dependentRequired``). A crontab or a zone that does not exist is a 422 too, which the
    schema cannot say; so is a run option of the other kind's (``timeout`` on a Celery entry).
    The run options (``expires``, ``priority``, ..., ``on_failure``) are the fields of
    :data:`~delayq_backends.periodic.options.OPTION_FIELDS`, added by :data:`EntryIn`.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"oneOf": [{"required": ["every"]}, {"required": ["cron"]}, {"required": ["at"]}]},
                {"dependentRequired": {"aligned": ["every"]}},
                {
                    "oneOf": [
                        {
                            "properties": {"kind": {"const": "celery"}},
                            "required": ["task"],
                            "not": {"required": ["func"]},
                        },
                        {
                            "properties": {"kind": {"const": "rq"}},
                            "required": ["kind", "func"],
                            "not": {"required": ["task"]},
                        },
                    ]
                },
            ]
        }
    )

    name: Name = Field(description="The entry's name: adding one that exists changes it.")
    kind: Literal["celery", "rq"] = Field("celery", description="Who runs it: a Celery worker or an RQ worker.")
    task: Name | SkipJsonSchema[None] = Field(None, description="The Celery task name (kind celery).")
    func: Annotated[str, Field(max_length=256, pattern=IMPORT_PATH)] | SkipJsonSchema[None] = Field(
        None, description="The RQ job function's import path, module.function (kind rq)."
    )
    every: Annotated[float, Field(ge=0.001, le=MAX_EVERY, allow_inf_nan=False), JsonNumber] | SkipJsonSchema[None] = (
        Field(None, description="Run every this many seconds.")
    )
    aligned: bool | SkipJsonSchema[None] = Field(
        None,
        description="every only: true runs on multiples of the period since the epoch (Celery's relative=True), "
        "false one period after the last; left out: a new entry is not aligned, a changed one kept as it was.",
    )
    cron: Annotated[str, Field(min_length=1, max_length=200)] | SkipJsonSchema[None] = Field(
        None,
        description="A crontab, 'minute hour day-of-month month day-of-week' (Sunday 0), in tz. With both day "
        "fields set, a celery entry runs on days matching both (Celery's crontab), an rq entry on either (cron's).",
    )
    at: Annotated[AwareDatetime, JsonTime] | SkipJsonSchema[None] = Field(
        None, description="One run at this time (ISO-8601 with an offset); then the entry is finished."
    )
    tz: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        "UTC", description="The crontab's time zone: an IANA name (Europe/Berlin) or UTC."
    )
    args: list[Any] = Field(default_factory=list, description="Positional arguments of each run (JSON values).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of each run (JSON values).")
    queue: Name | SkipJsonSchema[None] = Field(
        None, description="The queue; by default Celery's routing decides (RQ: 'default')."
    )
    start: Annotated[AwareDatetime, JsonTime] | SkipJsonSchema[None] = Field(None, description="No period before.")
    end: Annotated[AwareDatetime, JsonTime] | SkipJsonSchema[None] = Field(
        None, description="No period after: then the entry is finished (listed, never fired)."
    )
    max_runs: Annotated[int, Field(ge=1, le=MAX_RUNS), JsonNumber] | SkipJsonSchema[None] = Field(
        None, description="After this many runs the entry is finished."
    )
    jitter: Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False), JsonNumber] = Field(
        0, description="Seconds: each period runs up to this much later (the same delay on every forwarder)."
    )
    misfire: Literal["run_once", "run_all", "skip"] = Field(
        "run_once", description="Periods missed (an outage, a pause): one run, every run, or none."
    )
    misfire_grace: Annotated[float, Field(ge=0, le=MAX_EVERY, allow_inf_nan=False), JsonNumber] = Field(
        60, description="skip: seconds late a run may still go out."
    )
    misfire_max: Annotated[int, Field(ge=1, le=10_000), JsonNumber] = Field(
        100, description="run_all: the most runs one firing sends (the latest)."
    )
    overlap: Literal["allow", "skip", "buffer_one"] = Field(
        "allow", description="A period whose previous run still runs: run anyway, skip it, or wait (one)."
    )
    enabled: bool | SkipJsonSchema[None] = Field(
        None, description="false: stored paused; true: enabled; left out: a new entry is enabled, a changed one kept."
    )
    detach: bool = Field(
        False, description="Changing an entry from code makes it a runtime entry, which syncs no longer manage."
    )

    @field_validator(*NOT_NULL, mode="before")
    @classmethod
    def not_null(cls, value: Any) -> Any:
        return _not_null(value)

    @field_validator("args", "kwargs")
    @classmethod
    def json_only(cls, value: Any) -> Any:
        return json_values(value)

    @field_validator("tz")
    @classmethod
    def known_zone(cls, value: str) -> str:
        try:
            zone_named(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def consistent(self) -> _EntryDefinition:
        given = [k for k in ("every", "cron", "at") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one schedule: every (seconds), cron ('*/5 * * * *', in tz) or at (ISO-8601 time)"
            )
        if self.aligned is not None and self.every is None:
            raise ValueError("aligned applies to an interval (every) only: leave it out")
        if self.cron is not None:
            try:
                Cron.checked(self.cron, self.tz)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        wanted, other = ("task", "func") if self.kind == CELERY else ("func", "task")
        if getattr(self, wanted) is None or getattr(self, other) is not None:
            raise ValueError(f"an entry of kind {self.kind!r} names its {wanted}, not a {other}")
        try:
            self.run_options()
        except PeriodicError as exc:
            raise ValueError(str(exc)) from None
        return self

    def run_options(self) -> RunOptions:
        """The run options given, checked for the entry's kind (PeriodicError if not)."""
        return RunOptions.parse({f.name: getattr(self, f.name, None) for f in OPTION_FIELDS}, self.kind)


def _option_type(f: OptionField) -> Any:
    """The API's type of run option ``f``: its values as :data:`OPTION_FIELDS` says, in the schema
    too; left out means not set (an explicit null is refused, as the other optional fields')."""
    number = JsonNumber
    inner: Any
    if f.value == "int":
        inner = Annotated[int, Field(ge=f.low, le=f.high), number]
    elif f.value == "ints":
        inner = Annotated[list[Annotated[int, Field(ge=f.low, le=f.high), number]], Field(min_length=1, max_length=100)]
    elif f.value == "expires":
        seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False), number]
        inner = seconds | Annotated[AwareDatetime, JsonTime]
    elif f.value == "object":
        inner = Annotated[dict[str, Any], AfterValidator(json_values)]
    elif f.value == "path":
        inner = Annotated[str, Field(max_length=256, pattern=IMPORT_PATH)]
    else:
        inner = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")]
    return Annotated[inner | SkipJsonSchema[None], BeforeValidator(_not_null)]  # type: ignore[misc]


#: The body of ``POST /periodic``: the definition's fields and the run options of
#: :data:`OPTION_FIELDS`, generated from that table (the CLI's flags and the dashboard's form are too).
if TYPE_CHECKING:  # mypy sees the definition's fields; the options are read by name (run_options)
    EntryIn = _EntryDefinition
else:
    EntryIn = create_model(
        "EntryIn",
        __base__=_EntryDefinition,
        __doc__=_EntryDefinition.__doc__,
        **{
            f.name: (_option_type(f), Field(None, description=f"{f.help} ({f.kind} entries; e.g. {f.example})"))
            for f in OPTION_FIELDS
        },
    )


class BackfillIn(BaseModel):
    """A range of periods to run: an end before its start is a 400 saying to swap them."""

    start: Annotated[AwareDatetime, JsonTime] = Field(description="The first period's earliest time (ISO-8601).")
    end: Annotated[AwareDatetime, JsonTime] = Field(description="The last period's latest time (ISO-8601).")


class EntryOut(BaseModel):
    name: str
    item_id: str
    state: str = Field(
        description="scheduled, firing (leased to a forwarder), paused, finished, missing (registered, not in the "
        "store), or why it cannot be read."
    )
    kind: str | None = Field(description="celery or rq; null when unreadable.")
    source: str | None = Field(description="code (synced from beat_schedule or an RQ cron config) or runtime.")
    enabled: bool = Field(description="false: paused (never fired until resumed).")
    finished: bool = Field(description="Past its end, its maximum runs or its one run: listed, never fired.")
    paused_at: str | None = Field(description="When it was paused (UTC).")
    task: str = Field(description="The Celery task or the RQ function.")
    schedule: str
    misfire: str
    overlap: str
    tz: str | None = Field(description="A crontab's time zone.")
    start: str | None = Field(description="No period before (UTC).")
    end: str | None = Field(description="No period after (UTC).")
    max_runs: int | None
    jitter: float = Field(description="Seconds each period may run late, spread by a hash.")
    last_run: str | None = Field(description="The period the last firing ran (UTC).")
    last_sent: str | None = Field(description="When that firing sent it.")
    last_missed: int = Field(description="Periods the last firing skipped or collapsed (misfire policy).")
    next_run: str | None = Field(description="Its next period (UTC); null while paused or finished.")
    runs: int = Field(description="Scheduled periods run (manual and backfill runs aside).")
    skipped: int = Field(description="Periods skipped by its overlap policy.")
    pending_runs: int = Field(description="Manual runs the next firing sends.")
    pending_backfill: int = Field(description="Backfill ranges the next firing runs.")


class ActionIn(BaseModel):
    """``{}``: pause, resume and run take nothing, but every write is JSON (the guard refuses any
    other POST: a form a foreign page could send without a CORS preflight)."""


class DefinitionOut(BaseModel):
    """What the entry runs and when, in the terms ``POST /periodic`` takes (the edit form's)."""

    every: float | None = None
    aligned: bool | None = Field(default=None, description="An interval's alignment; null for other schedules.")
    cron: str | None = None
    tz: str | None = None
    at: str | None = None
    args: list[Any] | None = Field(default=None, description="null: not readable here (an RQ entry's, or not JSON).")
    kwargs: dict[str, Any] | None = None
    queue: str | None = None
    start: str | None = None
    end: str | None = None
    max_runs: int | None = None
    jitter: float = 0
    misfire: str
    misfire_grace: float
    misfire_max: int
    overlap: str
    options: dict[str, Any] = Field(
        default_factory=dict, description="The run options set (expires, priority, ..., on_failure), as POST takes."
    )


class EntryDetailOut(EntryOut):
    definition: DefinitionOut | None = Field(description="Its definition; null when its item cannot be read.")


class EntryListOut(BaseModel):
    entries: list[EntryOut] = Field(description="This page's entries, by name (unreadable registry fields first).")
    next_cursor: str | None = Field(
        default=None, description="The cursor of the next page (pass it as cursor); null: this was the last page."
    )
    hint: str | None = Field(default=None, description="Why there is nothing to show, and what to do.")


#: What an upsert did.
Saved = Literal["added", "changed", "unchanged"]


class SavedOut(BaseModel):
    result: Saved
    entry: EntryOut


class RemovedOut(BaseModel):
    name: str
    removed: bool


# -- routes -----------------------------------------------------------------------------------

#: An entry's name in a path: any name, encoded as ``encodeURIComponent`` does (:mod:`.entry_paths`).
PathName = Annotated[str, Path(min_length=1, max_length=256, description="The entry's name.")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No such entry (`delayq periodic list` lists them)."}
}
REFUSED: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {
        "model": ErrorOut,
        "description": "An entry from code (a change needs detach, a removal force), or one a newer release wrote.",
    },
}
NO_PERIODIC = (
    "no periodic entries: add one (Add entry, POST /api/v1/periodic or `delayq periodic add`), or sync an "
    "app's beat_schedule (`celery -A proj delayq forward` at start, or `celery -A proj delayq periodic sync`)"
)


@contextmanager
def _acting() -> Iterator[None]:
    """The ops' refusals as the client's errors: an unknown name (404), an entry from code
    (409), a definition or range the entry cannot take (400); each detail says what to do."""
    try:
        yield
    except ops.EntryNotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    except ops.CodeEntryError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except PeriodicError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None


def _out(e: ops.EntryStatus) -> dict[str, Any]:
    readable = bool(e.kind)
    return {
        "name": e.name,
        "item_id": e.item_id,
        "state": e.state,
        "kind": e.kind or None,
        "source": e.source if readable else None,
        "enabled": e.enabled,
        "finished": e.finished,
        "paused_at": iso(e.paused_ms),
        "task": e.task,
        "schedule": e.schedule,
        "misfire": e.misfire,
        "overlap": e.overlap,
        "tz": e.tz,
        "start": iso(e.start_ms),
        "end": iso(e.end_ms),
        "max_runs": e.max_runs,
        "jitter": e.jitter_ms / 1000,
        "last_run": iso(e.last_run_ms),
        "last_sent": iso(e.last_sent_ms),
        "last_missed": e.last_missed,
        "next_run": iso(e.next_run_ms),
        "runs": e.runs,
        "skipped": e.skipped,
        "pending_runs": e.run_now,
        "pending_backfill": len(e.backfill),
    }


def _entry(svc: Services, name: str) -> EntryOut:
    with reading(f"periodic entry {name!r}"):
        found = ops.get(svc.store, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(ops.EntryNotFound(name)))
    return EntryOut(**_out(found))


#: A page's place in the registry: digits, as text (a SCAN cursor may exceed JavaScript's integers).
Cursor = Annotated[
    str, Query(pattern=r"^[0-9]{1,20}$", description="0 (the first page), or the next_cursor of the page before.")
]


@router.get("/periodic", response_model=EntryListOut, summary="Periodic entries: schedule, state, last and next run")
def list_entries(svc: Svc, cursor: Cursor = "0", limit: Limit = 100) -> EntryListOut:
    """The entries, Celery and RQ, from code and added at runtime (``delayq periodic list``), a
    page at a time: about ``limit`` of them (a small registry comes whole), by name within the
    page; follow ``next_cursor`` until it is null to see every entry. A page costs the same
    whatever the registry holds."""
    if int(cursor) >= 2**64:  # not a SCAN cursor: no page starts there
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"cursor {cursor} is no page's: pass 0, or a next_cursor")
    with reading("the periodic entries"):
        after, entries = ops.status_page(svc.store, int(cursor), limit)
    hint = NO_PERIODIC if not entries and not int(cursor) and not after else None
    return EntryListOut(
        entries=[EntryOut(**_out(e)) for e in entries], next_cursor=str(after) if after else None, hint=hint
    )


@router.get("/periodic/{name:path}", response_model=EntryDetailOut, responses=NOT_FOUND, summary="One periodic entry")
def get_entry(name: PathName, svc: Svc) -> EntryDetailOut:
    """Its state, and its definition as ``POST /periodic`` takes it (the dashboard's edit form)."""
    entry = _entry(svc, name)
    with reading(f"periodic entry {name!r}"):
        definition = _definition(svc, name)
    return EntryDetailOut(**entry.model_dump(), definition=definition)


@router.post(
    "/periodic",
    status_code=status.HTTP_201_CREATED,
    response_model=SavedOut,
    responses={200: {"model": SavedOut, "description": "An entry of that name was changed (or unchanged)."}, **REFUSED},
    summary="Add a periodic entry, or change one",
)
def upsert_entry(body: EntryIn, svc: Svc, response: Response) -> SavedOut:
    """Effective at every forwarder from its next claim, no restart: 201 for a new entry, 200 for
    a changed one (its run history, pause and next period, if the schedule is the same, kept)."""
    spec = _spec(svc, body)
    with _acting():
        result = ops.upsert(svc.store, spec, detach=body.detach)
    if result == "newer":
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"entry {body.name!r} was written by a newer release of delayq_backends: change it with that one",
        )
    if result != "added":
        response.status_code = status.HTTP_200_OK
    return SavedOut(result=cast(Saved, result), entry=_entry(svc, body.name))


def _action(act: Callable[[], ops.EntryStatus]) -> EntryOut:
    with _acting():
        return EntryOut(**_out(act()))


@router.post("/periodic/{name:path}/pause", response_model=EntryOut, responses=REFUSED, summary="Pause an entry")
def pause_entry(_: ActionIn, name: PathName, svc: Svc) -> EntryOut:
    """It never fires until resumed (a forwarder that claimed it in a race sends nothing)."""
    return _action(lambda: ops.pause(svc.store, name))


@router.post("/periodic/{name:path}/resume", response_model=EntryOut, responses=REFUSED, summary="Resume an entry")
def resume_entry(_: ActionIn, name: PathName, svc: Svc) -> EntryOut:
    """Due at its next period, or now if that passed: its misfire policy decides what the periods
    missed while paused send."""
    return _action(lambda: ops.resume(svc.store, name))


@router.post("/periodic/{name:path}/run", response_model=EntryOut, responses=REFUSED, summary="Run an entry now")
def run_entry(_: ActionIn, name: PathName, svc: Svc) -> EntryOut:
    """One extra run, sent by the next firing (due now, paused or not), exactly once; the schedule
    is untouched."""
    return _action(lambda: ops.run_now(svc.store, name))


@router.post(
    "/periodic/{name:path}/backfill", response_model=EntryOut, responses=REFUSED, summary="Run an entry's past periods"
)
def backfill_entry(body: BackfillIn, name: PathName, svc: Svc) -> EntryOut:
    """Every period of its schedule from ``start`` to ``end`` runs, sent by the next firing (at
    most 10,000: a wider range is a 400 saying to split it)."""
    return _action(lambda: ops.backfill(svc.store, name, to_ms(body.start), to_ms(body.end)))


@router.delete("/periodic/{name:path}", response_model=RemovedOut, responses=REFUSED, summary="Remove an entry")
def remove_entry(
    name: PathName,
    svc: Svc,
    force: Annotated[bool, Query(description="Remove an entry from code (the next sync adds it back).")] = False,
) -> RemovedOut:
    """A forwarder firing it now sends that run and stops."""
    with _acting():
        removed = ops.remove(svc.store, [name], force=force)
    if not removed:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(ops.EntryNotFound(name)))
    return RemovedOut(name=name, removed=True)


# -- definitions --------------------------------------------------------------------------------


def _schedule(body: EntryIn) -> Schedule:
    if body.every is not None:
        return interval(body.every)
    if body.cron is not None:
        return Cron.checked(body.cron, body.tz, day_or=ENTRY_KINDS[body.kind].day_or)  # the kind's reading
    assert body.at is not None  # EntryIn: exactly one schedule
    return Once(to_ms(body.at))


def _spec(svc: Services, body: EntryIn) -> ops.EntrySpec:
    """The entry ``body`` defines, its run built by the producer of its kind (an RQ function
    checked against ``--rq-allow``: 403). What the schema cannot rule out is a 400 saying why."""
    try:
        return _built(svc, body)
    except (FunctionRefused, ProducerUnavailable):
        raise
    except (DelayqError, ValueError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None


def _built(svc: Services, body: EntryIn) -> ops.EntrySpec:
    schedule = ops.keep_alignment(svc.store, body.name, _schedule(body), body.aligned)
    run_options = body.run_options()
    if body.kind == RQ:
        producer: RQProducer = _available(svc.rq)
        misfire = Misfire(body.misfire, body.misfire_grace, body.misfire_max)
        return producer.entry(
            body.name, body.func or "", queue=body.queue or "default", args=body.args, kwargs=body.kwargs,
            schedule=schedule, misfire=misfire, overlap=body.overlap, enabled=body.enabled,
            start_ms=_ms(body.start), end_ms=_ms(body.end), max_runs=body.max_runs, jitter_ms=round(body.jitter * 1000),
            options=run_options,
        )  # fmt: skip
    options: dict[str, Any] = {
        **run_options.celery(),
        "delayq_misfire": body.misfire,
        "delayq_misfire_grace": body.misfire_grace,
        "delayq_misfire_max": body.misfire_max,
        "delayq_overlap": body.overlap,
        "delayq_jitter": body.jitter,
    }
    for key, value in (
        ("queue", body.queue), ("delayq_start", body.start), ("delayq_end", body.end),
        ("delayq_max_runs", body.max_runs), ("delayq_enabled", body.enabled),
    ):  # fmt: skip
        if value is not None:
            options[key] = value
    celery: CeleryProducer = _available(svc.celery)
    conf = {"task": body.task, "schedule": schedule, "args": body.args, "kwargs": body.kwargs, "options": options}
    return celery.entry(body.name, conf)


def _ms(when: datetime | None) -> int | None:
    return None if when is None else to_ms(when)


def _definition(svc: Services, name: str) -> DefinitionOut | None:
    """Entry ``name``'s definition as :class:`EntryIn` takes it; None when its item cannot be read.
    An RQ entry's arguments are RQ's serialized data, not read here (null)."""
    item = svc.store.get(ops.item_id(name))
    if item is None:
        return None
    try:
        envelope = Envelope.decode(item.envelope)
        state = state_of(envelope)
    except EnvelopeError:
        return None
    s = state.schedule
    out = DefinitionOut(
        every=s.every_ms / 1000 if isinstance(s, Every) else None,
        aligned=s.aligned if isinstance(s, Every) else None,
        cron=s.expression if isinstance(s, Cron) else None,
        tz=s.zone if isinstance(s, Cron) else None,
        at=iso(s.at_ms) if isinstance(s, Once) else None,
        start=iso(state.start_ms),
        end=iso(state.end_ms),
        max_runs=state.max_runs,
        jitter=state.jitter_ms / 1000,
        misfire=state.misfire.policy,
        misfire_grace=state.misfire.grace,
        misfire_max=state.misfire.max_runs,
        overlap=state.overlap,
        queue=envelope.destination or None,
        options=state.options.to_json(),
    )
    run = view(envelope) or {}
    if "args" in run:  # a Celery entry's run as the worker gets it
        out.args, out.kwargs, out.queue = run["args"], run["kwargs"], run["queue"]
    return out
