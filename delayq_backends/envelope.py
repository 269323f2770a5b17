"""The stored form of a delayed item: a versioned, self-describing byte string. No pickle.

Every envelope starts with ``b"DQ"`` and a format version byte, so a reader tells the formats
apart and a forwarder too old for an envelope says so instead of misreading it: decoding a format
newer than :data:`FORMAT_VERSION` raises :class:`NewerFormatError`, and the forwarder leaves that
item for a newer forwarder (deferred, never dead-lettered).

Producers write the oldest format that carries what the item needs, so a forwarder of the
previous release reads everything a producer of this one writes unless the item uses a feature
that needs a newer format: format 2 carries every item today. A release that adds a format keeps
writing the older one for items that do not use what it adds (README, "Upgrading").

Format 2 (written today)::

    b"DQ" 0x02 | len target | target | len destination | destination
              | len meta | meta (UTF-8 JSON object; empty for {}) | len details | details | body

Lengths are unsigned LEB128 varints (one byte up to 127). ``details`` are bytes a target keeps
beside the body, stored as they are: the Celery target keeps kombu's JSON of the message headers
there, so it is not escaped again inside another JSON document. The body is kept raw too, so a
message is replayed byte for byte and costs no more than its own size.

Format 3 is format 2's layout with the version byte 3, written only for periodic entries that use
a field added with entries as data (:mod:`delayq_backends.periodic.state`): a forwarder of an
older release reads it as a newer format and leaves the entry alone instead of firing it and
dropping the field in its rearm.

Format 1 (written up to tag s3-start, still read)::

    b"DQ" 0x01 | 4-byte big-endian header length | {"t": target, "d": destination, "m": meta} | body
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from . import group_policies as policy
from .errors import EnvelopeError, InvalidGroupError, InvalidRateKeyError, InvalidSlotError, NewerFormatError
from .group_policies import MAX_RATE_KEY, MAX_SLOT_LIMIT

__all__ = [
    "ENTRY_FORMAT_VERSION",
    "FORMAT_VERSION",
    "GROUPS",
    "Group",
    "GroupSpec",
    "INVALID_RATE_KEY",
    "MAX_COST",
    "MAX_GROUPS",
    "MAX_RATE_KEY",
    "MAX_SLOT_LIMIT",
    "RATE_KEY",
    "SLOT",
    "Slot",
    "SlotSpec",
    "Envelope",
    "READABLE_VERSIONS",
    "check_rate_key",
    "fold_groups",
    "frame",
    "groups_of",
    "head",
    "parse_groups",
    "rate_key_of",
    "slot_of",
    "with_groups",
    "with_rate_key",
    "with_slot",
]

#: The envelope meta field holding an item's rate key (a tenant, a customer id): the forwarder
#: caps each key of a queue configured with ``--key-rate`` at its own rate.
RATE_KEY = "rate_key"
#: The one bucket of a queue shared by items whose stored rate key is not a valid one (written by
#: another tool or an older writer): capped together at the key rate, never stuck, never lost.
#: A control character, so no valid key names it.
INVALID_RATE_KEY = "\x00invalid"

MAGIC = b"DQ"
#: The newest format this code reads and the one it writes (the oldest that carries every item).
FORMAT_VERSION = 2
#: Format 2's layout, marking an entry an older reader must leave alone (see the module's docstring).
ENTRY_FORMAT_VERSION = 3
#: The formats this code reads.
READABLE_VERSIONS = (1, 2, 3)
_V1_PREFIX = struct.Struct(">2sBI")
_V2_PREFIX = MAGIC + bytes([FORMAT_VERSION])


#: one-byte varints, looked up: every section of a typical envelope is shorter than 128 bytes
_SHORT = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    """``n`` as an unsigned LEB128 varint: 7 bits a byte, low bits first."""
    if n < 0x80:
        return _SHORT[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _section(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    """The length-prefixed section ``what`` at ``pos`` and the position after it."""
    size = shift = 0
    while True:
        if pos >= len(data) or shift > 35:
            raise EnvelopeError(f"envelope truncated: the length of its {what} is cut off")
        byte = data[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    end = pos + size
    if end > len(data):
        raise EnvelopeError(f"envelope truncated: its {what} should be {size} bytes, {len(data) - pos} remain")
    return data[pos:end], end


def _meta_json(meta: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(dict(meta), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise EnvelopeError(f"envelope meta is not JSON-serializable: {exc}") from exc


def head(target: str, destination: str, meta: Mapping[str, Any]) -> bytes:
    """Everything of an encoded envelope before its details: for bulk writers that frame many
    envelopes of one target, destination and meta with :func:`frame`."""
    if not meta:  # bulk loads repeat one target and destination: encode that head once
        return _bare_head(target, destination)
    return _head(target, destination, _meta_json(meta))


def _head(target: str, destination: str, meta: bytes) -> bytes:
    t, d = target.encode("utf-8"), destination.encode("utf-8")
    return b"".join((_V2_PREFIX, _varint(len(t)), t, _varint(len(d)), d, _varint(len(meta)), meta))


@lru_cache(maxsize=1024)
def _bare_head(target: str, destination: str) -> bytes:
    return _head(target, destination, b"")


def frame(head_bytes: bytes, details: bytes, body: bytes) -> bytes:
    """An encoded envelope from its :func:`head`, details and body; :meth:`Envelope.decode`
    reads the result like any other."""
    return b"".join((head_bytes, _varint(len(details)), details, body))


@dataclass(frozen=True)
class Envelope:
    """What a target needs to deliver an item at its ready time.

    Attributes:
        target: which kind of target delivers it (``"list"``, ``"celery"``, ``"rq"``).
        destination: where, in that target's terms (a list key, a queue name).
        body: the message itself, replayed as is.
        meta: JSON-serializable details the target needs (RQ's queue class, ...).
        details: bytes the target keeps beside the body, stored as they are (the Celery target's
            kombu JSON of the message headers); empty in format 1 envelopes.
    """

    target: str
    destination: str
    body: bytes = b""
    meta: Mapping[str, Any] = field(default_factory=dict)
    details: bytes = b""

    def encode(self) -> bytes:
        """Serialize (format 2); raises :class:`EnvelopeError` when ``meta`` is not JSON-serializable."""
        if type(self.body) is bytes and type(self.details) is bytes:  # the common case, checked cheaply
            return frame(head(self.target, self.destination, self.meta), self.details, self.body)
        for name in ("body", "details"):
            if not isinstance(getattr(self, name), (bytes, bytearray, memoryview)):
                raise EnvelopeError(
                    f"envelope {name} must be bytes, got {type(getattr(self, name)).__name__}: encode it first"
                )
        return frame(head(self.target, self.destination, self.meta), bytes(self.details), bytes(self.body))

    def encode_entry(self) -> bytes:
        """Serialize as format :data:`ENTRY_FORMAT_VERSION`: read by this release like format 2,
        left alone by older ones (a newer format to them)."""
        data = self.encode()
        return MAGIC + bytes([ENTRY_FORMAT_VERSION]) + data[3:]

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        """Parse stored bytes of either format; raises :class:`EnvelopeError` saying what is wrong."""
        if len(data) < 3:
            raise EnvelopeError(f"envelope truncated: {len(data)} bytes, shorter than its header")
        if data[:2] != MAGIC:
            raise EnvelopeError(f"not a delayq envelope (starts with {data[:8]!r})")
        version = data[2]
        if version in (FORMAT_VERSION, ENTRY_FORMAT_VERSION):
            return cls._decode_v2(data)
        if version == 1:
            return cls._decode_v1(data)
        known = ", ".join(map(str, READABLE_VERSIONS))
        if version > ENTRY_FORMAT_VERSION:
            raise NewerFormatError(
                f"envelope format version {version} is newer than this delayq reads ({known}): "
                "written by a newer delayq_backends; upgrade this one",
                version,
            )
        raise EnvelopeError(f"envelope format version {version} does not exist (formats are {known})")

    @classmethod
    def _decode_v2(cls, data: bytes) -> Envelope:
        target, pos = _section(data, 3, "target")
        destination, pos = _section(data, pos, "destination")
        meta_json, pos = _section(data, pos, "meta")
        details, pos = _section(data, pos, "details")
        try:
            meta = json.loads(meta_json.decode("utf-8")) if meta_json else {}
            if not isinstance(meta, dict):
                raise TypeError(f"meta is a {type(meta).__name__}, not an object")
            return cls(target.decode("utf-8"), destination.decode("utf-8"), bytes(data[pos:]), meta, bytes(details))
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise EnvelopeError(f"envelope header is corrupt: {exc}") from exc

    @classmethod
    def _decode_v1(cls, data: bytes) -> Envelope:
        if len(data) < _V1_PREFIX.size:
            raise EnvelopeError(f"envelope truncated: {len(data)} bytes, shorter than its header")
        _, _, size = _V1_PREFIX.unpack_from(data)
        end = _V1_PREFIX.size + size
        if end > len(data):
            raise EnvelopeError(f"envelope truncated: header says {size} bytes, {len(data) - _V1_PREFIX.size} remain")
        try:
            header = json.loads(data[_V1_PREFIX.size : end].decode("utf-8"))
            if not isinstance(header["m"], dict):
                raise TypeError(f"meta is a {type(header['m']).__name__}, not an object")
            return cls(target=str(header["t"]), destination=str(header["d"]), body=bytes(data[end:]), meta=header["m"])
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise EnvelopeError(f"envelope header is corrupt: {exc}") from exc


def check_rate_key(key: Any) -> str:
    """``key`` if it is a rate key: non-empty printable text of at most :data:`MAX_RATE_KEY` characters.

    Raises:
        InvalidRateKeyError: anything else, saying what to pass; nothing was stored.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_RATE_KEY or not key.isprintable():
        shown = repr(key)[:60]
        raise InvalidRateKeyError(
            f"rate key {shown}: pass printable text of 1..{MAX_RATE_KEY} characters naming who the item is "
            "for (a tenant or customer id), e.g. 'tenant-42'"
        )
    return key


def with_rate_key(envelope: Envelope, key: str) -> Envelope:
    """``envelope`` carrying rate key ``key`` (checked with :func:`check_rate_key`)."""
    return replace(envelope, meta={**envelope.meta, RATE_KEY: check_rate_key(key)})


def rate_key_of(envelope: Envelope) -> str | None:
    """The rate key an envelope carries, None without one; :data:`INVALID_RATE_KEY` when what is
    stored is no valid key, so such items share one capped bucket instead of stopping a forwarder."""
    key = envelope.meta.get(RATE_KEY)
    if key is None:
        return None
    try:
        return check_rate_key(key)
    except InvalidRateKeyError:
        return INVALID_RATE_KEY


#: The envelope meta field holding an item's concurrency slot: ``{"key", "limit", "rank"}``.
SLOT = "slot"


@dataclass(frozen=True)
class Slot:
    """A concurrency slot: at most ``limit`` items of ``key`` run at once (see :mod:`delayq_backends.slots`).

    Attributes:
        key: what is limited (a customer, a resource): printable text, as a rate key.
        limit: the item's default limit, used while no limit is set for the key at runtime
            (``set_slot_limit``); None: unlimited unless one is set.
    """

    key: str
    limit: int | None = None

    @classmethod
    def parse(cls, value: Any) -> Slot:
        """A slot from what a user passes: a key, ``{"key": ..., "limit": N}``, or a Slot.

        Raises:
            InvalidSlotError: anything else, saying what to pass; nothing was stored.
        """
        if isinstance(value, Slot):
            return value
        key, limit = (value.get("key"), value.get("limit")) if isinstance(value, Mapping) else (value, None)
        extra = set(value) - {"key", "limit"} if isinstance(value, Mapping) else set()
        # "}:" would close the slot key's hash tag and could make its keys match another key
        # kind's ACL pattern (a producer's "...}:batch*"), handing a role another's slot key
        ok_key = isinstance(key, str) and 0 < len(key) <= MAX_RATE_KEY and key.isprintable() and "}:" not in key
        ok_limit = limit is None or (type(limit) is int and 1 <= limit <= MAX_SLOT_LIMIT)
        if not ok_key or not ok_limit or extra:
            raise InvalidSlotError(
                f"slot {repr(value)[:80]}: pass a key (printable text of 1..{MAX_RATE_KEY} characters "
                f"without '}}:', e.g. 'customer-42') or {{'key': KEY, 'limit': N}} with 1 <= N <= {MAX_SLOT_LIMIT}"
            )
        return cls(str(key), limit)


#: What a user may pass as a slot (see :meth:`Slot.parse`).
SlotSpec = Slot | str | Mapping[str, Any]


def with_slot(envelope: Envelope, slot: Slot, rank: int = 0) -> Envelope:
    """``envelope`` carrying ``slot``, and the item's ``rank``: the forwarder lets an item of a
    slot's key go in (rank, ready time) order, and rank is not in a delivery otherwise."""
    return replace(envelope, meta={**envelope.meta, SLOT: {"key": slot.key, "limit": slot.limit, "rank": rank}})


def slot_of(envelope: Envelope) -> tuple[Slot, int] | None:
    """The slot an envelope carries and the item's rank, None without one (or with one that is
    not valid: written by another tool; such an item runs unlimited rather than stays stuck)."""
    meta = envelope.meta.get(SLOT)
    if meta is None:
        return None
    try:
        slot = Slot.parse({"key": meta.get("key"), "limit": meta.get("limit")})
        rank = meta.get("rank", 0)
        return slot, rank if type(rank) is int and 0 <= rank <= 255 else 0
    except (InvalidSlotError, AttributeError):
        return None


#: The envelope meta field holding an item's groups (issue 31): a list of up to
#: :data:`MAX_GROUPS` objects, ``{"key"}`` and whichever of ``limit``, ``rate``, ``weight`` and
#: ``cost`` are set, the item's *line group* first. ``slot`` and ``rate_key`` are aliases
#: (:func:`groups_of` folds them in).
GROUPS = "groups"
#: Most groups an item carries (a tenant and an endpoint, say): it is released only when each
#: admits it, and each admission is a script call per pass.
MAX_GROUPS = 3
#: Highest cost of one item: what it counts against its groups' rates (LLM tokens, say).
MAX_COST = 1_000_000_000
_GROUP_FIELDS = ("key", "limit", "rate", "weight", "cost")
_GROUP_SHAPE = (
    "pass a key (e.g. 'tenant-7'), {'key': KEY, 'limit': N, 'rate': 'N/s', 'weight': W, 'cost': C} (every "
    f"field but key optional), or a list of up to {MAX_GROUPS} of them"
)


def _checked(group: Group) -> tuple[dict[str, Any], list[str]]:
    """``group``'s policy fields as a runtime policy keeps them (a rate's text, a weight's float),
    and what is wrong with any. The checks are the policy's own
    (:mod:`delayq_backends.group_policies`), so an item's values mean what an operator's do."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    checks: list[tuple[str, Callable[[str, Any], object]]] = [
        ("key", lambda _, key: policy.check_group_key(key)),
        ("limit", policy.check_limit),
        ("rate", policy.check_rate),
        ("weight", policy.check_weight),
    ]
    for name, check in checks:
        value = getattr(group, name)
        if value is None:
            continue
        try:
            values[name] = check(group.key, value)
        except InvalidSlotError as exc:  # the policy's InvalidGroupPolicyError: a slot error, as ours
            said = str(exc)  # the policy's "group KEY: ..." (KEY cut at 80), said once for all fields here
            for named in (f"group {group.key!r}: ", f"group {repr(group.key)[:80]}: "):
                said = said.removeprefix(named)
            problems.append(said)
    if not (type(group.cost) is int and 1 <= group.cost <= MAX_COST):
        problems.append(f"cost={group.cost!r}: what one item counts against a rate, a whole number 1..{MAX_COST}")
    return values, problems


@dataclass(frozen=True)
class Group:
    """A group an item belongs to (a tenant, a customer, an endpoint): the unit of "how much runs".

    A group's policy is set at runtime for its key (``store.set_group``), by pattern in settings,
    or carried by its items (these fields): a runtime policy wins over an item's, an item's over
    a pattern's. A slot is a group with a limit; a rate key is a group with its queue's key rate.

    Attributes:
        key: what the group is: printable text (as a slot key).
        limit: at most this many of its items run at once; None: no limit of the item's own.
        rate: at most this many items (or units of cost) per period, ``"N/s"``, ``"N/m"``,
            ``"N/h"`` (N > 0, at most 10^6/s; a number is per second), across all forwarders,
            kept as a runtime policy keeps it (``"10/s"``); None: no rate of the item's own.
        weight: the group's share when groups compete (the default group's is 1); None: 1
            unless set at runtime.
        cost: what this item counts against the group's rate (LLM tokens, say); 1 by default.
    """

    key: str
    limit: int | None = None
    rate: str | None = None
    weight: float | None = None
    cost: int = 1

    def __post_init__(self) -> None:
        values, problems = _checked(self)
        if problems:
            raise InvalidGroupError(f"group {repr(self.key)[:60]}: " + "; ".join(problems))
        for name in ("rate", "weight"):  # as a policy keeps them: "10/s" and 10, 3 and 3.0 are one value
            if name in values:
                object.__setattr__(self, name, values[name])

    @classmethod
    def parse(cls, value: Any) -> Group:
        """A group from what a user passes: a key, a dict of :class:`Group`'s fields, a
        :class:`Group`, or a :class:`Slot` (a group with its limit).

        Raises:
            InvalidGroupError: anything else, saying what is wrong and what to pass; nothing was stored.
        """
        if isinstance(value, Group):
            return value
        if isinstance(value, Slot):
            return cls(value.key, value.limit)
        if isinstance(value, str):
            return cls(value)
        if not isinstance(value, Mapping):
            raise InvalidGroupError(f"group {repr(value)[:60]} is a {type(value).__name__}: {_GROUP_SHAPE}")
        extra = sorted(map(str, set(value) - set(_GROUP_FIELDS)))
        if extra or "key" not in value:
            what = f"unknown field(s) {extra}" if extra else "no 'key'"
            raise InvalidGroupError(f"group {repr(dict(value))[:80]}: {what}; {_GROUP_SHAPE}")
        cost = value.get("cost")
        return cls(
            value["key"], value.get("limit"), value.get("rate"), value.get("weight"), 1 if cost is None else cost
        )

    def to_meta(self) -> dict[str, Any]:
        """The group as stored in an envelope's meta: its key and the fields that are set."""
        meta: dict[str, Any] = {"key": self.key}
        for name in ("limit", "rate", "weight"):
            if getattr(self, name) is not None:
                meta[name] = getattr(self, name)
        if self.cost != 1:
            meta["cost"] = self.cost
        return meta

    def folded(self, other: Group) -> Group:
        """This group with the fields it leaves unset taken from ``other`` (the same key named
        twice: once as a group, once through an alias)."""
        return replace(
            self,
            limit=self.limit if self.limit is not None else other.limit,
            rate=self.rate if self.rate is not None else other.rate,
            weight=self.weight if self.weight is not None else other.weight,
            cost=self.cost if self.cost != 1 else other.cost,
        )


