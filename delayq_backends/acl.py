"""Least-privilege Redis ACL rules for the roles that use a delay store.

Each role may touch only the keys of one prefix (patterns matching exactly the shapes of
:mod:`~delayq_backends.keys`; a prefix holds no ``:`` or glob character, so no other prefix's keys
match) and only its wake-up channel, with just the commands that role sends, directly or from our
Lua scripts (Redis checks both against the user's ACL):

- ``producer``: schedules, reschedules, cancels and debounces (the adapters' ``apply_async``/
  ``enqueue_at``), durably (``WAIT``). It may call only those functions of the library
  (``+fcall|<function>``), so a claim, ack, release, extend, purge or requeue sent as FCALL is
  refused; it may not write the dead letters, the metadata, the rate buckets or the start records
  (``%R~``), and may PEXPIREAT only debounce counters (a selector).
- ``forwarder``: claims, acks, releases, fails, defers, takes rate-cap tokens, sleeps on the
  wake-up channel, and runs the operators' ``delayq dlq`` purge and requeue.
- ``worker``: a Celery or RQ worker with dedupe (a lossless forwarder's workers): a producer (a
  task's retries and delayed children go through the store) that may also write and read the
  runs' start records (``SET NX PX``, ``GET``), record periodic entries' runs in their
  history (the forwarder records their publish), and report its tasks' concurrency slot holds
  (``HSET`` into a slot key's ``reports``, nothing else there; the holds are the forwarders').
- ``reader``: ``delayq stats``/``list``/``dlq list`` and dashboards, read-only.

A target's own keys (an RQ queue, a Redis list) are not covered: grant them separately.

With ``functions=True`` (the default) the producer and forwarder may run the scripts only as
the installed Function library (``+fcall``, ``+fcall_ro``; ``delayq functions install`` first),
never ``EVAL``/``SCRIPT LOAD``: a user that may send its own Lua may also send a loop that holds
the server BUSY until ``SHUTDOWN NOSAVE``. The producer's functions are named with the library's
version hash, so a new package version needs its ``delayq acl`` applied before its producers
start. ``functions=False`` gives the EVAL rules, for servers without functions (Redis < 7): there
a producer may run any script, forwarders' included (see the README's Security section).
"""

from __future__ import annotations

from .config import Config
from .errors import ConfigError
from .keys import batch_channel, meta_key, periodic_code_key, periodic_key, wake_channel
from .scripts.library import function_name

__all__ = ["PRODUCER_FUNCTIONS", "ROLES", "WORKER_FUNCTIONS", "acl_rules", "acl_setuser", "key_patterns"]

#: Sent by redis-py on connect and by the store's checks (INFO cluster detects cluster mode).
#: Not CLIENT SETINFO: Redis 7.0 does not know it (ACL SETUSER would fail), and redis-py ignores
#: its refusal.
#: CLUSTER SLOTS/SHARDS and COMMAND (GETKEYS): a cluster client maps slots and finds FCALL's keys.
_CONNECTION = ("+ping", "+info", "+time", "+client|setname", "+hello", "+cluster|slots", "+cluster|shards", "+command")
#: Running the scripts: as the installed Function library, or (the fallback) as EVAL scripts.
_FUNCTIONS = ("+fcall", "+fcall_ro")
_SCRIPTS = ("+evalsha", "+eval", "+script|load", "+script|exists")
#: The scripts' own commands, which Redis checks when the script calls them.
_SCRIPT_WRITES = ("+zadd", "+zrem", "+hset", "+hdel", "+hincrby", "+publish")
#: schedule/ack with pipeline=: an adapter commits its own writes and ours in one MULTI/EXEC (WATCHing a lease).
_TRANSACTIONS = ("+multi", "+exec", "+discard", "+watch", "+unwatch")
_READS = ("+zrange", "+zrangebyscore", "+zrevrange", "+zscore", "+zmscore", "+zcard", "+zcount", "+exists")
#: HSCAN: the periodic entries' registry (``periodic list``, a sync at forwarder start)
_HASH_READS = ("+hget", "+hexists", "+hlen", "+hmget", "+hscan")

