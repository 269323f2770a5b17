"""The Lua scripts, one ``.lua`` file each, run as a Function library or as EVAL scripts.

A line ``--- @include "name"`` pulls in ``includes/name.lua`` (BullMQ's convention), so helpers
shared by several scripts are written once. A first line ``#!lua flags=allow-oom,...`` gives the
script Redis 7 flags (in EVAL mode, and as the function's flags in the library).

Two ways to run them, chosen once per client on first use (:meth:`Scripts.backend`):

- **Functions** (Redis/Valkey 7+): an admin installs the library once (``delayq functions
  install``, on every primary of a cluster); the store then calls ``FCALL``. Role users need only
  ``+fcall``, not ``EVAL``: a user that may send EVAL may also send a looping script that keeps
  the server answering BUSY until ``SHUTDOWN NOSAVE``. The library's name holds a hash of every
  script (``delayq_<sha8>``), so two package versions run side by side during a rolling upgrade.
- **EVAL** (the fallback: no library installed, Redis < 7, fakeredis): redis-py ``Script``
  objects, which run EVALSHA and reload the source on NOSCRIPT (after a restart or failover).
  Servers that do not read ``#!lua`` lines (Redis < 7, fakeredis) get the scripts without them.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Optional, Sequence

import redis

from ..errors import ConfigError

__all__ = [
    "LIBRARY",
    "SCRIPT_NAMES",
    "Backend",
    "LuaScript",
    "Scripts",
    "function_name",
    "library_code",
    "parse_script",
    "script",
    "source",
]

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)
_SHEBANG = re.compile(r"\A#!lua(?P<options>[^\n]*)\n")
_FLAG = re.compile(r"^[a-z-]+$")

#: Every ``<name>.lua`` of this package; ``includes/`` holds shared helpers, not scripts.
SCRIPT_NAMES = tuple(
    sorted(p.name[: -len(".lua")] for p in resources.files(__package__).iterdir() if p.name.endswith(".lua"))
)


@dataclass(frozen=True)
class LuaScript:
    """One script: its Redis 7 flags (from a ``#!lua flags=`` first line) and its body."""

    name: str
    flags: tuple[str, ...]
    body: str  # includes expanded, no shebang line

    @property
    def source(self) -> str:
        """The EVAL text for servers that read shebang lines: the flags line, then the body."""
        return f"#!lua flags={','.join(self.flags)}\n{self.body}" if self.flags else self.body


@cache
def script(name: str) -> LuaScript:
    """Script ``name`` with its includes expanded and its shebang parsed."""
    here = resources.files(__package__)
    text = (here / f"{name}.lua").read_text(encoding="utf-8")
    return parse_script(
        name, _INCLUDE.sub(lambda m: (here / "includes" / f"{m.group(1)}.lua").read_text(encoding="utf-8"), text)
    )


def parse_script(name: str, text: str) -> LuaScript:
    """Split a ``#!lua flags=a,b`` first line (if any) from the body of script ``name``.

    Raises:
        ValueError: the shebang holds something other than ``flags=a,b``.
    """
    flags: tuple[str, ...] = ()
    shebang = _SHEBANG.match(text)
    if shebang:
        for option in shebang["options"].split():
            key, _, value = option.partition("=")
            if key != "flags" or not all(_FLAG.match(f) for f in value.split(",") if f):
                raise ValueError(f"{name}.lua: shebang option {option!r}: only flags=a,b is understood")
            flags += tuple(f for f in value.split(",") if f)
        text = text[shebang.end() :]
    return LuaScript(name, flags, text)


def source(name: str) -> str:
    """The EVAL source of script ``name`` (shebang included, when it has flags)."""
    return script(name).source


@cache
def _library() -> tuple[str, str]:
    """(library name, FUNCTION LOAD code). The name hashes every script, so any change to one
    makes a new library instead of replacing the one older clients call."""
    scripts = [script(name) for name in SCRIPT_NAMES]
    digest = hashlib.sha1()
    for s in scripts:
        digest.update(f"{s.name}\0{','.join(s.flags)}\0{s.body}\0".encode())
    name = f"delayq_{digest.hexdigest()[:8]}"
    parts = [f"#!lua name={name}\n"]
    for s in scripts:
        flags = ", ".join(f"'{f}'" for f in s.flags)
        # the body keeps its own KEYS/ARGV names, top-level locals and final return
        parts.append(
            f"redis.register_function{{function_name='{name}_{s.name}', flags={{{flags}}}, "
            f"callback=function(KEYS, ARGV)\n{s.body}\nend}}\n"
        )
    # read-only and keyless: tells a client the library is there without touching any data
    parts.append(f"redis.register_function{{function_name='{name}_version', flags={{'no-writes'}}, ")
    parts.append(f"callback=function() return '{name}' end}}\n")
    return name, "".join(parts)


#: The name of this package version's Function library.
LIBRARY = _library()[0]


def library_code() -> str:
    """The ``FUNCTION LOAD`` code of the library named :data:`LIBRARY`."""
    return _library()[1]


def function_name(name: str) -> str:
    """The library's function that runs script ``name``."""
    return f"{LIBRARY}_{name}"


@dataclass(frozen=True)
class Backend:
    """How one client runs the scripts.

    Attributes:
        functions: FCALL the installed library (else EVALSHA/EVAL).
        shebang: in EVAL mode, the server reads ``#!lua flags=`` lines (Redis/Valkey 7+).
    """

    functions: bool
    shebang: bool = True


class ScriptCall:
    """Script ``name`` bound to a :class:`Scripts`; called like a redis-py ``Script``."""

    def __init__(self, scripts: Scripts, name: str) -> None:
        self.scripts = scripts
        self.name = name

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
        """Run on ``client`` (default: the scripts' own), which may be a pipeline: then it is queued."""
        backend = self.scripts.backend()
        target = self.scripts.client if client is None else client
        if backend.functions:
            try:
                return target.fcall(function_name(self.name), len(keys), *keys, *args)
            except redis.ResponseError as exc:
                if not _function_missing(exc):
                    raise
                # deleted, or missing on this node of a cluster: run the script itself
                backend = self.scripts.fall_back()
        return self.scripts.eval_script(self.name, backend)(keys=list(keys), args=list(args), client=target)

    def queue(self, pipeline: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue this script on a caller's MULTI/EXEC: FCALL, or EVAL of its source.

        Not EVALSHA: a script missing from the server's cache (after a restart) would fail alone
        inside the caller's MULTI while the caller's other writes commit; and redis-py's
        ``Script`` would add a SCRIPT EXISTS round trip to every transaction. The server caches
        the compiled script by its SHA, so EVAL costs only the bytes of the source.
        """
        backend = self.scripts.backend()
        if backend.functions:
            pipeline.fcall(function_name(self.name), len(keys), *keys, *args)
        else:
            pipeline.eval(_eval_text(self.name, backend), len(keys), *keys, *args)


class Scripts:
    """The scripts of one client, as attributes named like the ``.lua`` files."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._backend: Optional[Backend] = None
        self._eval: dict[tuple[str, bool], Any] = {}
        self._lock = threading.Lock()
        self._calls = {name: ScriptCall(self, name) for name in SCRIPT_NAMES}

    @classmethod
    def register(cls, client: Any) -> Scripts:
        return cls(client)

    def __getattr__(self, name: str) -> ScriptCall:
        try:
            return self.__dict__["_calls"][name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(f"no script {name!r}: the scripts are {SCRIPT_NAMES}") from None

    def backend(self) -> Backend:
        """How this client runs the scripts, asked of the server once (one or two round trips)."""
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    self._backend = self._detect()
        return self._backend

    def fall_back(self) -> Backend:
        """Use EVAL from now on: the library went away (or is missing on this node of a cluster)."""
        with self._lock:
            self._backend = self._eval_backend(library_missing=True)
            return self._backend

    def eval_script(self, name: str, backend: Backend) -> Any:
        """The redis-py ``Script`` of ``name`` in the form ``backend``'s server reads."""
        key = (name, backend.shebang)
        if key not in self._eval:
            self._eval[key] = self.client.register_script(_eval_text(name, backend))
        return self._eval[key]

    def _detect(self) -> Backend:
        try:
            found = self.client.fcall_ro(function_name("version"), 0)
        except redis.exceptions.NoPermissionError:
            # a user without FCALL: the older EVAL rules (or a reader, who runs no script)
            return self._eval_backend(library_missing=False)
        except redis.ResponseError as exc:
            # "Function not found" (not installed), "unknown command" (Redis < 7)
            return self._eval_backend(library_missing=_function_missing(exc))
        return Backend(functions=_text(found) == LIBRARY)

    def _eval_backend(self, *, library_missing: bool) -> Backend:
        """EVAL, in the form the server reads: a compile error near '#' says it does not read
        ``#!lua`` lines.

        Raises:
            ConfigError: the library is missing and this user may not send EVAL (an FCALL-only
                role): nothing can run until an admin installs it. Not remembered, so a client
                started before the install works once it is done.
        """
        try:
            self.client.eval("#!lua flags=no-writes\nreturn 1", 0)
        except redis.exceptions.NoPermissionError as exc:
            if library_missing:
                raise ConfigError(
                    f"the delayq function library {LIBRARY} is not installed on this server, and this user "
                    f"may not run scripts itself ({exc}): run `delayq functions install --url <admin URL>`"
                ) from exc
            return Backend(functions=False)  # cannot tell; such a user cannot run scripts at all
        except redis.ResponseError:
            return Backend(functions=False, shebang=False)
        return Backend(functions=False)


def _eval_text(name: str, backend: Backend) -> str:
    s = script(name)
    return s.source if backend.shebang else s.body


def _function_missing(exc: redis.ResponseError) -> bool:
    text = str(exc).lower()
    return "function not found" in text or "unknown command" in text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
