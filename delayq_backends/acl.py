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
  wake-up channel, and runs the operators' ``delayq dlq`` purge and requeue. It syncs periodic
  entries from code (``--rq-cron``, a Celery app's ``beat_schedule``), so it may also write what
  only an operator may: the periodic registry, the code schedule's record and the trusted
  definitions of entries that carry code to run (:mod:`~delayq_backends.periodic.trust`).
- ``operator``: a person's or a deploy's credential for ``delayq periodic``, ``rq-cron sync``,
  ``dlq``, ``rq-migrate``, ``delayq groups`` and the dashboard: the forwarder's commands and
  keys, and DEL of a group's older limit string (``set_group``). The one role beside the
  forwarder that may define code an RQ worker runs (an RQ periodic entry), and with it the one
  that sets group policies (pause, throttle, limit, rate, weight): a producer or worker
  credential cannot (a worker throttles a group only by a report on a hold it was given).
- ``worker``: a Celery or RQ worker with dedupe (a lossless forwarder's workers): a producer (a
  task's retries and delayed children go through the store) that may also write and read the
  runs' start records (``SET NX PX``, ``GET``), record periodic entries' runs in their
  history (the forwarder records their publish), and report its tasks' concurrency slot holds
  and throttle their groups (``HSET`` into a slot key's ``reports``, nothing else there; the
  holds and policies are the forwarders' and operators').
- ``reader``: ``delayq stats``/``list``/``dlq list``/``periodic list``/``slots``/``batches list``
  and every dashboard panel and API read, read-only.

The producer and worker may not write (nor call the scripts that write) the periodic registry,
the code schedule's record or the trusted definitions: a producer can store any item, but an
item can only become work of a kind its writer's role may create (:func:`operator_keys`).
:func:`key_table` renders who may write and read each key kind (docs/security.md holds it).

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

from fnmatch import fnmatchcase

from .config import Config
from .errors import ConfigError
from .keys import (
    GROUP_KEYS,
    ShardKeys,
    batch_channel,
    group_wake_channel,
    key_rate_key,
    meta_key,
    periodic_code_key,
    periodic_key,
    periodic_trust_key,
    rate_key,
    wake_channel,
)
from .scripts.library import function_name

__all__ = [
    "PRODUCER_FUNCTIONS",
    "ROLES",
    "WORKER_FUNCTIONS",
    "acl_rules",
    "acl_setuser",
    "key_patterns",
    "key_table",
    "operator_keys",
]

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

#: The scripts a producer runs: its writes, and a batch's open, adds and close (batch_end also
#: records a worker's report of a sub-job's end). Not the periodic entries' compare-and-set
#: (rearm), version check (sync_version) or trusted definitions (periodic_trust): syncs and
#: ``delayq periodic`` run on the forwarder or operator role.
PRODUCER_FUNCTIONS = (
    "schedule", "schedule_one", "group_schedule", "cancel", "reschedule", "debounce", "batch_open", "batch_add",
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
    # TYPE: the periodic registry's check; SCAN: the slot and batch keys in use (the dashboard,
    # `delayq slots`/`batches list`): it lists key names (never values) of the whole database,
    # since Redis filters no SCAN by the user's key patterns; more reads in selectors (acl_rules)
    "reader": (*_CONNECTION, *_READS, *_HASH_READS, "+type", "+scan"),
}
#: The operator (people and deploys: ``delayq periodic``, ``rq-cron sync``, ``dlq``, the
#: dashboard) runs the forwarder's scripts: the forwarder's commands and keys.
ROLES["operator"] = ROLES["forwarder"]
#: The roles that run scripts.
_RUNS_SCRIPTS = ("producer", "forwarder", "operator", "worker")
#: The roles limited to a producer's functions and keys.
_PRODUCES = ("producer", "worker")


def operator_keys(prefix: str) -> list[str]:
    """The keys only the operator and forwarder roles may write: the periodic registry, the code
    schedule's record (a producer deleting it let an old deploy's sync win) and the trusted
    definitions (a producer writing them could make an RQ worker run any function)."""
    return [periodic_key(prefix), periodic_code_key(prefix), periodic_trust_key(prefix)]


def key_patterns(prefix: str) -> list[str]:
    """ACL key patterns covering exactly the keys of ``prefix`` (see :mod:`~delayq_backends.keys`)."""
    return [
        f"~{_shard_key(prefix, '*')}",
        f"~{meta_key(prefix)}",
        f"~{prefix}:{{{prefix}}}:rate:*",
        f"~{prefix}:{{{prefix}}}:keyrate:*",
        *(f"~{k}" for k in operator_keys(prefix)),
    ]


def _shard_key(prefix: str, name: str) -> str:
    """The pattern of key ``name`` of every shard (``ShardKeys``: ``<prefix>:{<tag>}:<name>``)."""
    return f"{prefix}:{{{prefix}:*}}:{name}"


#: What the batch scripts, ``batch_status`` and ``delayq batches pending`` send on a batch's keys
#: beyond a producer's own commands, only there (a selector): PEXPIRE on a shard's keys would drop
#: a shard's schedule.
_BATCH_COMMANDS = (
    "+type", "+hgetall", "+sadd", "+srem", "+scard", "+sismember", "+smismember", "+sintercard", "+sscan",
    "+llen", "+rpush", "+lrange", "+pexpire", "+del",
)  # fmt: skip
#: The batch scripts that take a batch's fired mark (``ShardKeys.batch_fired``), which the
#: producer and worker roles may only read, and write as RENAMENX's target: so they can neither
#: delete it nor shorten its TTL, and a completed batch never fires again.
_FIRING_FUNCTIONS = ("batch_open", "batch_end")


def _batch_keys(prefix: str) -> str:
    """The pattern of every batch's keys (``ShardKeys.batch``, ``batch_members``, ``batch_done``, ``batch_failed``)."""
    return _shard_key(prefix, "batch*")


#: What periodic_run.lua sends on an entry's history keys beyond the roles' own commands, only
#: there (a selector): DEL (a key of another type, a hand write, is replaced), the bound's trim
#: and the keys' TTL.
_HISTORY_COMMANDS = ("+type", "+del", "+zremrangebyrank", "+zcard", "+zrange", "+hget", "+pexpire")


def _fired_keys(prefix: str) -> str:
    """The pattern of every batch's fired mark (``ShardKeys.batch_fired``)."""
    return _shard_key(prefix, "fired:*")


def _firing_rules(prefix: str, role: str, functions: bool) -> list[str]:
    """The selectors of a batch's fired mark: the scripts that take it (with every key they
    are given: a script's keys must all pass in one selector), its reads, and RENAMENX onto it
    (write only: RENAMENX from the mark needs read too, so it cannot be moved away)."""
    scripts = [f"+fcall|{function_name(n)}" for n in _FIRING_FUNCTIONS] if functions else ["+evalsha", "+eval"]
    shard = [f"~{_shard_key(prefix, n)}" for n in ("due", "items", "tries", "leased", "ranked", "batch*")]
    return [
        f"({' '.join(scripts)} {' '.join(shard)} ~{_fired_keys(prefix)})",
        f"(+exists +type +hget %R~{_fired_keys(prefix)})",
        f"(+renamenx ~{_batch_keys(prefix)} %W~{_fired_keys(prefix)})",
    ]


def _history_keys(prefix: str) -> str:
    """The pattern of every periodic entry's history keys (``ShardKeys.periodic_history``, ``periodic_runs``)."""
    return _shard_key(prefix, "periodic_*")


def _slot_holds(prefix: str, name: str = "holds") -> str:
    """The pattern of every slot key's holds (``keys.slot_holds_key``), or key ``name``."""
    return f"{prefix}:{{{prefix}:slot:*}}:{name}"


def _role_keys(prefix: str, role: str) -> list[str]:
    """The key rules of ``role``: read and write (``~``) or read only (``%R~``)."""
    if role in _PRODUCES:
        # a grouped item is scheduled born parked in its group's line (group_schedule.lua); the
        # parking keys (parked, parked_why) stay the forwarders'
        lines = ("gline:*", "gready")
        writes = [
            _shard_key(prefix, n) for n in ("due", "items", "tries", "leased", "ranked", *lines, "calls:*", "batch*")
        ]
        reads = [_shard_key(prefix, "dead*"), meta_key(prefix)]
        if role == "worker":
            # a slot key's line, read to bring its head forward at a task's end; the holds, tokens
            # and limit are the forwarders' alone, the reports a selector's HSET only (acl_rules)
            reads.append(_slot_holds(prefix, "waiting"))
            writes.append(_history_keys(prefix))  # periodic_run.lua: the runs it started and ended
        return [*(f"~{k}" for k in writes), *(f"%R~{k}" for k in reads)]
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
    if role in ("forwarder", "operator", "worker"):  # a worker's end names its group; forwarders listen
        channels.append(f"&{group_wake_channel(prefix)}")
    if role in _PRODUCES:  # batch_end.lua publishes a batch's summary
        channels.append(f"&{batch_channel(prefix, '*')}")
    rules = ["resetkeys", "resetchannels", "-@all", *ROLES[role], *_scripts(role, functions)]
    rules += [*_role_keys(prefix, role), *channels]
    if role in _PRODUCES:  # debounce.lua lets a collapsed run's call counter expire: that key only
        rules.append(f"(+pexpireat ~{_shard_key(prefix, 'calls:*')})")
        rules.append(f"({' '.join(_BATCH_COMMANDS)} ~{_batch_keys(prefix)})")
        rules += _firing_rules(prefix, role, functions)
    if role in ("forwarder", "operator"):  # delayq dlq purge reports a purged sub-job to its batch (batch_end.lua)
        rules.append(f"({' '.join(_BATCH_COMMANDS)} +renamenx ~{_batch_keys(prefix)} ~{_fired_keys(prefix)})")
    if role in ("forwarder", "operator", "worker"):  # periodic_run.lua: runs published, started and ended
        rules.append(f"({' '.join(_HISTORY_COMMANDS)} ~{_history_keys(prefix)})")
    if role == "operator":  # set_group's limit replaces the older limit string (set_slot_limit's): that key only
        rules.append(f"(+del ~{_slot_holds(prefix, 'limit')})")
    if role == "reader":  # a slot key's limit, a batch's progress: only there (an HGETALL of a
        # shard's items hash would hold the server)
        rules.append(f"(+get ~{_slot_holds(prefix, 'limit')})")
        rules.append(f"(+hgetall +scard +sintercard +lrange ~{_batch_keys(prefix)})")
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


# -- who may write and read each key kind (docs/security.md) ------------------------------------

#: The commands that change a key: what tells "write" from "read" in :func:`key_table`.
_WRITE_COMMANDS = frozenset(
    (*_SCRIPT_WRITES, "+hsetnx", "+set", "+del", "+pexpire", "+pexpireat", "+sadd", "+srem", "+rpush",
     "+zremrangebyscore", "+zremrangebyrank")
)  # fmt: skip


def _key_kinds(prefix: str) -> list[tuple[str, str]]:
    """(name in keys.py, an example key) of every key kind of ``prefix``."""
    shard = ShardKeys(prefix, 0)
    return [
        *((f"ShardKeys.{n}", getattr(shard, n)) for n in ("due", "items", "tries", "leased", "ranked")),
        *((f"ShardKeys.{n}", getattr(shard, n)) for n in ("dead", "dead_items", "dead_info")),
        *((f"ShardKeys.{n}", getattr(shard, n)) for n in ("parked", "parked_why", "gready")),
        ("ShardKeys.gline", shard.gline("K")),
        ("ShardKeys.calls", shard.calls("ID")),
        ("ShardKeys.started", shard.started("ID", 0)),
        *((f"ShardKeys.{n}", getattr(shard, n)("K")) for n in ("batch", "batch_members", "batch_done", "batch_failed")),
        *((f"ShardKeys.{n}", getattr(shard, n)("NAME")) for n in ("periodic_history", "periodic_runs")),
        *((f.__name__, f(prefix, "K")) for f in GROUP_KEYS),
        ("meta_key", meta_key(prefix)),
        ("rate_key", rate_key(prefix, "Q")),
        ("key_rate_key", key_rate_key(prefix, "Q", "K")),
        *((f.__name__, f(prefix)) for f in (periodic_key, periodic_code_key, periodic_trust_key)),
    ]


def _access(rules: list[str], key: str) -> str:
    """``write``, ``read`` or ``-``: what ``rules`` let their user do to ``key``, directly or
    through the scripts (whose writes Redis checks against the same rules)."""
    root = {r for r in rules if r.startswith("+")}
    writes = bool(root & _WRITE_COMMANDS)
    access = "-"
    for rule in rules:
        if rule.startswith("("):  # a selector: its commands on its keys only
            words = rule.strip("()").split()
            patterns, commands = [w[1:] for w in words if w.startswith("~")], set(words) - {"~"}
            if any(fnmatchcase(key, p) for p in patterns):
                if commands & _WRITE_COMMANDS:
                    return "write"
                access = "read"
        elif rule.startswith(("~", "%R~")) and fnmatchcase(key, rule.partition("~")[2]):
            if rule.startswith("~") and writes:
                return "write"
            access = "read"
    return access


def key_table(prefix: str = "P") -> str:
    """The Markdown table of which key kind each role may write (and read), from the rules
    above (``delayq acl`` with the Function library): docs/security.md holds it, a test checks it."""
    roles = list(ROLES)
    rules = {role: acl_rules(prefix, role) for role in roles}
    lines = [
        f"| key (`keys.py`) | example (prefix `{prefix}`) | {' | '.join(roles)} |",
        f"|---|---|{'---|' * len(roles)}",
    ]
    for name, key in _key_kinds(prefix):
        cells = " | ".join(_access(rules[role], key) for role in roles)
        lines.append(f"| `{name}` | `{key}` | {cells} |")
    return "\n".join(lines) + "\n"
