"""Least-privilege Redis ACL rules for the roles that use a delay store.

Each role may touch only the keys of one prefix (``~<prefix>:*``, which covers every shard's
``{<prefix>:k}`` keys and ``<prefix>:meta``) and only its wake-up channel, with just the commands
that role sends, directly or from our Lua scripts (Redis checks both against the user's ACL):

- ``producer``: schedules, reschedules and cancels (the adapters' ``apply_async``/``enqueue_at``);
- ``forwarder``: claims, acks, releases, fails, defers, takes rate-cap tokens, and sleeps on the
  wake-up channel;
- ``reader``: ``delayq stats``/``list``/``dlq list`` and dashboards, read-only.

A target's own keys (an RQ queue, a Redis list) are not covered: grant them separately.
"""

from __future__ import annotations

from typing import Optional

from .errors import ConfigError
from .keys import wake_channel

__all__ = ["ROLES", "acl_rules", "acl_setuser"]

#: Sent by redis-py on connect and by the store's checks (INFO cluster detects cluster mode).
_CONNECTION = ("+ping", "+info", "+time", "+client|setinfo", "+client|setname", "+hello")
#: The scripts' own commands, which Redis checks when the script calls them.
_SCRIPTS = ("+evalsha", "+eval", "+script|load", "+script|exists")
_SCRIPT_WRITES = ("+zadd", "+zrem", "+hset", "+hdel", "+hincrby", "+publish")
_READS = ("+zrange", "+zrangebyscore", "+zrevrange", "+zscore", "+zmscore", "+zcard", "+zcount", "+exists")
_HASH_READS = ("+hget", "+hexists", "+hlen", "+hmget")

ROLES: dict[str, tuple[str, ...]] = {
    "producer": (*_CONNECTION, *_SCRIPTS, *_SCRIPT_WRITES, *_READS, *_HASH_READS, "+hsetnx"),
    # PEXPIRE: take.lua lets an idle rate-cap bucket expire
    "forwarder": (*_CONNECTION, *_SCRIPTS, *_SCRIPT_WRITES, *_READS, *_HASH_READS, "+hsetnx", "+subscribe", "+pexpire"),
    "reader": (*_CONNECTION, *_READS, *_HASH_READS),
}


def acl_rules(prefix: str, role: str) -> list[str]:
    """The ACL rules (after ``ACL SETUSER <name> on >password``) for ``role`` on ``prefix``.

    Raises:
        ConfigError: an unknown role.
    """
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}: use one of {sorted(ROLES)}")
    # every key, <prefix>:meta included, begins with "<prefix>:", so one key pattern serves
    channels = [f"&{wake_channel(prefix)}"] if role != "reader" else []
    return ["resetkeys", "resetchannels", "-@all", *ROLES[role], f"~{prefix}:*", *channels]


def acl_setuser(user: str, prefix: str, role: str, *, password: Optional[str] = None) -> list[str]:
    """The full ``ACL SETUSER`` command as arguments (``>password`` or a placeholder)."""
    secret = f">{password}" if password is not None else "><password>"
    return ["ACL", "SETUSER", user, "reset", "on", secret, *acl_rules(prefix, role)]
