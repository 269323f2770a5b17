"""The Lua scripts, one ``.lua`` file each, registered once per Redis client.

A line ``--- @include "name"`` pulls in ``includes/name.lua`` (BullMQ's convention), so helpers
shared by several scripts are written once. ``register_script`` returns redis-py ``Script``
objects, which run EVALSHA and reload the source on NOSCRIPT (after a restart or failover).

A script may start with a ``#!lua flags=...`` line (Redis 7+/Valkey script flags, e.g.
``allow-oom`` for the scripts that must run at maxmemory so a full store drains). fakeredis
cannot parse that line: :func:`source_for` drops it for fakeredis clients, the one place that
knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["SCRIPT_NAMES", "Scripts", "source", "source_for"]

SCRIPT_NAMES = (
    "schedule",
    "claim",
    "ack",
    "release",
    "fail",
    "cancel",
    "reschedule",
    "requeue",
    "purge",
    "defer",
    "take",
)
_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)


@cache
def source(name: str) -> str:
    """The Lua source of script ``name`` with its includes expanded."""
    here = resources.files(__package__)
    text = (here / f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: (here / "includes" / f"{m.group(1)}.lua").read_text(encoding="utf-8"), text)


def source_for(name: str, client: Any) -> str:
    """:func:`source` for ``client`` (a client or pipeline): without its shebang line on fakeredis."""
    text = source(name)
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    modules = (type(client).__module__, getattr(connection_class, "__module__", ""))
    fake = any(module.startswith("fakeredis") for module in modules)
    if fake and text.startswith("#!"):
        return text.partition("\n")[2]
    return text


@dataclass(frozen=True)
class Scripts:
    """The registered scripts of one client; attribute names match the ``.lua`` files."""

    schedule: Any
    claim: Any
    ack: Any
    release: Any
    fail: Any
    cancel: Any
    reschedule: Any
    requeue: Any
    purge: Any
    defer: Any
    take: Any

    @classmethod
    def register(cls, client: Any) -> Scripts:
        return cls(**{name: client.register_script(source_for(name, client)) for name in SCRIPT_NAMES})
