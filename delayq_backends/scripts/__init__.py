"""The Lua scripts, one ``.lua`` file each, registered once per Redis client.

A line ``--- @include "name"`` pulls in ``includes/name.lua`` (BullMQ's convention), so helpers
shared by several scripts are written once. ``register_script`` returns redis-py ``Script``
objects, which run EVALSHA and reload the source on NOSCRIPT (after a restart or failover).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["SCRIPT_NAMES", "Scripts", "source"]

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
    "extend",
)
_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)


@cache
def source(name: str) -> str:
    """The Lua source of script ``name`` with its includes expanded."""
    here = resources.files(__package__)
    text = (here / f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: (here / "includes" / f"{m.group(1)}.lua").read_text(encoding="utf-8"), text)


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
    extend: Any

    @classmethod
    def register(cls, client: Any) -> Scripts:
        return cls(**{name: client.register_script(source(name)) for name in SCRIPT_NAMES})
