"""Arguments evaluated at fire time: Celery's ``BeatLazyFunc`` in a periodic entry's args/kwargs.

``celery beat`` calls each ``BeatLazyFunc`` found among an entry's args (by position) and kwargs
(by key) before every send (``celery.beat._evaluate_entry_args``), so each run gets fresh values
(``BeatLazyFunc(time.time)``). A delayq entry's message is built once, at sync, and fired by
forwarders in other processes, so a function object cannot be stored: each one is stored as a
:class:`LazyCall`, its function's importable path (``module:qualname``) and its own arguments,
in the entry envelope's meta (:data:`~delayq_backends.periodic.state.LAZY_META`, which makes the
entry's format one an older forwarder leaves alone). The template message holds a placeholder
where each lazy value goes (shown by ``delayq list``, never sent).

At fire time a forwarder that has the Celery app (``celery -A proj delayq forward``, where the
user's code imports) evaluates them and rebuilds the run's message with Celery's sender, as the
sync built the template. One without the app cannot run user code: the firing waits and says so
(:class:`~delayq_backends.periodic.firing.EntryWaits`), never sending unevaluated arguments.

Only functions the app names may be called: those of its ``beat_schedule``'s ``BeatLazyFunc``
values and its ``delayq_lazy_functions`` setting (``module:qualname`` paths), so a hand write in
the store cannot make a forwarder call ``os.system``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.beat import BeatLazyFunc
from kombu.utils.json import dumps as kombu_json_dumps
from kombu.utils.json import loads as kombu_json_loads

from ..envelope import Envelope
from ..errors import EnvelopeError
from ..periodic.firing import EntryWaits
from ..periodic.registry import PeriodicError
from ..periodic.state import LAZY_META

__all__ = ["LazyArgs", "LazyCall", "allowed_functions", "lazy_parts", "split_lazy"]


def lazy_parts(value: BeatLazyFunc) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A ``BeatLazyFunc``'s function, args and kwargs: Celery keeps them in private attributes
    (``_func``, ``_func_params``); this is the one place that reads them (pinned by a test)."""
    params = value._func_params
    return value._func, tuple(params["args"]), dict(params["kwargs"])


def _path_of(entry: str, func: Any) -> str:
    """The importable ``module:qualname`` of ``func``, checked by importing it back.

    Raises:
        PeriodicError: a lambda, a nested function, a function of ``__main__`` or one the path
            does not lead back to, naming the fix.
    """
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    owner = getattr(func, "__self__", None)
    if module is None and isinstance(owner, type):  # a C class's classmethod (datetime.datetime.now)
        module, qualname = owner.__module__, f"{owner.__qualname__}.{func.__name__}"
    fix = "use a function defined at the top level of an importable module (or a class's method), e.g. time.time"
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise PeriodicError(
            f"entry {entry!r}: BeatLazyFunc({func!r}) cannot be evaluated by a forwarder in another process: {fix}"
        )
    path = f"{module}:{qualname}"
    try:
        found = resolve(path)
    except (ImportError, AttributeError) as exc:
        raise PeriodicError(f"entry {entry!r}: BeatLazyFunc function {path} cannot be imported ({exc}): {fix}") from exc
    if found != func:
        raise PeriodicError(f"entry {entry!r}: {path} is not the BeatLazyFunc's function {func!r}: {fix}")
    return path


def resolve(path: str) -> Any:
    """The object at ``module:qualname`` (ImportError, AttributeError if there is none)."""
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


