"""Loading the ``.lua`` scripts and running them, as a Function library or as EVAL scripts.

The one place that loads scripts; :mod:`delayq_backends.scripts.store` and
:mod:`delayq_backends.scripts.rq` hold the typed calls built on it.

A line ``--- @include "name"`` pulls in ``includes/name.lua`` (BullMQ's convention), so helpers
shared by several scripts are written once; an include may include others, and each is pulled in
once per script. A first line ``#!lua flags=allow-oom,...`` gives the script Redis 7 flags (in
EVAL mode, and as the function's flags in the library).

A write a user's call returns success for waits for replicas when the store asks it to
(``durable_replicas``): every script is either :data:`ACKNOWLEDGED_SCRIPTS` or one of
:data:`INTERNAL_SCRIPTS`, and :class:`ScriptRunner` sends a ``WAIT`` after each call of the former
on its connection, wherever it is run from, so a new write path cannot forget it.

Two ways to run them, chosen once per client on first use (:meth:`ScriptRunner.backend`):

- **Functions** (Redis/Valkey 7+): an admin installs the library once (:func:`install_functions`,
  ``delayq functions install``, on every primary of a cluster); the store then calls ``FCALL``.
  Role users need only ``+fcall``, not ``EVAL``: a user that may send EVAL may also send a looping
  script that keeps the server answering BUSY until ``SHUTDOWN NOSAVE``. The library's name holds
  a hash of every script (``delayq_<sha8>``), so two package versions run side by side during a
  rolling upgrade. Functions are kept in RDB/AOF and replicated, but a server started empty (no
  persistence) needs the install again; until then stores fall back to EVAL, which FCALL-only
  users may not send.
- **EVAL** (the fallback: no library installed, Redis < 7, fakeredis): redis-py ``Script``
  objects, which run EVALSHA and reload the source on NOSCRIPT (after a restart or failover).
  Servers that do not read ``#!lua`` lines (Redis < 7, fakeredis) get the scripts without them.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any, Generic, TypeVar

import hiredis
import redis
from redis.cluster import RedisCluster

from ..errors import ConfigError, NotDurableError

__all__ = [
    "ACKNOWLEDGED_SCRIPTS",
    "INTERNAL_SCRIPTS",
    "LIBRARY",
    "SCRIPT_NAMES",
    "Backend",
    "Durability",
    "LuaScript",
    "NodeFunctions",
    "ScriptCall",
    "ScriptRunner",
    "check_acked",
    "function_missing",
    "function_name",
    "functions_status",
    "install_functions",
    "library_code",
    "parse_script",
    "script",
    "source",
]

R = TypeVar("R")

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)
_SHEBANG = re.compile(r"\A#!lua(?P<options>[^\n]*)\n")
_FLAG = re.compile(r"^[a-z-]+$")

#: Every ``<name>.lua`` of this package; ``includes/`` holds shared helpers, not scripts.
SCRIPT_NAMES = tuple(
    sorted(p.name[: -len(".lua")] for p in resources.files(__package__).iterdir() if p.name.endswith(".lua"))
)


#: Scripts whose call a user's call returns success for (a producer's, an operator's, a worker's
#: report that ends a batch): with ``durable_replicas`` each call waits for the replicas, so
#: success means a failover cannot lose it.
ACKNOWLEDGED_SCRIPTS = frozenset(
    {
        "schedule", "schedule_one", "reschedule", "cancel", "debounce", "requeue", "purge", "rq_schedule",
        "batch_open", "batch_add", "batch_end", "sync_version", "periodic_trust", "periodic_registry",
        "group_schedule",
    }
)  # fmt: skip
#: The other scripts, each with why it does not wait (docs/guarantees.md, "Failover"): the
#: forwarder's and workers' bookkeeping, whose loss in a failover repeats or delays work but
#: loses none (a WAIT would put a replica's round trip into every claim), and the scripts that
#: run on RQ's Redis, which ``durable_replicas`` (a setting of the store) does not cover.
INTERNAL_SCRIPTS: dict[str, str] = {
    "claim": "lost: the item is due again and claimed again",
    "ack": "lost: the item is published again (at-least-once; with dedupe the copy does not run)",
    "keep": "lost: the item is published again when its lease ends (at-least-once)",
    "release": "lost: the item waits for its lease to end",
    "defer": "lost: the item waits for its lease to end, then is claimed again",
    "fail": "lost: the delivery is tried again (or buried again)",
    "extend": "lost: the lease ends sooner, and the item may be published twice",
    "rearm": "a forwarder's: lost, the period fires again (a user's compare-and-set, replace_if, waits)",
    "promote": "lost: the item is released at its next ask instead of now",
    "park": "lost: the item waits for its lease to end, then is claimed and parked again",
    "group_release": "lost: the items are back in their line (a parked re-check finds them there) and released "
    "again when their group's look comes, within a second",
    "group_park": "lost: the item waits for its lease to end, then is claimed and put in its line again",
    "unpark": "lost: a parked item is released at the next look instead (10 s later), or looked at again sooner",
    "take": "lost: the queue's rate bucket refills early, once",
    "slot_take": "lost: a slot held at release is free early (the limit may be passed once, until holds lapse); "
    "workers' reports it read are lost with it (a hold lapses at its last replicated deadline, or ends late)",
    "slot_end": "lost: the slot is held until its hold lapses (a delay, never a loss)",
    "periodic_run": "the run history (observability): lost, one event is missing from it",
    "rq_fields": "RQ's Redis (read-only)",
    "rq_enqueue": "RQ's Redis: the forwarder's publish, acked after it",
    "rq_move": "RQ's Redis: the forwarder's publish, acked after it",
    "rq_run": "RQ's Redis: the forwarder's publish, acked after it",
    "rq_fail": "RQ's Redis: the forwarder's report of a job that cannot run",
}


@dataclass(frozen=True)
class Durability:
    """How many replicas a :data:`ACKNOWLEDGED_SCRIPTS` call waits for (``Config.durable_replicas``,
    0: none) and how long (``durable_timeout_ms``)."""

    replicas: int = 0
    timeout_ms: int = 1000


@dataclass(frozen=True)
class LuaScript:
    """One script: its Redis 7 flags (from a ``#!lua flags=`` first line) and its body."""

    name: str
    flags: tuple[str, ...]
    body: str  # includes expanded, no shebang line

    @cached_property
    def code(self) -> str:
        """The body as the server gets it: comments blanked, so an EVAL queued on a caller's
        transaction (which carries the whole text on every call, for the server to hash) is a
        quarter of the bytes; line numbers in a Lua error stay those of the file."""
        return _compact(self.body)

    @property
    def source(self) -> str:
        """The EVAL text for servers that read shebang lines: the flags line, then the code."""
        return f"#!lua flags={','.join(self.flags)}\n{self.code}" if self.flags else self.code


#: a comment block at the start of a line (to the first ``]]``, as Lua reads it), or a line of
#: comment; comments after code stay (telling them from a string holding "--" needs a lexer)
_COMMENT = re.compile(r"^--\[\[.*?\]\]|^[ \t]*--[^\n]*", re.MULTILINE | re.DOTALL)


def _compact(body: str) -> str:
    """``body`` with its comment blocks and comment lines blanked, each newline kept."""
    return _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), body)


