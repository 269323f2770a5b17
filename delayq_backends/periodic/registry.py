"""Where periodic entries are listed, and which code schedule was synced last.

- The registry hash ``<prefix>:{<prefix>}:periodic`` (entry name → item id) lists every entry,
  whatever its kind and source, so a sync or ``periodic list`` never scans the store. Each
  entry's source (``code`` or ``runtime``) is in its state (:mod:`.state`), next to its schedule.
- The code schedule's record ``<prefix>:{<prefix>}:periodic:code`` (version, fingerprint of the
  whole code set, synced_at, host) decides whether a sync from code may go ahead: a lower version
  changes nothing, an equal version with another set is refused, and once a versioned sync ran
  an unversioned one is refused. The check and the write are one script (``sync_version.lua``),
  so two forwarders starting at once cannot both pass. Only the operator and forwarder roles may
  write it (:mod:`delayq_backends.acl`), and a missing record is not "any version wins": a sync
  that would change the code entries stored is refused until an operator records the version
  (:func:`~.ops.sync_code`), so a late old deploy cannot restore an entry a newer one removed.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import DelayqError
from ..keys import periodic_code_key, periodic_key
from ..scripts.store import SyncVersion
from ..store import DelayStore

__all__ = [
    "MAX_VERSION",
    "PAGE",
    "CodeRecord",
    "CodeEntryError",
    "CodeSync",
    "EntryNotFound",
    "PeriodicError",
    "Registry",
    "StaleScheduleError",
    "check_registry",
    "check_version",
    "code_fingerprint",
    "code_record",
    "read_registry",
    "record_code_sync",
    "record_missing",
    "registry_page",
]

#: Registry fields one page reads (HSCAN's COUNT, a hint: a small registry comes whole)
PAGE = 500

#: the largest schedule version (exact in a Lua number): a build number or a commit time fits
MAX_VERSION = 2**53


class PeriodicError(DelayqError):
    """A periodic entry, or its store item or registry, that cannot be used as asked."""


class EntryNotFound(PeriodicError):
    """No periodic entry of that name (neither registered nor stored, nor any history)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no periodic entry {name!r}: see `delayq periodic list` for the names")
        self.name = name


class CodeEntryError(PeriodicError):
    """A change a code entry cannot take at runtime (a sync would undo it)."""


class StaleScheduleError(PeriodicError):
    """A sync from code refused: its schedule is older than (or conflicts with) the one synced last."""


@dataclass(frozen=True)
class Registry:
    """The registry's fields: entry names, and fields that are not UTF-8, hence no entry's name
    (a hand write or a damaged key). Those are reported with the fix and skipped, so one cannot
    stop the rest from listing or syncing (nor removed entries from being removed)."""

    names: list[str]
    unreadable: dict[str, str]  # the field as redis-cli takes it (hex escapes) -> what is wrong and the fix


def check_registry(store: DelayStore) -> str:
    """The registry's key, refused when it is of another type (a hand write) before anything is
    changed: its entries are unknown, so a sync cannot tell which stored entries left the config."""
    key = periodic_key(store.config.prefix)
    kind = store.registry_type()
    if kind not in ("hash", "none"):
        raise PeriodicError(
            f"the periodic registry {key} is a {kind}, not a hash (written by another tool): nothing synced; "
            f"move it away (`redis-cli RENAME {key} {key}:bad`) and sync again"
        )
    return key


def read_registry(store: DelayStore) -> Registry:
    """The registry's fields, read names and unreadable ones apart (every page of :func:`registry_page`)."""
    names, unreadable, cursor = [], {}, 0
    while True:
        cursor, page = registry_page(store, cursor)
        names += page.names
        unreadable.update(page.unreadable)
        if not cursor:
            return Registry(sorted(names), unreadable)


def registry_page(store: DelayStore, cursor: int = 0, count: int = PAGE) -> tuple[int, Registry]:
    """One ``HSCAN`` of the registry from ``cursor``: about ``count`` fields (a small registry,
    whole), sorted, and the cursor of the next page (0: none). Paging bounds what one call
    reads whatever the registry holds, and every field present throughout is on some page."""
    key = check_registry(store)
    cursor, fields = store.registry_fields(cursor, count)
    names, unreadable = [], {}
    for raw in fields:
        try:
            names.append(raw.decode())
        except UnicodeDecodeError:
            shown = _redis_cli_quoted(raw)
            unreadable[shown] = (
                f"registry field {shown} of {key} is not UTF-8, so no entry's name; skipped: remove it with "
                f"`redis-cli HDEL {key} {shown}`"
            )
    return cursor, Registry(sorted(names), unreadable)


