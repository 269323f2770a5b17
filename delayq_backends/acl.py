"""Least-privilege Redis ACL rules for the roles that use a delay store.

Each role may touch only the keys of one prefix (patterns matching exactly the shapes of
:mod:`~delayq_backends.keys`: ``<prefix>:{<prefix>:*}:*``, ``<prefix>:meta`` and the rate buckets
``<prefix>:{<prefix>}:rate:*`` and ``<prefix>:{<prefix>}:keyrate:*``; a prefix holds no ``:`` or
glob character, so no other prefix's keys match) and only its wake-up channel, with just the
commands that role sends, directly or from our Lua scripts (Redis checks both against the user's
ACL):

- ``producer``: schedules, reschedules and cancels (the adapters' ``apply_async``/``enqueue_at``);
- ``forwarder``: claims, acks, releases, fails, defers, takes rate-cap tokens, and sleeps on the
  wake-up channel;
- ``reader``: ``delayq stats``/``list``/``dlq list`` and dashboards, read-only.

A target's own keys (an RQ queue, a Redis list) are not covered: grant them separately.

With ``functions=True`` (the default) the producer and forwarder may run the scripts only as
the installed Function library (``+fcall``, ``+fcall_ro``; ``delayq functions install`` first),
never ``EVAL``/``SCRIPT LOAD``: a user that may send its own Lua may also send a loop that holds
the server BUSY until ``SHUTDOWN NOSAVE``. ``functions=False`` gives the EVAL rules, for servers
without functions (Redis < 7).
"""

from __future__ import annotations

from .config import Config
from .errors import ConfigError
from .keys import meta_key, periodic_key, wake_channel

__all__ = ["ROLES", "acl_rules", "acl_setuser", "key_patterns"]

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
#: schedule/ack with pipeline=: an adapter commits its own writes and ours in one MULTI/EXEC (WATCHing a lease).
_TRANSACTIONS = ("+multi", "+exec", "+discard", "+watch", "+unwatch")

ROLES: dict[str, tuple[str, ...]] = {
    # PEXPIREAT: debounce.lua lets a collapsed run's call counter expire
    "producer": (*_CONNECTION, *_TRANSACTIONS, *_SCRIPT_WRITES, *_READS, *_HASH_READS, "+hsetnx", "+pexpireat"),
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
    ),
    "reader": (*_CONNECTION, *_READS, *_HASH_READS),
}
#: The roles that run scripts.
_RUNS_SCRIPTS = ("producer", "forwarder")


def key_patterns(prefix: str) -> list[str]:
    """ACL key patterns covering exactly the keys of ``prefix`` (see :mod:`~delayq_backends.keys`)."""
    return [
        f"~{prefix}:{{{prefix}:*}}:*",
        f"~{meta_key(prefix)}",
        f"~{prefix}:{{{prefix}}}:rate:*",
        f"~{prefix}:{{{prefix}}}:keyrate:*",
        f"~{periodic_key(prefix)}",
    ]


def acl_rules(prefix: str, role: str, *, functions: bool = True) -> list[str]:
    """The ACL rules (after ``ACL SETUSER <name> on >password``) for ``role`` on ``prefix``.

    Raises:
        ConfigError: an unknown role, or a prefix :class:`~delayq_backends.config.Config` refuses.
    """
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}: use one of {sorted(ROLES)}")
    Config(prefix=prefix)  # a prefix with glob characters or ':' would cover other prefixes
    scripts = (_FUNCTIONS if functions else _SCRIPTS) if role in _RUNS_SCRIPTS else ()
    channels = [f"&{wake_channel(prefix)}"] if role != "reader" else []
    return ["resetkeys", "resetchannels", "-@all", *ROLES[role], *scripts, *key_patterns(prefix), *channels]


def acl_setuser(user: str, prefix: str, role: str, *, password: str | None = None, functions: bool = True) -> list[str]:
    """The full ``ACL SETUSER`` command as arguments (``>password`` or a placeholder)."""
    secret = f">{password}" if password is not None else "><password>"
    return ["ACL", "SETUSER", user, "reset", "on", secret, *acl_rules(prefix, role, functions=functions)]