@cache
def script(name: str) -> LuaScript:
    """Script ``name`` with its includes expanded (each once) and its shebang parsed."""
    here = resources.files(__package__)
    return parse_script(name, _expand((here / f"{name}.lua").read_text(encoding="utf-8"), set()))


def _expand(text: str, seen: set[str]) -> str:
    """``text`` with each ``--- @include`` line replaced by the include, itself expanded; an
    include already pulled in (``seen``) is left out, so its locals are defined once."""
    includes = resources.files(__package__) / "includes"

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _expand((includes / f"{name}.lua").read_text(encoding="utf-8"), seen)

    return _INCLUDE.sub(include, text)


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
            f"callback=function(KEYS, ARGV)\n{s.code}\nend}}\n"
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


@dataclass(slots=True)
class ScriptCall(Generic[R]):
    """One call of one script, ready to run: the keys it touches, its arguments, and how to read
    its reply. Built by the typed script objects (:mod:`delayq_backends.scripts.store`), run by a
    :class:`ScriptRunner`. Slotted, not frozen: one is made per call, every ``schedule()`` among
    them, and a frozen dataclass costs several times more to build.

    Attributes:
        name: the script (its ``.lua`` file).
        keys: the keys it touches, in its ``KEYS`` order.
        args: its ``ARGV``.
        parse: turns the raw reply into a typed record.
        acknowledged: a user's write although its script is in :data:`INTERNAL_SCRIPTS` (a
            periodic entry's compare-and-set through ``rearm``): it waits for replicas too.
    """

    name: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    parse: Callable[[Any], R]
    acknowledged: bool = False

    def as_acknowledged(self) -> ScriptCall[R]:
        """A copy of this call marked a user's write (see ``acknowledged``): built directly, as
        ``dataclasses.replace`` costs several times more, and this runs on every ``enqueue_at``."""
        return ScriptCall(self.name, self.keys, self.args, self.parse, True)


