"""Group policies: what a group's values mean and how they are checked, and policies by pattern.

A group (a tenant, a customer, an endpoint: the slot key of :mod:`delayq_backends.slots`) has a
policy: ``limit`` (at most N of its items running), ``rate`` (N per second, minute or hour,
across every forwarder, each item charged its ``cost``), ``weight`` (its share when groups
compete), ``paused`` and a throttle. Three places set it, the first that sets a value wins:

1. the runtime policy (``DelayStore.set_group``, ``delayq groups set``), kept in the group's
   ``policy`` hash (:func:`~delayq_backends.keys.group_policy_key`);
2. the item (``schedule(..., group={"key": ..., "limit": 2})``);
3. a pattern (:class:`GroupPolicies`: Celery's ``delayq_group_policies = {"tenant-*": {"limit":
   2}}``, ``DELAYQ_GROUP_POLICIES`` as JSON for RQ and the CLI, ``delayq forward --group-policy
   PATTERN=JSON``), applied by the forwarder when it takes the group's slots.

``slot_take.lua`` (through ``includes/policy.lua``) applies the policy at every release.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import ConfigError, InvalidGroupPolicyError
from .models import GroupPolicy

__all__ = [
    "MAX_RATE_KEY",
    "MAX_SLOT_LIMIT",
    "GROUP_POLICIES_ENV",
    "MAX_GROUP_RATE",
    "MAX_THROTTLE_SECONDS",
    "MAX_WEIGHT",
    "PATTERN_FIELDS",
    "RATE_BURST_MS",
    "GroupPolicies",
    "check_group_key",
    "check_limit",
    "check_rate",
    "check_weight",
    "rate_per_second",
]

#: Longest rate key, in characters: a key is a name, and each active one is a bucket in Redis.
MAX_RATE_KEY = 200
#: Highest limit a slot may carry: a limit is how many tasks of a key run at once.
MAX_SLOT_LIMIT = 1_000_000

#: The environment variable holding the policies by pattern for RQ and the CLI (a JSON object).
GROUP_POLICIES_ENV = "DELAYQ_GROUP_POLICIES"
#: Highest weight: a share 1000 times the default's is already "all of it".
MAX_WEIGHT = 1000.0
#: Highest rate, in items per second (one bucket's refill; the Lua side checks the same bound).
MAX_GROUP_RATE = 1_000_000.0
#: Longest throttle, from an operator (a worker's is capped at ``MAX_HOLD_MS``); the scripts read
#: a ``throttled_until`` further ahead as garbage, so no write can stop a group for longer.
MAX_THROTTLE_SECONDS = 86_400
#: How much of its rate a group's bucket holds, in ms (``includes/policy.lua``'s ``BURST_MS``): a
#: forwarder late to ask by up to this long (a stalled process, a slow pass) loses no tokens.
RATE_BURST_MS = 500
#: What a pattern may set: the runtime-only values (paused, a throttle) are no pattern's.
PATTERN_FIELDS = ("limit", "rate", "weight")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def check_group_key(key: Any) -> str:
    """``key`` if it names a group: printable text of 1..200 characters without ``}:`` (which
    would close the group's hash tag and could match another key kind's ACL pattern).

    Raises:
        InvalidGroupPolicyError: anything else; nothing was written.
    """
    if not isinstance(key, str) or not 0 < len(key) <= MAX_RATE_KEY or not key.isprintable() or "}:" in key:
        raise InvalidGroupPolicyError(
            f"group {repr(key)[:80]}: use printable text of 1..{MAX_RATE_KEY} characters without '}}:', e.g. 'tenant-7'"
        )
    return key


def check_limit(key: str, limit: Any) -> int:
    """A limit: a whole number of running items in 1..10^6."""
    if type(limit) is not int or not 1 <= limit <= MAX_SLOT_LIMIT:
        raise InvalidGroupPolicyError(
            f"group {key!r}: limit={limit!r}: use a whole number N of running items, 1 <= N <= {MAX_SLOT_LIMIT}"
        )
    return limit


def check_rate(key: str, rate: Any) -> str:
    """A rate as the text the store keeps (``"10/s"``, ``"30/m"``, ``"100/h"``): from that text
    or a number (per second).

    Raises:
        InvalidGroupPolicyError: no rate of N > 0 per s, m or h (at most 10^6/s).
    """
    amount: Any = math.nan
    unit = "s"
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        amount = rate
    elif isinstance(rate, str):
        text, sep, unit = rate.strip().partition("/")
        amount, unit = text.strip(), unit.strip() if sep else "s"
    try:
        number = float(amount)
    except ValueError:
        number = math.nan
    if unit not in _UNITS or not math.isfinite(number) or number <= 0 or number / _UNITS[unit] > MAX_GROUP_RATE:
        raise InvalidGroupPolicyError(
            f"group {key!r}: rate={rate!r}: use 'N/s', 'N/m' or 'N/h' with N > 0 (at most "
            f"{MAX_GROUP_RATE:g}/s), e.g. '10/s'"
        )
    return f"{number:g}/{unit}"


def rate_per_second(rate: str) -> float:
    """Items per second of a rate checked by :func:`check_rate`."""
    amount, _, unit = rate.partition("/")
    return float(amount) / _UNITS[unit]


def check_weight(key: str, weight: Any) -> float:
    """A weight: a number in (0, 1000]."""
    ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight)
    if not ok or not 0 < weight <= MAX_WEIGHT:
        raise InvalidGroupPolicyError(f"group {key!r}: weight={weight!r}: use a number > 0 and <= {MAX_WEIGHT:g}")
    return float(weight)


def _pattern_policy(pattern: str, values: Any) -> GroupPolicy:
    """A pattern's policy from ``{"limit": .., "rate": .., "weight": ..}``."""
    if not isinstance(values, Mapping) or not values or set(values) - set(PATTERN_FIELDS):
        raise ConfigError(
            f"group policy {pattern!r}: {repr(values)[:80]}: use an object of {', '.join(PATTERN_FIELDS)}, "
            'e.g. {"limit": 2, "rate": "10/s"}'
        )
    try:
        return GroupPolicy(
            limit=None if values.get("limit") is None else check_limit(pattern, values["limit"]),
            rate=None if values.get("rate") is None else check_rate(pattern, values["rate"]),
            weight=None if values.get("weight") is None else check_weight(pattern, values["weight"]),
        )
    except InvalidGroupPolicyError as exc:
        raise ConfigError(f"group policy {exc}") from exc


