"""The per-entry run options of periodic entries: one definition for every way an entry is made.

Teams moving from ``celery beat``/django-celery-beat set ``expires``, ``priority``, ``headers``
and routing on each entry, and RQ users set a job's ``timeout``, ``result_ttl``, ``ttl``,
``meta``, ``retry`` and callbacks. :data:`OPTION_FIELDS` names each of them once (its key, which
kind of entry takes it, what values it takes, its help), and :class:`RunOptions` is the typed
record of one entry's options, checked against that table. The ``delayq periodic add/update``
flags (``cli/periodic.py``), the fields of ``POST /api/v1/periodic`` (``web/periodic.py``) and
the dashboard's entry form are all generated from :data:`OPTION_FIELDS`, so none of them can
grow a field the others lack, or check a value another takes.

The record is kind-neutral data (this package imports neither Celery nor RQ): each kind's adapter
applies it when it builds the entry's run template, Celery's as ``apply_async`` options
(:meth:`RunOptions.celery`), RQ's as ``Queue.enqueue``'s job options (:meth:`RunOptions.rq`). The
entry's state keeps the options as given (``PeriodicState.options``), so an edit form and
``delayq periodic show`` read them back as they were set.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from ..errors import DelayqError
from ..timeutil import parse_iso, to_ms
from .registry import PeriodicError

__all__ = [
    "CELERY",
    "IMPORT_PATH",
    "KINDS",
    "MAX_SECONDS",
    "OPTION_FIELDS",
    "RQ",
    "OptionField",
    "RunOptions",
    "check_import_path",
]

#: the two kinds of entry, as ``--kind`` and the API's ``kind`` name them
CELERY = "celery"
RQ = "rq"
KINDS = (CELERY, RQ)

#: the longest time an option may give in seconds (10 years): more is a unit mistake
MAX_SECONDS = 315_576_000

#: a function as RQ imports it: dotted identifiers, a module and the name in it
IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
_IMPORT_PATH = re.compile(IMPORT_PATH)


def check_import_path(value: Any, what: str) -> str:
    """``value`` if it is an import path RQ can resolve (``module.function``), else a refusal
    saying what to give: RQ would accept any text at enqueue and fail at every run.

    Raises:
        PeriodicError: not a dotted path (``what`` names the flag or field).
    """
    if isinstance(value, str) and len(value) <= 256 and _IMPORT_PATH.match(value):
        return value
    raise PeriodicError(
        f"{what} {value!r} is not an import path: give the function as module.function (e.g. myapp.jobs.report), "
        "the dotted path an RQ worker imports it by; the module must be importable on the workers"
    )


# -- the table ---------------------------------------------------------------------------------------

#: how a field's values are read: ``int`` (in ``low..high``), ``expires`` (seconds after each send,
#: or a time with its offset), ``object`` (a JSON object), ``ints`` (a list of seconds), ``text``
#: (1..255 characters), ``path`` (an import path)
VALUE_TYPES = ("int", "expires", "object", "ints", "text", "path")


@dataclass(frozen=True)
class OptionField:
    """One run option: its key (the API's field, the record's attribute; the CLI flag is
    :attr:`flag`), the kind of entry that takes it, how its values are read (:data:`VALUE_TYPES`),
    the bounds of an ``int`` (or of each of ``ints``), its help and an example value."""

    name: str
    kind: str
    value: str
    help: str
    example: str
    low: int | None = None
    high: int | None = None

    @property
    def flag(self) -> str:
        """The ``delayq periodic add/update`` flag."""
        return "--" + self.name.replace("_", "-")

    @property
    def label(self) -> str:
        """The dashboard form's label."""
        return self.name.replace("_", " ").capitalize()