@dataclass(frozen=True)
class LazyCall:
    """One lazy value: ``path`` (``module:qualname``) called with ``args`` and ``kwargs``."""

    path: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, entry: str, value: BeatLazyFunc) -> LazyCall:
        func, args, kwargs = lazy_parts(value)
        return cls(_path_of(entry, func), args, kwargs)

    def describe(self) -> str:
        """``time:time()``, the placeholder a listing shows where the value goes."""
        params = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.path}({', '.join(params)})"

    def to_json(self) -> dict[str, Any]:
        return {"f": self.path, "a": list(self.args), "k": dict(self.kwargs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LazyCall:
        return cls(str(data["f"]), tuple(data["a"]), dict(data["k"]))


@dataclass(frozen=True)
class LazyArgs:
    """An entry's arguments with lazy values: the task, its args and kwargs (a placeholder
    where a lazy value goes), the lazy calls by position and by key, and the ``apply_async``
    options the run's message is built with (as the sync built the template's)."""

    task: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    options: Mapping[str, Any]
    by_position: Mapping[int, LazyCall]
    by_key: Mapping[str, LazyCall]

    def encode(self) -> str:
        """The envelope meta value: kombu's JSON, so datetimes, UUIDs and bytes round-trip.

        Raises:
            PeriodicError: a value kombu's JSON cannot hold.
        """
        data = {
            "t": self.task,
            "a": list(self.args),
            "k": dict(self.kwargs),
            "o": dict(self.options),
            "pa": {str(i): c.to_json() for i, c in self.by_position.items()},
            "pk": {k: c.to_json() for k, c in self.by_key.items()},
        }
        try:
            return str(kombu_json_dumps(data))
        except (TypeError, ValueError) as exc:
            raise PeriodicError(
                f"task {self.task!r}: with BeatLazyFunc arguments each run's message is rebuilt from the entry's "
                f"args, kwargs and options, which must then be JSON values ({exc}): pass plain values"
            ) from exc

    @classmethod
    def of(cls, envelope: Envelope) -> LazyArgs | None:
        """The lazy arguments of an entry's envelope (None for an entry without).

        Raises:
            EnvelopeError: a marker no release wrote (a hand write): the entry is dead-lettered with
                that reason, as any unreadable entry, never sent with its placeholders.
        """
        text = envelope.meta.get(LAZY_META)
        if text is None:
            return None
        try:
            data = kombu_json_loads(text)
            return cls(
                str(data["t"]),
                tuple(data["a"]),
                dict(data["k"]),
                dict(data["o"]),
                {int(i): LazyCall.from_json(c) for i, c in data["pa"].items()},
                {str(k): LazyCall.from_json(c) for k, c in data["pk"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EnvelopeError(
                f"its BeatLazyFunc arguments cannot be read ({type(exc).__name__}: {exc}): sync the entry again"
            ) from exc

    def evaluate(self, allowed: Iterable[str]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The args and kwargs of one run: each lazy value called now.

        Raises:
            EntryWaits: a function the app does not name, one that cannot be imported here, or
                one that raised (the firing waits and is tried again).
        """
        allowed = set(allowed)
        lazy, by_key = self.by_position, self.by_key
        args = tuple(_call(lazy[i], allowed) if i in lazy else v for i, v in enumerate(self.args))
        kwargs = {k: _call(by_key[k], allowed) if k in by_key else v for k, v in self.kwargs.items()}
        return args, kwargs


def _call(call: LazyCall, allowed: set[str]) -> Any:
    """One lazy value, now (:meth:`LazyArgs.evaluate`)."""
    if call.path not in allowed:
        raise EntryWaits(
            f"its BeatLazyFunc function {call.path} is named neither by the app's beat_schedule nor by its "
            "delayq_lazy_functions setting; a forwarder calls only those: add it to delayq_lazy_functions"
        )
    try:
        return resolve(call.path)(*call.args, **call.kwargs)
    except Exception as exc:
        raise EntryWaits(f"its BeatLazyFunc {call.describe()} raised {type(exc).__name__}: {exc}") from exc


def _placeholder(call: LazyCall) -> str:
    return f"<evaluated per run: {call.describe()}>"


def split_lazy(
    entry: str, task: str, args: Sequence[Any], kwargs: Mapping[str, Any], options: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], LazyArgs | None]:
    """An entry's args and kwargs with a placeholder for each ``BeatLazyFunc`` (as beat reads
    them: elements of ``args``, values of ``kwargs``), and its :class:`LazyArgs` (None without).

    Raises:
        PeriodicError: a lazy function a forwarder could not import, or lazy arguments with
            values kombu's JSON cannot hold.
    """
    if isinstance(args, BeatLazyFunc) or isinstance(kwargs, BeatLazyFunc):
        raise PeriodicError(
            f"entry {entry!r}: args/kwargs as a whole cannot be a BeatLazyFunc (beat evaluates the values inside "
            "them): put BeatLazyFunc values inside the args list or kwargs dict"
        )
    by_position = {i: LazyCall.of(entry, v) for i, v in enumerate(args) if isinstance(v, BeatLazyFunc)}
    by_key = {k: LazyCall.of(entry, v) for k, v in kwargs.items() if isinstance(v, BeatLazyFunc)}
    plain_args = tuple(_placeholder(by_position[i]) if i in by_position else v for i, v in enumerate(args))
    plain_kwargs = {k: _placeholder(by_key[k]) if k in by_key else v for k, v in kwargs.items()}
    if not by_position and not by_key:
        return plain_args, plain_kwargs, None
    lazy = LazyArgs(task, plain_args, plain_kwargs, dict(options), by_position, by_key)
    lazy.encode()  # refused now, at sync, rather than at every firing
    return plain_args, plain_kwargs, lazy


def allowed_functions(app: Celery) -> set[str]:
    """The lazy functions a forwarder of ``app`` may call: those of its ``beat_schedule``'s
    ``BeatLazyFunc`` values and its ``delayq_lazy_functions`` setting."""
    allowed = {str(p) for p in app.conf.get("delayq_lazy_functions") or ()}
    for conf in (app.conf.beat_schedule or {}).values():
        if not isinstance(conf, Mapping):
            continue
        args, kwargs = conf.get("args") or (), conf.get("kwargs") or {}
        values = list(args) if isinstance(args, (list, tuple)) else []
        values += list(kwargs.values()) if isinstance(kwargs, Mapping) else []
        for value in values:
            if isinstance(value, BeatLazyFunc):
                try:
                    allowed.add(_path_of("", lazy_parts(value)[0]))
                except PeriodicError:  # refused at sync: never stored
                    continue
    return allowed