@dataclass(frozen=True)
class Backend:
    """How one client runs the scripts.

    Attributes:
        functions: FCALL the installed library (else EVALSHA/EVAL).
        shebang: in EVAL mode, the server reads ``#!lua flags=`` lines (Redis/Valkey 7+).
    """

    functions: bool
    shebang: bool = True


class ScriptRunner:
    """Runs :class:`ScriptCall` s on one client: now (:meth:`run`, :meth:`run_pipelined`), or
    queued on a caller's pipeline or transaction (:meth:`queue`).

    With ``durability.replicas``, a call a user's call returns success for (:meth:`waits`) runs
    with a WAIT after it on its connection, and a shortfall raises :class:`NotDurableError`. A
    call queued on a caller's transaction cannot: the caller confirms after its EXEC
    (``StoreCore.confirm_durable``).
    """

    def __init__(self, client: Any, durability: Durability | None = None) -> None:
        self.client = client
        self.durability = durability or Durability()
        self._backend: Backend | None = None
        self._eval: dict[tuple[str, bool], Any] = {}
        self._lock = threading.Lock()
        self._wait_allowed = False

    def waits(self, call: ScriptCall[Any]) -> bool:
        """Whether ``call`` waits for replicas when run: durability asked, and a user's write."""
        return bool(self.durability.replicas) and (call.acknowledged or call.name in ACKNOWLEDGED_SCRIPTS)

    def run(self, call: ScriptCall[R], *, client: Any = None) -> R:
        """Run ``call`` on ``client`` (default: the runner's own) and parse its reply; a user's
        write waits for the replicas (:meth:`waits`).

        Raises:
            NotDurableError: fewer replicas confirmed it in time (it is on the primary).
        """
        target = self.client if client is None else client
        if self.durability.replicas and self.waits(call):  # the first test alone on the usual path
            return self._run_durably(call, target)
        backend = self.backend()
        if backend.functions:
            try:
                return call.parse(target.fcall(function_name(call.name), len(call.keys), *call.keys, *call.args))
            except redis.ResponseError as exc:
                if not function_missing(exc):
                    raise
                # deleted, or missing on this node of a cluster: run the script itself
                backend = self.fall_back()
        script = self._eval_script(call.name, backend)
        try:  # EVALSHA itself: redis-py's Script would copy the arguments twice more on every call
            raw = target.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        except redis.exceptions.NoScriptError:  # not cached there (a restart, a failover): Script loads it
            raw = script(keys=list(call.keys), args=list(call.args), client=target)
        return call.parse(raw)

    def _run_durably(self, call: ScriptCall[R], target: Any) -> R:
        """``call`` and a WAIT in one pipeline on the connection of the server that holds its keys.

        WAIT counts the replicas that have the writes made *on its own connection*, so both must
        travel together. On a cluster whose layout just changed (a failover), the cluster client
        refreshes its slot map and the call is tried once more.
        """
        wanted, timeout = self.durability.replicas, self.durability.timeout_ms
        for attempt in (1, 2):
            node = _server_of(target, call.keys)
            self.check_wait_allowed(node)
            try:
                with node.pipeline(transaction=False) as pipe:
                    self.queue(call, pipe)
                    pipe.execute_command("WAIT", wanted, timeout)
                    result, acked = pipe.execute()
                break
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                if not isinstance(target, RedisCluster) or attempt == 2 or isinstance(exc, redis.OutOfMemoryError):
                    raise
                target.nodes_manager.initialize()
        check_acked(int(acked), wanted, timeout, f"{call.name} on {call.keys[0] if call.keys else 'no key'}")
        return call.parse(result)

    def run_pipelined(self, calls: Sequence[ScriptCall[Any]], client: Any = None) -> list[Any]:
        """Run ``calls`` in one pipeline on ``client`` (default: the runner's own; one server, no
        transaction): their raw replies, errors as values. When any is a user's write
        (:meth:`waits`), one WAIT follows them all, and a shortfall is each such call's reply
        (a :class:`NotDurableError`): the others' replies stand."""
        target = self.client if client is None else client
        waiting = [self.waits(call) for call in calls]
        if any(waiting):
            self.check_wait_allowed(target)
        with target.pipeline(transaction=False) as pipe:
            for call in calls:
                self.queue(call, pipe)
            if any(waiting):
                pipe.execute_command("WAIT", self.durability.replicas, self.durability.timeout_ms)
            raw = pipe.execute(raise_on_error=False)
        if not any(waiting):
            return list(raw)
        try:
            self.confirmed(raw.pop(), "a pipelined call")
        except NotDurableError as exc:
            return [exc if wait else reply for wait, reply in zip(waiting, raw)]
        return list(raw)

    def confirm(self, pipe: Any, client: Any, where: str) -> list[Any]:
        """Execute ``pipe`` (plain commands on ``client``, one server's, that a user's call
        returns success for), with a WAIT after them when durable: their replies, errors as
        values (the WAIT's shortfall raised).

        Raises:
            NotDurableError: fewer replicas confirmed them in time (they are on the primary).
        """
        if self.durability.replicas:
            self.check_wait_allowed(client)
            pipe.execute_command("WAIT", self.durability.replicas, self.durability.timeout_ms)
        replies = list(pipe.execute(raise_on_error=False))
        if self.durability.replicas:
            self.confirmed(replies.pop(), where)
        return replies

    def confirmed(self, acked: Any, where: str) -> None:
        """Refuse a WAIT's reply ``acked`` short of the replicas asked for (a WAIT that failed too)."""
        if isinstance(acked, Exception):
            raise acked
        check_acked(int(acked), self.durability.replicas, self.durability.timeout_ms, where)

    def check_wait_allowed(self, client: Any) -> None:
        """Before the first durable write, that this user may send WAIT (``WAIT 0 0`` answers at
        once): refused after the write, the caller would see an error for a write that was stored.

        Raises:
            ConfigError: the user's ACL lacks ``+wait`` (rules from an older ``delayq acl``).
        """
        if self._wait_allowed:
            return
        try:
            client.execute_command("WAIT", 0, 0)
        except redis.exceptions.NoPermissionError as exc:
            raise ConfigError(
                f"durable_replicas={self.durability.replicas} needs WAIT, which this Redis user may not send "
                f"({exc}); nothing was written: apply this version's `delayq acl <role>` (it grants +wait) "
                "or set durable_replicas=0"
            ) from exc
        self._wait_allowed = True

    def queue(self, call: ScriptCall[Any], pipeline: Any) -> None:
        """Queue ``call`` on ``pipeline`` (its reply comes from ``execute()``: read it with
        ``call.parse``): FCALL, or EVAL of its source.

        Not EVALSHA: a script missing from the server's cache (after a restart) would fail alone
        inside a caller's MULTI while the caller's other writes commit; and redis-py's
        ``Script`` would add a SCRIPT EXISTS round trip to every pipeline. The server caches
        the compiled script by its SHA, so EVAL costs only the bytes of the source.
        """
        pipeline.execute_command(*self.command(call))

    def command(self, call: ScriptCall[Any]) -> tuple[Any, ...]:
        """The command that runs ``call``, as :meth:`queue` sends it: FCALL, or EVAL of its source."""
        backend = self.backend()
        if backend.functions:
            return ("FCALL", function_name(call.name), len(call.keys), *call.keys, *call.args)
        return ("EVAL", _eval_text(call.name, backend), len(call.keys), *call.keys, *call.args)

    def packed(self, call: ScriptCall[Any]) -> bytes:
        """:meth:`command` in the wire protocol, for a connection's ``send_packed_command``.

        hiredis packs it straight from the arguments: redis-py's ``pack_command`` first copies
        them one by one in Python, which costs as much again for a bulk call's thousands.
        """
        return bytes(hiredis.pack_command(self.command(call)))

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

    def _eval_script(self, name: str, backend: Backend) -> Any:
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
            return self._eval_backend(library_missing=function_missing(exc))
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
    return s.source if backend.shebang else s.code