OPTION_FIELDS: tuple[OptionField, ...] = (
    OptionField(
        "expires", CELERY, "expires",
        "Each run expires this many seconds after it is sent, or at this time (ISO 8601 with its offset): a "
        "worker discards a run it receives later (celery beat's and django-celery-beat's expires).",
        "30",
    ),
    OptionField("priority", CELERY, "int", "The runs' message priority (0-255; the broker's range applies).", "5",
                0, 255),
    OptionField("headers", CELERY, "object", "Extra message headers of each run (a JSON object).", '{"team": "ops"}'),
    OptionField("exchange", CELERY, "text", "The exchange each run is published to (default: the routing's).",
                "tasks"),
    OptionField("routing_key", CELERY, "text", "The routing key of each run (default: the routing's).", "tasks.low"),
    OptionField("timeout", RQ, "int", "The job's timeout in seconds (RQ's job_timeout; -1: none).", "600",
                -1, MAX_SECONDS),
    OptionField("result_ttl", RQ, "int", "Seconds RQ keeps a run's result (0: not kept; -1: kept for ever).",
                "3600", -1, MAX_SECONDS),
    OptionField("ttl", RQ, "int", "Seconds a run may wait in its queue; after that RQ drops it unrun (-1: no limit).",
                "60", -1, MAX_SECONDS),
    OptionField("failure_ttl", RQ, "int", "Seconds RQ keeps a failed run in its failed registry.", "86400",
                1, MAX_SECONDS),
    OptionField("meta", RQ, "object", "The job's meta of each run (a JSON object).", '{"owner": "billing"}'),
    OptionField("retry_max", RQ, "int", "Retry a failed run up to this many times (RQ's Retry(max=...)).", "3",
                1, 1000),
    OptionField("retry_intervals", RQ, "ints",
                "Seconds between the retries (RQ's Retry(interval=...)): one, or one per retry (10,30,60).", "10,30,60",
                0, MAX_SECONDS),
    OptionField("on_success", RQ, "path", "A function RQ calls after a run succeeds, as module.function.",
                "myapp.hooks.done"),
    OptionField("on_failure", RQ, "path", "A function RQ calls after a run fails, as module.function.",
                "myapp.hooks.failed"),
)  # fmt: skip
_BY_NAME = {f.name: f for f in OPTION_FIELDS}


# -- reading one value -------------------------------------------------------------------------------


def _int(field: OptionField, value: Any) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise PeriodicError(f"{field.name}={value!r}: give a whole number, e.g. {field.example}") from None
    if type(value) is not int or not (field.low or 0) <= value <= (field.high or MAX_SECONDS):
        raise PeriodicError(f"{field.name}={value!r}: give a whole number in {field.low}..{field.high}")
    if field.low == -1 and value == 0 and field.name in ("timeout", "ttl"):
        raise PeriodicError(f"{field.name}=0 would drop every run: give seconds, or -1 for no limit")
    return value