#: What a user may pass as an item's groups (see :func:`parse_groups`).
GroupSpec = Group | Slot | str | Mapping[str, Any] | Sequence[Group | Slot | str | Mapping[str, Any]]


def parse_groups(value: Any) -> tuple[Group, ...]:
    """An item's groups from what a user passes: one group (as :meth:`Group.parse` takes), or a
    list or tuple of up to :data:`MAX_GROUPS` of them with distinct keys, the line group first
    (empty: none, ``()``, as a list computed per item may be).

    Raises:
        InvalidGroupError: anything else, saying what is wrong and what to pass; nothing was stored.
    """
    if not isinstance(value, (list, tuple)):
        return (Group.parse(value),)
    if len(value) > MAX_GROUPS:
        raise InvalidGroupError(
            f"{len(value)} groups: an item belongs to at most {MAX_GROUPS}; each admits it before it runs, so "
            "name the ones whose limits matter (a tenant, an endpoint)"
        )
    groups = tuple(Group.parse(v) for v in value)
    keys = [g.key for g in groups]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise InvalidGroupError(f"group(s) {twice} named twice: name each group once, with all its fields in one place")
    return groups


def _meta_groups(envelope: Envelope) -> list[Group]:
    """The groups stored in the envelope's :data:`GROUPS` field, those that are no group skipped
    (written by another tool: such an item runs as if it did not name them rather than stay stuck).
    Only the first :data:`MAX_GROUPS` entries are read, all :func:`with_groups` writes: a planted
    list of thousands costs a forwarder no more than three."""
    stored = envelope.meta.get(GROUPS)
    if not isinstance(stored, list):
        return []
    groups: list[Group] = []
    for value in stored[:MAX_GROUPS]:
        try:  # as stored: a dict of text and numbers (anything else raises TypeError: not hashable)
            found = _stored_group(tuple(value.items()) if isinstance(value, dict) else value)
        except TypeError:
            found = None
        if found is not None:
            groups.append(found)
    return groups


