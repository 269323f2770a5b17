"""Settings of a delay store, checked once where they are made."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar, cast

from .errors import ConfigError
from .group_policies import GROUP_POLICIES_ENV, GroupPolicies

__all__ = ["DEFAULT_URL", "Config", "Setting", "check_settings", "reference", "setting", "settings_of"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"

T = TypeVar("T")


@dataclass(frozen=True)
class Setting:
    """One setting, written once: what it means, its default and range, and its name in each
    interface (a ``delayq forward`` flag, an environment variable, a Celery setting).

    Records declare their fields with :func:`setting`, so this travels in the field's metadata;
    the record's check, the CLI options, the Celery reader and docs/configuration.md all read it.
    """

    help: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    #: the type a value must have (default: the default's)
    kind: type | None = None
    #: the flag of ``delayq forward`` (and ``celery -A proj delayq forward``)
    flag: str | None = None
    #: older flags, hidden from ``--help`` and still accepted
    aliases: tuple[str, ...] = ()
    envvar: str | None = None
    #: its name in a Celery app's ``app.conf``
    celery: str | None = None
    metavar: str | None = None
    #: the values allowed, when a few
    choices: tuple[str, ...] = ()
    #: the default as the reference shows it (default: derived from ``default``)
    shown: str | None = None
    #: checks a value of another shape (a mapping from settings), named by the label, returning the typed one
    parse: Callable[[Any, str], Any] | None = None
    #: turns a repeatable flag's texts into the value
    specs: Callable[[Sequence[str]], Any] | None = None
    #: the field's name, filled in by :func:`settings_of`
    name: str = ""

    def check(self, value: Any, label: str | None = None) -> Any:
        """``value`` (typed by :attr:`parse`), or a :class:`ConfigError` naming ``label`` and what to use."""
        if self.parse is not None:
            return self.parse(value, label or self.name)
        if value is None and self.default is None:
            return None
        kind = self.kind or type(self.default)
        fits, want = _KINDS.get(kind, (lambda v: isinstance(v, kind), f"a {kind.__name__}"))
        if self.choices:
            fits, want = self.choices.__contains__, f"one of {list(self.choices)}"
        in_range = (
            not _number(value) or (self.low is None or value >= self.low) and (self.high is None or value <= self.high)
        )
        if not (fits(value) and in_range):
            raise ConfigError(f"{label or self.name}={value!r}: use {want}{self.span} ({self.help})")
        return value

    @property
    def span(self) -> str:
        low, high = (f"{b:g}" if isinstance(b, float) else str(b) for b in (self.low, self.high))
        return "" if self.low is None else f" >= {low}" if self.high is None else f" from {low} to {high}"

    @property
    def default_text(self) -> str:
        return self.shown or _shown(self.default)

    def row(self) -> str:
        """This setting's line of the reference table."""
        flags = ", ".join([f"`{self.flag}`"] * bool(self.flag) + [f"`{a}` (old name)" for a in self.aliases])
        cells = [f"`{self.name}`", flags, f"`{self.envvar}`" if self.envvar else "",
                 f"`{self.celery}`" if self.celery else "", self.default_text,
                 self.help.replace("|", "\\|")]  # fmt: skip
        return "| " + " | ".join(cells) + " |"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_KINDS: dict[type, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "True or False"),
    int: (lambda v: _number(v) and isinstance(v, int), "a whole number"),
    float: (lambda v: _number(v) and math.isfinite(v), "a number"),
}


def _shown(default: Any) -> str:
    if default is None or default == {} or default == ():
        return "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    return f"`{default:g}`" if isinstance(default, float) else f"`{default}`"


def setting(default: T, help: str, **kw: Any) -> T:
    """A dataclass field with its :class:`Setting` (``kw``: its other attributes)."""
    meta = {"setting": Setting(help, default, **kw)}
    if isinstance(default, (dict, list, set)):
        return cast(T, field(default_factory=type(default), metadata=meta))
    return field(default=default, metadata=meta)


def settings_of(record: Any) -> tuple[Setting, ...]:
    """The settings of a record class (or instance), in field order."""
    return tuple(replace(f.metadata["setting"], name=f.name) for f in fields(record) if "setting" in f.metadata)


def check_settings(record: Any) -> None:
    """Check each setting of a frozen record (in ``__post_init__``), storing what :attr:`Setting.parse` typed."""
    for s in settings_of(record):
        value = s.check(getattr(record, s.name))
        if value is not getattr(record, s.name):
            object.__setattr__(record, s.name, value)


def reference(tables: Iterable[tuple[str, Sequence[Setting]]]) -> str:
    """The settings reference of docs/configuration.md: one table per record, each setting a row."""
    head = "| setting | CLI option | env var | Celery | default | meaning |\n|---|---|---|---|---|---|"
    return "\n\n".join(f"### {title}\n\n{head}\n" + "\n".join(s.row() for s in rows) for title, rows in tables)