def _expires(field: OptionField, value: Any) -> float | datetime:
    if isinstance(value, datetime):
        to_ms(value)  # an aware time
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                return parse_iso(value)
            except DelayqError as exc:
                raise PeriodicError(
                    f"expires={value!r}: give seconds after each send (30) or a time with its offset "
                    f"(2030-01-31T09:00:00+00:00): {exc}"
                ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS:
        raise PeriodicError(f"expires={value!r}: give seconds (more than 0) after each send, or a time")
    if not math.isfinite(value):
        raise PeriodicError(f"expires={value!r}: give a finite number of seconds")
    return float(value)


def _object(field: OptionField, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise PeriodicError(f"{field.name}: not JSON ({exc.msg}): e.g. {field.example}") from None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise PeriodicError(f"{field.name}={value!r}: give a JSON object, e.g. {field.example}")
    try:
        json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PeriodicError(f"{field.name}: holds a value that is not JSON ({exc}): use plain values") from None
    return dict(value)


def _ints(field: OptionField, value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        text = value.strip()
        parts = json.loads(text) if text.startswith("[") else [p for p in text.split(",") if p.strip()]
        value = parts
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 100:
        raise PeriodicError(f"{field.name}={value!r}: give 1 to 100 numbers of seconds, e.g. {field.example}")
    return tuple(_int(field, v) for v in value)


def _text(field: OptionField, value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 255 or not value.isprintable():
        raise PeriodicError(f"{field.name}={value!r}: give 1 to 255 printable characters")
    return value


def _path(field: OptionField, value: Any) -> str:
    return check_import_path(value, field.name)


_READERS = {"int": _int, "expires": _expires, "object": _object, "ints": _ints, "text": _text, "path": _path}


# -- the record --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """One entry's run options (each None: not set, the kind's or the broker's default). Which
    kind takes which, and the values each takes, are :data:`OPTION_FIELDS`'s; a record is built
    checked (:meth:`parse`), so its values are always valid for its kind."""

    expires: float | datetime | None = None
    priority: int | None = None
    headers: Mapping[str, Any] | None = None
    exchange: str | None = None
    routing_key: str | None = None
    timeout: int | None = None
    result_ttl: int | None = None
    ttl: int | None = None
    failure_ttl: int | None = None
    meta: Mapping[str, Any] | None = None
    retry_max: int | None = None
    retry_intervals: tuple[int, ...] | None = None
    on_success: str | None = None
    on_failure: str | None = None

    @classmethod
    def parse(cls, values: Mapping[str, Any], kind: str) -> RunOptions:
        """The options ``values`` give (text, as the CLI's flags, or JSON values, as the API's;
        None: not given) for an entry of ``kind``.

        Raises:
            PeriodicError: an unknown key, an option of the other kind, or a value it cannot
                take, naming the fix.
        """
        if kind not in KINDS:
            raise PeriodicError(f"kind {kind!r}: use one of {list(KINDS)}")
        out: dict[str, Any] = {}
        for key, value in values.items():
            if value is None:
                continue
            field = _BY_NAME.get(key)
            if field is None:
                raise PeriodicError(f"unknown run option {key!r}: the options are {sorted(_BY_NAME)}")
            if field.kind != kind:
                takers = [f.name for f in OPTION_FIELDS if f.kind == kind]
                raise PeriodicError(f"{key} is an option of {field.kind} entries, not {kind} ones (they take {takers})")
            out[key] = _READERS[field.value](field, value)
        if "retry_intervals" in out and "retry_max" not in out:
            raise PeriodicError("retry_intervals need retry_max (how many retries)")
        return cls(**out)

    def given(self) -> dict[str, Any]:
        """The options set, by key."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to_json(self) -> dict[str, Any]:
        """The options set as JSON values (an ``expires`` time as ISO 8601), as the API takes them."""
        out = self.given()
        if isinstance(out.get("expires"), datetime):
            out["expires"] = out["expires"].isoformat()
        if "retry_intervals" in out:
            out["retry_intervals"] = list(out["retry_intervals"])
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunOptions:
        """The options a stored state holds; none for what no release wrote (a hand write)."""
        if not isinstance(data, Mapping) or not data:
            return cls()
        kind = next((f.kind for f in OPTION_FIELDS if f.name in data), CELERY)
        try:
            return cls.parse(data, kind)
        except PeriodicError:
            return cls()

    def celery(self) -> dict[str, Any]:
        """The Celery options as ``apply_async`` (and a ``beat_schedule`` entry's ``options``)
        take them."""
        return {k: v for k, v in self.given().items() if _BY_NAME[k].kind == CELERY}

    def rq(self) -> dict[str, Any]:
        """The RQ options as the RQ adapter's job capture takes them (``Queue.enqueue``'s names:
        ``job_timeout``, ``result_ttl``, ``ttl``, ``failure_ttl``, ``meta``; the retry as
        ``retry_max``/``retry_intervals`` and the callbacks as import paths, which the adapter
        makes RQ's ``Retry`` and ``Callback`` of)."""
        job = {k: v for k, v in self.given().items() if _BY_NAME[k].kind == RQ and k != "timeout"}
        if self.timeout is not None:
            job["job_timeout"] = self.timeout
        return job