#: The scripts a producer runs: its writes, the periodic sync's compare-and-set (rearm) and
#: version check (sync_version), and a batch's open, adds and close (batch_end also records a
#: worker's report of a sub-job's end).
PRODUCER_FUNCTIONS = (
    "schedule", "schedule_one", "cancel", "reschedule", "debounce", "rearm", "sync_version", "batch_open", "batch_add",
    "batch_end",
)  # fmt: skip

#: The scripts a worker runs besides a producer's: promote brings the head of a concurrency
#: slot's line forward when the worker reports a task's end (its reports are plain HSETs, see
#: _role_keys); periodic_run: a periodic entry's run started and ended, in the entry's history.
WORKER_FUNCTIONS = ("promote", "periodic_run")

#: WAIT: durable_replicas; PEXPIREAT only in the selector of debounce counters (acl_rules)
_PRODUCER = (*_CONNECTION, *_TRANSACTIONS, *_SCRIPT_WRITES, *_READS, *_HASH_READS, "+hsetnx", "+wait")

ROLES: dict[str, tuple[str, ...]] = {
    "producer": _PRODUCER,
    # PEXPIRE: take.lua lets an idle rate-cap bucket expire
    "forwarder": (
        *_CONNECTION,
        *_TRANSACTIONS,
        *_SCRIPT_WRITES,
        *_READS,
        *_HASH_READS,
        "+hsetnx",
        "+subscribe",
        "+pexpire",
        "+get",  # a start record's value, told from a hand write (lossless mode); a slot's limit
        "+wait",
        "+type",  # slot_take.lua: a slot key of another type (a hand write) is dropped
        "+zremrangebyscore",  # slot_take.lua: lapsed holds and places in line
        "+zrank",  # slot_take.lua: an item's place in its key's line
    ),
    # a producer (a task's retry or delayed child goes through the store); the commands of a
    # run's start record (dedupe.RunGuard) only in a selector of those records (acl_rules)
    "worker": _PRODUCER,
    "reader": (*_CONNECTION, *_READS, *_HASH_READS),
}
#: The roles that run scripts.
_RUNS_SCRIPTS = ("producer", "forwarder", "worker")
#: The roles limited to a producer's functions and keys.
_PRODUCES = ("producer", "worker")


def key_patterns(prefix: str) -> list[str]:
    """ACL key patterns covering exactly the keys of ``prefix`` (see :mod:`~delayq_backends.keys`)."""
    return [
        f"~{_shard_key(prefix, '*')}",
        f"~{meta_key(prefix)}",
        f"~{prefix}:{{{prefix}}}:rate:*",
        f"~{prefix}:{{{prefix}}}:keyrate:*",
        f"~{periodic_key(prefix)}",
        f"~{periodic_code_key(prefix)}",
    ]


def _shard_key(prefix: str, name: str) -> str:
    """The pattern of key ``name`` of every shard (``ShardKeys``: ``<prefix>:{<tag>}:<name>``)."""
    return f"{prefix}:{{{prefix}:*}}:{name}"


#: What the batch scripts and ``batch_status`` send on a batch's keys beyond a producer's own
#: commands, only there (a selector): PEXPIRE on a shard's keys would drop a shard's schedule.
_BATCH_COMMANDS = (
    "+type", "+hgetall", "+sadd", "+srem", "+scard", "+sismember", "+llen", "+rpush", "+lrange", "+pexpire",
)  # fmt: skip


def _batch_keys(prefix: str) -> str:
    """The pattern of every batch's keys (``ShardKeys.batch``, ``batch_members``, ``batch_done``, ``batch_failed``)."""
    return _shard_key(prefix, "batch*")


#: What periodic_run.lua sends on an entry's history keys beyond the roles' own commands, only
#: there (a selector): DEL (a key of another type, a hand write, is replaced), the bound's trim
#: and the keys' TTL.
_HISTORY_COMMANDS = ("+type", "+del", "+zremrangebyrank", "+zcard", "+zrange", "+hget", "+pexpire")


def _history_keys(prefix: str) -> str:
    """The pattern of every periodic entry's history keys (``ShardKeys.periodic_history``, ``periodic_runs``)."""
    return _shard_key(prefix, "periodic_*")