@lru_cache(maxsize=4096)
def _stored_group(value: Any) -> Group | None:
    """:meth:`Group.parse` of a stored group (its dict's items, or what else is stored), None for
    one that is none. Cached: a forwarder reads the groups of every item it releases, and the
    same few groups again and again (the cache holds one group's worth of bytes per entry)."""
    try:
        return Group.parse(dict(value) if isinstance(value, tuple) else value)
    except (InvalidGroupError, TypeError, ValueError):
        return None


def _alias_groups(envelope: Envelope) -> list[Group]:
    """The groups an envelope names through the aliases: its slot, then its rate key."""
    slot, key = slot_of(envelope), rate_key_of(envelope)
    named = [
        None if slot is None else _stored_group((("key", slot[0].key), ("limit", slot[0].limit))),
        None if key is None or key == INVALID_RATE_KEY else _stored_group(key),  # a key with "}:" names none
    ]
    return [g for g in named if g is not None]


def groups_of(envelope: Envelope) -> tuple[Group, ...]:
    """The groups an envelope carries, its line group first: those of its :data:`GROUPS` field,
    then its slot (a group with the slot's limit) and its rate key (a group; its queue's key rate
    stays the forwarder's) when they name other keys. A key named twice is one group, the fields
    it leaves unset filled from the later naming. At most :data:`MAX_GROUPS`; none: ``()``."""
    return fold_groups(_meta_groups(envelope) + _alias_groups(envelope))