def check_acked(acked: int, wanted: int, timeout: int, where: str) -> None:
    """Refuse a write that fewer than ``wanted`` replicas confirmed.

    Raises:
        NotDurableError: the write is on the primary only; retrying is safe.
    """
    if acked < wanted:
        raise NotDurableError(
            f"{where}: written to the primary but confirmed by {acked} of {wanted} replicas within "
            f"{timeout} ms, so a failover now could lose it; retry (scheduling is idempotent by id) "
            "or check the replicas"
        )


def _server_of(client: Any, keys: Sequence[str]) -> Any:
    """A client of the one server that holds ``keys`` (one hash slot): ``client`` itself unless
    it is a cluster's."""
    if not isinstance(client, RedisCluster) or not keys:
        return client
    return client.get_node_from_key(keys[0]).redis_connection


def function_missing(exc: redis.ResponseError) -> bool:
    """Whether ``exc`` says the server lacks the function library (or FCALL itself)."""
    text = str(exc).lower()
    return "function not found" in text or "unknown command" in text


# -- installing the library, for an admin ----------------------------------------------------


@dataclass(frozen=True)
class NodeFunctions:
    """The delayq libraries found on one server.

    Attributes:
        node: ``host:port`` of the server (of each primary, on a cluster).
        libraries: names of the ``delayq_*`` libraries loaded there, sorted.
    """

    node: str
    libraries: tuple[str, ...]

    @property
    def current(self) -> bool:
        """Whether this package version's library is there."""
        return LIBRARY in self.libraries