def _redis_cli_quoted(raw: bytes) -> str:
    r"""``raw`` as a redis-cli double-quoted argument (non-printable bytes as ``\xHH``)."""
    body = "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in raw)
    return f'"{body}"'


# -- the code schedule's version -------------------------------------------------------------------


@dataclass(frozen=True)
class CodeRecord:
    """The code schedule synced last: its version (None: unversioned), the fingerprint of its
    set of entries, when (ms) and from which host."""

    version: int | None
    fingerprint: str
    synced_ms: int | None
    host: str

    def describe(self) -> str:
        version = "unversioned" if self.version is None else f"version {self.version}"
        return f"{version} (synced from {self.host or '?'})"


class CodeSync:
    """What the version check said (``sync_version.lua``'s codes)."""

    RECORDED, CURRENT = 1, 0
    OLDER, CONFLICT, UNVERSIONED, DAMAGED = -1, -2, -3, -4


#: where a schedule version is set, when the kind's adapter names nothing more precise
VERSION_SETTING = "this deploy's schedule version"


def code_fingerprint(fingerprints: Iterable[tuple[str, str]]) -> str:
    """One hash of a whole code set: its (entry name, entry fingerprint) pairs, in any order."""
    text = json.dumps(sorted(fingerprints), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def check_version(version: Any) -> int | None:
    """A schedule version as given (an int, or digits from the CLI or an env var), or None.

    Raises:
        PeriodicError: anything but a whole number in 0..2**53.
    """
    if version is None:
        return None
    if isinstance(version, str) and version.strip().isdigit():
        version = int(version)
    if type(version) is not int or not 0 <= version <= MAX_VERSION:
        raise PeriodicError(
            f"schedule version {version!r}: use a whole number that grows with each deploy (a build number, a "
            f"commit's Unix time), 0..{MAX_VERSION}"
        )
    return version


def _record(reply: Any) -> tuple[int, CodeRecord | None]:
    code = int(reply[0])
    version, fingerprint, synced, host = (
        v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in reply[1:5]
    )
    if not fingerprint and not version and not synced:
        return code, None
    return code, CodeRecord(
        int(version) if version.isdigit() else None, fingerprint, int(synced) if synced.isdigit() else None, host
    )


def record_code_sync(
    store: DelayStore,
    version: int | None,
    fingerprint: str,
    *,
    kind: str,
    host: str | None = None,
    version_setting: str = VERSION_SETTING,
) -> CodeRecord | None:
    """Check that a code schedule may be synced and record it, in one script call; returns the
    record it replaced (None: the first sync). ``version_setting`` names where the kind's users
    set the version, for the refusal of an unversioned sync (Celery's app setting is no RQ user's).

    Raises:
        StaleScheduleError: an older version, an equal one with another set, or an unversioned
            sync after a versioned one; nothing is recorded and nothing must be synced.
        PeriodicError: the record is damaged (another type, a version that is no number).
    """
    key = periodic_code_key(store.config.prefix)
    call = SyncVersion.call(
        key,
        kind,
        "" if version is None else str(version),
        fingerprint,
        host or socket.gethostname(),
        _record,
        now=store.script_now(None),
    )
    reply = store.run_each([call])[0]
    if isinstance(reply, Exception):
        raise reply
    code, before = reply
    if code in (CodeSync.RECORDED, CodeSync.CURRENT):
        return before
    if code == CodeSync.DAMAGED or before is None:
        raise PeriodicError(
            f"the code schedule's record {key} is damaged (written by another tool): no sync from code until it is "
            f"removed: `redis-cli DEL {key}` (the next sync records itself again if it changes no stored code entry, "
            "else it names the version to record)"
        )
    if code == CodeSync.OLDER:
        raise StaleScheduleError(
            f"schedule version {version} is older than the one synced last, {before.describe()}: nothing synced "
            "(this deploy's code schedule is not the current one)"
        )
    if code == CodeSync.CONFLICT:
        raise StaleScheduleError(
            f"schedule version {version} was synced before with other entries ({before.describe()}): nothing "
            "synced; bump the version with each change of the code schedule"
        )
    raise StaleScheduleError(
        f"this sync has no schedule version, but {before.describe()} was synced: nothing synced; set "
        f"{version_setting} to a number above it"
    )


def code_record(store: DelayStore, kind: str) -> CodeRecord | None:
    """The code schedule of entries of ``kind`` synced last, or None (none yet, or a damaged record)."""
    values = store.code_record_values(kind)
    if values is None:  # another type: reported by the next sync
        return None
    _, record = _record([0, *(v or b"" for v in values)])
    return record


def record_missing(store: DelayStore, kind: str) -> bool:
    """No code schedule of entries of ``kind`` is recorded (a damaged record is not missing: the
    sync names its fix)."""
    values = store.code_record_values(kind)
    return values is not None and not any(values)