def _check_prefix(prefix: Any, label: str) -> str:
    if (
        not isinstance(prefix, str)
        or not prefix
        or any(c in _PREFIX_FORBIDDEN or not c.isprintable() or c.isspace() for c in prefix)
    ):
        raise ConfigError(
            f"prefix {prefix!r}: use a non-empty name of letters, digits, '-', '_' or '.' (no ':', glob "
            "characters *?[]\\, braces, spaces or control characters), e.g. 'delayq' or 'app-tenant2'"
        )
    return prefix


def _group_policies(value: Any, label: str) -> GroupPolicies:
    """A mapping as settings give it (``{"tenant-*": {"limit": 2}}``), or the record itself."""
    return value if isinstance(value, GroupPolicies) else GroupPolicies.from_mapping(value, source=label)


#: Not in a prefix: ``:`` separates it from the rest of a key (a prefix ``a:b`` would live inside
#: prefix ``a``'s keys and ACL patterns), glob characters would widen ACL patterns and SCAN
#: matches, braces would move the cluster hash tag.
_PREFIX_FORBIDDEN = frozenset(":*?[]\\{}")


@dataclass(frozen=True)
class Config:
    """Where the store lives and how it behaves; each field's :class:`Setting` says what it is.

    ``durable_replicas``: Redis replicates asynchronously, so without it a write acknowledged
    just before a primary fails can be lost on failover; the writes it covers are those of the
    scripts ``ACKNOWLEDGED_SCRIPTS`` names (schedule, reschedule, cancel, requeue, a batch's
    writes, a slot limit, a periodic change).
    """

    # fmt: off
    # (a table: one setting per entry)
    url: str = setting(DEFAULT_URL, "The store's Redis/Valkey; any node of a cluster (cluster mode is detected).",
        flag="--url", envvar="DELAYQ_URL", celery="delayq_url", shown="`redis://127.0.0.1:6379/0` "
        "(Celery: the broker's if it is Redis); `--url-file` (`DELAYQ_URL_FILE`) reads it from a file")
    prefix: str = setting("delayq",
        "Key prefix: letters, digits, '-', '_', '.'; two prefixes never see each other's items.", flag="--prefix",
        envvar="DELAYQ_PREFIX", celery="delayq_prefix", parse=_check_prefix)
    shards: int = setting(16,
        "Shard count; fixed for the life of a prefix (recorded in Redis: another count gets ShardMismatchError).",
        low=1, high=16384, flag="--shards", envvar="DELAYQ_SHARDS", celery="delayq_shards")
    max_payload_bytes: int = setting(1024 * 1024, "Largest envelope accepted by schedule; a forwarder dead-letters "
        "bigger ones at claim, never reading them: set it as on the producers.", low=64, high=512 * 1024 * 1024,
        flag="--max-payload-bytes", envvar="DELAYQ_MAX_PAYLOAD_BYTES", celery="delayq_max_payload_bytes")
    max_attempts: int = setting(
        10, "Claims of one item before it goes to the dead letters.", low=1, high=1_000_000, flag="--max-attempts")
    lease_seconds: float = setting(30.0, "How long a forwarder holds claimed items before they are due again.", low=0.1,
        high=86400, flag="--lease", metavar="SECONDS")
    durable_replicas: int = setting(0,
        "When > 0, each acknowledged write waits (WAIT) until that many replicas have it, else raises NotDurableError.",
        low=0, high=64, celery="delayq_durable_replicas", envvar="DELAYQ_DURABLE_REPLICAS")
    durable_timeout_ms: int = setting(1000, "How long such a write waits for its replicas.", low=1, high=600_000,
        celery="delayq_durable_timeout_ms", envvar="DELAYQ_DURABLE_TIMEOUT_MS")
    dead_letter_max: int = setting(0,
        "When > 0, each shard keeps at most this many dead letters; burying one more deletes the oldest for good.",
        low=0, high=10**12)
    dead_letter_ttl_seconds: int = setting(0,
        "When > 0, dead letters older than this are deleted for good as new ones are buried.", low=0,
        high=10 * 366 * 86400)
    group_policies: GroupPolicies = setting(GroupPolicies(),
        "Group policies by key glob, e.g. 'tenant-*={\"limit\": 2}': below the items' own values and the runtime "
        "policy (delayq groups set); the first pattern that sets a value wins. Repeatable; env "
        f"{GROUP_POLICIES_ENV} (a JSON object of pattern -> policy) adds more after these.", flag="--group-policy",
        celery="delayq_group_policies", metavar="PATTERN=JSON", parse=_group_policies, shown="none",
        specs=lambda texts: GroupPolicies.from_env().merged(GroupPolicies.from_specs(texts)))
    # fmt: on

    def __post_init__(self) -> None:
        check_settings(self)

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