def install_functions(client: Any) -> list[NodeFunctions]:
    """Load this version's library (``FUNCTION LOAD REPLACE``) on the server, or on every primary
    of a cluster; libraries of other versions are left for the clients still using them.

    Returns what each server holds afterwards.
    """
    for node in _primaries(client):
        node.redis_connection.function_load(library_code(), replace=True)
    return functions_status(client)


def functions_status(client: Any) -> list[NodeFunctions]:
    """The delayq libraries on the server, or on each primary of a cluster."""
    out = []
    for node in _primaries(client):
        found = node.redis_connection.function_list(library="delayq_*")
        names = sorted(_text(_field(lib, "library_name")) for lib in found)
        out.append(NodeFunctions(node.name, tuple(names)))
    return out


class _Single:
    """A plain client dressed as a cluster node, so both kinds go through one loop."""

    def __init__(self, client: Any) -> None:
        self.redis_connection = client
        kwargs = client.connection_pool.connection_kwargs
        self.name = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"


def _primaries(client: Any) -> list[Any]:
    if isinstance(client, RedisCluster):
        return list(client.get_primaries())
    return [_Single(client)]


def _field(library: Any, name: str) -> Any:
    """A field of one FUNCTION LIST entry (a dict under RESP3, a flat list under RESP2)."""
    if isinstance(library, dict):
        return library.get(name, library.get(name.encode()))
    pairs = dict(zip(library[::2], library[1::2]))
    return pairs.get(name, pairs.get(name.encode()))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
