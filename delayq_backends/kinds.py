"""The kinds of envelope target in one table: who builds a kind's targets, how listings show its
items and, for a kind of periodic entry, what its templates run.

Whatever treats kinds differently reads the row of ``Envelope.target`` instead of asking
``target == "rq"`` (:mod:`.assemble`, :mod:`.entries`, :mod:`.periodic`, the CLI and the API). The
table is in the base layer and names the adapters above it as text (:class:`Ref`), imported on
first use: the layers hold, and a process without Celery or RQ never imports them. A new broker is
one package plus one row (docs/architecture.md, "Kinds").
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .envelope import Envelope
from .errors import ConfigError, EnvelopeError, MissingExtraError, install_hint

__all__ = ["ENTRY_KINDS", "KINDS", "RQ", "EntryKind", "Kind", "Ref", "adapter", "kind_of", "view"]

log = logging.getLogger("delayq.kinds")

T = TypeVar("T")

#: paths whose adapter could not be imported here: tried once per process, not once per item
_MISSING: set[str] = set()


def adapter(name: str) -> Any:
    """An adapter module (``celery``, ``rq.entries``, ``spark``...), or an error naming its extra
    (once: a package whose own import names it raises :class:`MissingExtraError`, passed on)."""
    try:
        return importlib.import_module(f"delayq_backends.{name}")
    except MissingExtraError:
        raise
    except ImportError as exc:
        raise ConfigError(f"{exc}: {install_hint(name.split('.')[0])}") from exc


@dataclass(frozen=True)
class Ref(Generic[T]):
    """An object named ``"module:name"`` under ``delayq_backends``, of the type of its column."""

    path: str

    def load(self) -> T:
        """The object, its module imported now.

        Raises:
            ConfigError: its adapter's extra is not installed (naming the pip command).
        """
        module, _, name = self.path.partition(":")
        found: T = getattr(adapter(module), name)
        return found

    def available(self) -> T | None:
        """The object, or None when its adapter's extra is not installed here."""
        if self.path not in _MISSING:
            try:
                return self.load()
            except (ConfigError, MissingExtraError) as exc:
                log.debug("%s is not available here: %s", self.path, exc)
                _MISSING.add(self.path)
        return None


@dataclass(frozen=True)
class EntryKind:
    """A kind of periodic entry.

    Attributes:
        name: its name in ``--kind`` and the API's ``kind``.
        task_of: what a template runs (a task name, a function path), for listings.
        trust: the digest of a template that carries code to run, recorded as its operator's
            definition (:mod:`.periodic.trust`); None for a kind whose runs a producer could send anyway.
        day_or: a crontab with both day fields runs on days matching either (cron's and RQ's
            reading), not both (Celery's).
    """

    name: str
    task_of: Ref[Callable[[Envelope], str]]
    trust: Ref[Callable[[Envelope], str]] | None = None
    day_or: bool = False


@dataclass(frozen=True)
class Kind:
    """One kind of envelope target.

    Attributes:
        name: the envelope's ``target``, and the ``kind`` of the target that delivers it.
        setting: the :class:`~delayq_backends.assemble.ProcessSettings` field that turns on ``targets``.
        targets: ``(settings, store, resources) -> [DescribedTarget]``: the forwarder's targets
            for this kind and those its adapter delivers with it (a periodic kind's runs); None
            for a kind built with another's.
        view: what a waiting item runs, as JSON values, for listings (None: nothing more to show).
        entry: for a kind of periodic entry, its row there.
    """

    name: str
    setting: str = ""
    targets: Ref[Callable[..., list[Any]]] | None = None
    view: Ref[Callable[[Envelope], dict[str, Any] | None]] | None = None
    entry: EntryKind | None = None


_CELERY_VIEW: Ref[Callable[[Envelope], dict[str, Any] | None]] = Ref("celery.periodic:task_json")

RQ = Kind("rq", "rq_redis", Ref("rq.forwarding:targets"))

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("list", "list_target", Ref("assemble:list_targets")),
        Kind("celery", "celery_broker", Ref("celery.forwarding:targets"), _CELERY_VIEW),
        Kind("celery-periodic", view=_CELERY_VIEW, entry=EntryKind("celery", Ref("celery.periodic:task_of"))),
        RQ,
        Kind("rq-run"),
        Kind(
            "rq-periodic",
            view=Ref("rq.entries:entry_view"),
            entry=EntryKind("rq", Ref("rq.entries:task_of"), Ref("rq.entries:template_digest"), day_or=True),
        ),
    )
}

#: the kinds of periodic entry by their name (``--kind celery|rq``)
ENTRY_KINDS: dict[str, EntryKind] = {k.entry.name: k.entry for k in KINDS.values() if k.entry is not None}


def kind_of(target: str) -> tuple[EntryKind, Callable[[Envelope], str]] | None:
    """The entry kind of envelope target ``target`` and its task reader; None when it is no entry
    kind or its adapter's framework is not installed here (the entry is listed without its task)."""
    entry = KINDS[target].entry if target in KINDS else None
    task_of = entry.task_of.available() if entry is not None else None
    return None if entry is None or task_of is None else (entry, task_of)


def view(envelope: Envelope) -> dict[str, Any] | None:
    """What ``envelope`` runs, as its kind shows it (``{"note": why}`` when it cannot be read);
    None for kinds with nothing to show, or whose framework is not installed here."""
    kind = KINDS.get(envelope.target)
    show = kind.view.available() if kind is not None and kind.view is not None else None
    try:
        return None if show is None else show(envelope)
    except EnvelopeError as exc:
        return {"note": str(exc)}