def fold_groups(groups: Iterable[Group]) -> tuple[Group, ...]:
    """``groups`` in order with each key once (the fields a key's first naming leaves unset filled
    from its later ones), the first :data:`MAX_GROUPS`: how :func:`groups_of` reads an envelope,
    and a worker its task's message."""
    found: dict[str, Group] = {}
    for group in groups:
        found[group.key] = found[group.key].folded(group) if group.key in found else group
    return tuple(found.values())[:MAX_GROUPS]


def with_groups(envelope: Envelope, groups: GroupSpec | None) -> Envelope:
    """``envelope`` carrying ``groups`` (anything :func:`parse_groups` takes; None or ``[]``:
    none), in place of any it carried in its :data:`GROUPS` field. Its slot and rate key, if
    any, stay and count towards :data:`MAX_GROUPS`: a group may name the same key as one of them
    (``rate_key="t-7"`` with ``group={"key": "t-7", "limit": 2}``), giving it more fields.

    Raises:
        InvalidGroupError: no groups, or more than :data:`MAX_GROUPS` with the aliases; nothing
            was stored.
    """
    meta = {k: v for k, v in envelope.meta.items() if k != GROUPS}
    parsed = () if groups is None else parse_groups(groups)
    if not parsed:
        return replace(envelope, meta=meta)
    keys = {g.key for g in parsed}
    aliases = [g for g in _alias_groups(envelope) if g.key not in keys]
    if len(parsed) + len(aliases) > MAX_GROUPS:
        raise InvalidGroupError(
            f"groups {sorted(keys)} and the item's slot/rate key {[g.key for g in aliases]}: an item belongs to "
            f"at most {MAX_GROUPS} groups; pass the slot or rate key as one of the groups instead"
        )
    return replace(envelope, meta={**meta, GROUPS: [g.to_meta() for g in parsed]})