def _slot_holds(prefix: str, name: str = "holds") -> str:
    """The pattern of every slot key's holds (``keys.slot_holds_key``), or key ``name``."""
    return f"{prefix}:{{{prefix}:slot:*}}:{name}"


def _role_keys(prefix: str, role: str) -> list[str]:
    """The key rules of ``role``: read and write (``~``) or read only (``%R~``)."""
    if role in _PRODUCES:
        writes = [_shard_key(prefix, n) for n in ("due", "items", "tries", "leased", "ranked", "calls:*", "batch*")]
        reads = [_shard_key(prefix, "dead*"), meta_key(prefix)]
        if role == "worker":
            # a slot key's line, read to bring its head forward at a task's end; the holds, tokens
            # and limit are the forwarders' alone, the reports a selector's HSET only (acl_rules)
            reads.append(_slot_holds(prefix, "waiting"))
            writes.append(_history_keys(prefix))  # periodic_run.lua: the runs it started and ended
        periodic = (f"~{periodic_key(prefix)}", f"~{periodic_code_key(prefix)}")
        return [*(f"~{k}" for k in writes), *periodic, *(f"%R~{k}" for k in reads)]
    return key_patterns(prefix)


def _scripts(role: str, functions: bool) -> tuple[str, ...]:
    """How ``role`` may run the scripts: the producer only its own functions."""
    if role not in _RUNS_SCRIPTS:
        return ()
    if not functions:
        return _SCRIPTS
    if role in _PRODUCES:
        own = (*PRODUCER_FUNCTIONS, *WORKER_FUNCTIONS) if role == "worker" else PRODUCER_FUNCTIONS
        return (*(f"+fcall|{function_name(n)}" for n in own), f"+fcall_ro|{function_name('version')}")
    return _FUNCTIONS


def acl_rules(prefix: str, role: str, *, functions: bool = True) -> list[str]:
    """The ACL rules (after ``ACL SETUSER <name> on >password``) for ``role`` on ``prefix``.

    Raises:
        ConfigError: an unknown role, or a prefix :class:`~delayq_backends.config.Config` refuses.
    """
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}: use one of {sorted(ROLES)}")
    Config(prefix=prefix)  # a prefix with glob characters or ':' would cover other prefixes
    channels = [f"&{wake_channel(prefix)}"] if role in _RUNS_SCRIPTS else []
    if role in _PRODUCES:  # batch_end.lua publishes a batch's summary
        channels.append(f"&{batch_channel(prefix, '*')}")
    rules = ["resetkeys", "resetchannels", "-@all", *ROLES[role], *_scripts(role, functions)]
    rules += [*_role_keys(prefix, role), *channels]
    if role in _PRODUCES:  # debounce.lua lets a collapsed run's call counter expire: that key only
        rules.append(f"(+pexpireat ~{_shard_key(prefix, 'calls:*')})")
        rules.append(f"({' '.join(_BATCH_COMMANDS)} ~{_batch_keys(prefix)})")
    if role in ("forwarder", "worker"):  # periodic_run.lua: runs published (forwarder), started and ended
        rules.append(f"({' '.join(_HISTORY_COMMANDS)} ~{_history_keys(prefix)})")
    if role == "worker":  # a SET on any other key could replace a shard's whole schedule
        # TYPE, WATCH, DEL: a record that is none (a hand write) is replaced; PEXPIRE: a retried
        # record is written again for durable_replicas' WAIT
        rules.append(f"(+set +get +type +watch +del +pexpire ~{_shard_key(prefix, 'started:*')})")
        # its reports on its tasks' slot holds: HSET only, so it can neither read nor delete
        # another worker's (each a random field), and slot_take.lua counts only those that carry
        # their hold's token
        rules.append(f"(+hset ~{_slot_holds(prefix, 'reports')})")
    return rules


def acl_setuser(user: str, prefix: str, role: str, *, password: str | None = None, functions: bool = True) -> list[str]:
    """The full ``ACL SETUSER`` command as arguments (``>password`` or a placeholder)."""
    secret = f">{password}" if password is not None else "><password>"
    return ["ACL", "SETUSER", user, "reset", "on", secret, *acl_rules(prefix, role, functions=functions)]
