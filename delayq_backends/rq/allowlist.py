"""Which queue and job classes a forwarder may import from an envelope: an allowlist of dotted
prefixes, so an envelope cannot make the forwarder import anything else (see :mod:`.target`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any

from rq.utils import import_attribute

from ..errors import DelayqError

__all__ = [
    "ALLOW_CLASS_ENV",
    "DEFAULT_ALLOWED_CLASSES",
    "NOT_ALLOWED_WAIT_S",
    "ClassAllowlist",
    "ClassImportError",
    "ClassNotAllowedError",
    "dotted_path",
]

#: Module prefixes whose queue and job classes every forwarder may import: RQ's and ours.
DEFAULT_ALLOWED_CLASSES = ("rq", "delayq_backends")
#: Env var adding prefixes (space- or comma-separated), as ``delayq forward --rq-allow-class``.
ALLOW_CLASS_ENV = "DELAYQ_RQ_ALLOW_CLASS"


class ClassImportError(DelayqError):
    """A queue or job class named in an envelope is not allowed or cannot be imported here."""


class ClassNotAllowedError(ClassImportError):
    """A queue or job class named in an envelope is off the forwarder's allowlist: its jobs wait
    (:data:`NOT_ALLOWED_WAIT_S` by default) rather than die, since the usual cause is a user's own
    ``Queue``/``Job`` subclass and a forwarder started without ``--rq-allow-class``."""


#: How long jobs naming a class off the allowlist wait before the forwarder looks again
#: (``delayq forward --rq-class-retry``).
NOT_ALLOWED_WAIT_S = 30.0


@dataclass(frozen=True)
class ClassAllowlist:
    """Dotted-path prefixes the forwarder may import a queue or job class from.

    A prefix matches whole components: ``myapp.jobs`` allows ``myapp.jobs.MyJob`` and
    ``myapp.jobs.sub.Other``, not ``myapp.jobsx.Evil``. A path with a ``__dunder__`` component
    (``rq.cli.__main__``) is never allowed: no class a job names lives there.
    """

    prefixes: tuple[str, ...] = DEFAULT_ALLOWED_CLASSES

    @classmethod
    def configured(cls, extra: Iterable[str] = (), env: Mapping[str, str] | None = None) -> ClassAllowlist:
        """The defaults, plus ``extra`` (``--rq-allow-class``) and :data:`ALLOW_CLASS_ENV`."""
        from_env = (os.environ if env is None else env).get(ALLOW_CLASS_ENV, "").replace(",", " ").split()
        added = [p.strip().strip(".") for p in (*extra, *from_env) if p.strip().strip(".")]
        return cls(tuple(dict.fromkeys((*DEFAULT_ALLOWED_CLASSES, *added))))

    def allows(self, path: str) -> bool:
        parts = path.split(".")
        if any(p.startswith("__") or not p for p in parts):
            return False
        return any(parts[: len(q)] == q for q in (p.split(".") for p in self.prefixes))

    def load(self, what: str, path: Any, base: type | None = None) -> Any:
        """What an envelope's ``what`` (``queue_class``, ...) names, imported if allowed; with
        ``base``, it must be a subclass of it (``base`` itself when ``path`` is None).

        Raises:
            ClassImportError: not allowed, not importable, or not a ``base``.
        """
        if path is None and base is not None:
            return base
        if not isinstance(path, str) or not self.allows(path):
            raise ClassNotAllowedError(
                f"{what} {path!r} is not on this forwarder's allowlist ({', '.join(self.prefixes)}): "
                f"if you trust it, start `delayq forward` with --rq-allow-class {_module_of(path)} "
                f"(or {ALLOW_CLASS_ENV}); an envelope cannot make the forwarder import anything else"
            )
        found = _import(path)
        if base is not None and not (isinstance(found, type) and issubclass(found, base)):
            raise ClassImportError(f"{what} {path!r} is not a subclass of {dotted_path(base)}: name an RQ {what}")
        return found


def dotted_path(obj: type | ModuleType | object) -> str:
    """The import path of a class or module, as ``rq worker --job-class`` takes it."""
    if isinstance(obj, ModuleType):
        return obj.__name__
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@lru_cache(maxsize=256)
def _import(path: str) -> Any:
    try:
        return import_attribute(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ClassImportError(
            f"cannot import {path!r} on this forwarder ({exc}): install the package that defines it "
            "where `delayq forward` runs, or schedule with RQ's default classes"
        ) from exc


def _module_of(path: Any) -> str:
    """The module part of a dotted class path, as an allowlist prefix to suggest."""
    return str(path).rpartition(".")[0] or str(path)
