"""Settings of a delay store, checked once where they are made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigError
from .group_policies import GroupPolicies

__all__ = ["DEFAULT_URL", "Config"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Config:
    """Where the store lives and how it behaves.

    Attributes:
        url: Redis/Valkey URL (any node of a cluster works).
        prefix: key prefix; two prefixes on one server never see each other's items.
        shards: number of shards; fixed for the life of a prefix (recorded in Redis).
        max_payload_bytes: largest envelope accepted by ``schedule``.
        max_attempts: claims of one item before it goes to the dead letters.
        lease_seconds: how long a forwarder holds claimed items before they are due again.
        durable_replicas: when > 0, every write a user's call returns success for (schedule,
            reschedule, cancel, requeue, a batch's writes, a slot limit, a periodic change: the
            scripts ``ACKNOWLEDGED_SCRIPTS`` names) waits (WAIT) until that many replicas have
            it, and raises ``NotDurableError`` if they do not within ``durable_timeout_ms``.
            Redis replicates asynchronously: without this, a write acknowledged just before a
            primary fails can be lost on failover.
        durable_timeout_ms: how long such a write waits for its replicas.
        dead_letter_max: when > 0, each shard keeps at most this many dead letters; burying one
            more deletes the oldest for good (0: no cap).
        dead_letter_ttl_seconds: when > 0, dead letters older than this are deleted for good as
            new ones are buried (0: kept until requeued or purged).
        group_policies: group policies by key pattern (:class:`GroupPolicies`, or a mapping
            such as ``{"tenant-*": {"limit": 2}}``), applied by this store's forwarders below
            the items' own values and the runtime policy.
    """

    url: str = DEFAULT_URL
    prefix: str = "delayq"
    shards: int = 16
    max_payload_bytes: int = 1024 * 1024
    max_attempts: int = 10
    lease_seconds: float = 30.0
    durable_replicas: int = 0
    durable_timeout_ms: int = 1000
    dead_letter_max: int = 0
    dead_letter_ttl_seconds: int = 0
    group_policies: GroupPolicies = GroupPolicies()

    def __post_init__(self) -> None:
        if not isinstance(self.group_policies, GroupPolicies):  # a mapping, as settings give it
            object.__setattr__(self, "group_policies", GroupPolicies.from_mapping(self.group_policies))
        _check_prefix(self.prefix)
        _check_int("shards", self.shards, 1, 16384)
        _check_int("max_payload_bytes", self.max_payload_bytes, 64, 512 * 1024 * 1024)
        _check_int("max_attempts", self.max_attempts, 1, 1_000_000)
        _check_int("durable_replicas", self.durable_replicas, 0, 64)
        _check_int("durable_timeout_ms", self.durable_timeout_ms, 1, 600_000)
        _check_int("dead_letter_max", self.dead_letter_max, 0, 10**12)
        _check_int("dead_letter_ttl_seconds", self.dead_letter_ttl_seconds, 0, 10 * 366 * 86400)
        if not isinstance(self.lease_seconds, (int, float)) or not 0.1 <= self.lease_seconds <= 86400:
            raise ConfigError(f"lease_seconds={self.lease_seconds!r}: use a number between 0.1 and 86400")

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Config:
        """Build from a mapping, refusing unknown names instead of ignoring them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown delayq setting(s) {unknown}: known are {sorted(known)}")
        return cls(**values)


#: Not in a prefix: ``:`` separates it from the rest of a key (a prefix ``a:b`` would live inside
#: prefix ``a``'s keys and ACL patterns), glob characters would widen ACL patterns and SCAN
#: matches, braces would move the cluster hash tag.
_PREFIX_FORBIDDEN = frozenset(":*?[]\\{}")


def _check_prefix(prefix: Any) -> None:
    if (
        not isinstance(prefix, str)
        or not prefix
        or any(c in _PREFIX_FORBIDDEN or not c.isprintable() or c.isspace() for c in prefix)
    ):
        raise ConfigError(
            f"prefix {prefix!r}: use a non-empty name of letters, digits, '-', '_' or '.' (no ':', glob "
            "characters *?[]\\, braces, spaces or control characters), e.g. 'delayq' or 'app-tenant2'"
        )


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{name}={value!r}: use a whole number from {low} to {high}")