@dataclass(frozen=True)
class GroupPolicies:
    """Policies by group key pattern (``fnmatch``, case-sensitive): a group takes the values of
    the first pattern it matches that sets each one, below its item's and its runtime policy's.

    Attributes:
        patterns: (pattern, policy) in their order.
    """

    patterns: tuple[tuple[str, GroupPolicy], ...] = ()

    @classmethod
    def from_mapping(cls, values: Any, *, source: str = "group policies") -> GroupPolicies:
        """From ``{"tenant-*": {"limit": 2}, ...}`` (in its order).

        Raises:
            ConfigError: not such a mapping, or a value out of range; says which and how.
        """
        if not isinstance(values, Mapping):
            example = '{"tenant-*": {"limit": 2}}'
            raise ConfigError(f"{source} {repr(values)[:80]}: use an object of pattern -> policy, e.g. {example}")
        for pattern in values:
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(f"{source}: pattern {pattern!r}: use a non-empty glob such as 'tenant-*'")
        try:
            return cls(tuple((p, _pattern_policy(p, v)) for p, v in values.items()))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    @classmethod
    def from_json(cls, text: str, *, source: str = GROUP_POLICIES_ENV) -> GroupPolicies:
        """From a JSON object (``DELAYQ_GROUP_POLICIES``)."""
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f'{source}: not JSON ({exc}): use e.g. \'{{"tenant-*": {{"limit": 2}}}}\'') from exc
        return cls.from_mapping(values, source=source)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GroupPolicies:
        """From ``DELAYQ_GROUP_POLICIES`` (none when unset or blank)."""
        text = (os.environ if environ is None else environ).get(GROUP_POLICIES_ENV, "")
        return cls.from_json(text) if text.strip() else cls()

    @classmethod
    def from_specs(cls, specs: Iterable[str]) -> GroupPolicies:
        """From ``PATTERN=JSON`` texts (``delayq forward --group-policy``), in their order."""
        values: dict[str, Any] = {}
        for spec in specs:
            pattern, sep, text = spec.partition("=")
            try:
                values[pattern.strip()] = json.loads(text) if sep else None
            except ValueError:
                values[pattern.strip()] = None
            if values[pattern.strip()] is None:
                raise ConfigError(f"--group-policy {spec!r}: use PATTERN=JSON, e.g. 'tenant-*={{\"limit\": 2}}'")
        return cls.from_mapping(values, source="--group-policy")

    def merged(self, first: GroupPolicies) -> GroupPolicies:
        """``first``'s patterns ahead of these (a process's own over an app's)."""
        return GroupPolicies((*first.patterns, *self.patterns))

    def of(self, key: str) -> GroupPolicy:
        """The values the patterns give ``key`` (each from the first matching pattern that sets it)."""
        found = GroupPolicy()
        for pattern, policy in self.patterns:
            if fnmatch.fnmatchcase(key, pattern):
                found = replace(
                    found,
                    limit=found.limit if found.limit is not None else policy.limit,
                    rate=found.rate if found.rate is not None else policy.rate,
                    weight=found.weight if found.weight is not None else policy.weight,
                )
        return found

    def __bool__(self) -> bool:
        return bool(self.patterns)
