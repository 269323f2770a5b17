"""The stored form of a delayed item: a versioned, self-describing byte string. No pickle.

Layout: ``b"DQ"``, a format version byte, a 4-byte big-endian header length, the header as
UTF-8 JSON (``{"t": target, "d": destination, "m": meta}``), then the body bytes verbatim.
The body is kept raw, not base64'd, so a Celery message is replayed byte for byte and costs
no more than its own size.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Optional

from .errors import EnvelopeError, InvalidRateKeyError

__all__ = [
    "FORMAT_VERSION",
    "INVALID_RATE_KEY",
    "MAX_RATE_KEY",
    "RATE_KEY",
    "Envelope",
    "check_rate_key",
    "frame",
    "header_of",
    "rate_key_of",
    "with_rate_key",
]

#: The envelope meta field holding an item's rate key (a tenant, a customer id): the forwarder
#: caps each key of a queue configured with ``--key-rate`` at its own rate.
RATE_KEY = "rate_key"
#: Longest rate key, in characters: a key is a name, and each active one is a bucket in Redis.
MAX_RATE_KEY = 200
#: The one bucket of a queue shared by items whose stored rate key is not a valid one (written by
#: another tool or an older writer): capped together at the key rate, never stuck, never lost.
#: A control character, so no valid key names it.
INVALID_RATE_KEY = "\x00invalid"

MAGIC = b"DQ"
FORMAT_VERSION = 1
_PREFIX = struct.Struct(">2sBI")


def _head(target: str, destination: str, meta: dict[str, Any]) -> bytes:
    """Magic, version, length and JSON header: everything before the body."""
    try:
        header = json.dumps(
            {"t": target, "d": destination, "m": meta}, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise EnvelopeError(f"envelope meta is not JSON-serializable: {exc}") from exc
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header


def frame(header: bytes, body: bytes) -> bytes:
    """Encoded envelope bytes from a JSON header already encoded and the body.

    For bulk writers that render the header from a template per row instead of building an
    :class:`Envelope` each time; :meth:`Envelope.decode` reads the result like any other.
    """
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + body


def header_of(data: bytes) -> bytes:
    """The JSON header of encoded envelope bytes (the inverse of :func:`frame`'s first part)."""
    _, _, size = _PREFIX.unpack_from(data)
    return data[_PREFIX.size : _PREFIX.size + size]


@lru_cache(maxsize=1024)
def _bare_head(target: str, destination: str) -> bytes:
    return _head(target, destination, {})


@dataclass(frozen=True)
class Envelope:
    """What a target needs to deliver an item at its ready time.

    Attributes:
        target: which kind of target delivers it (``"list"``, ``"celery"``, ``"rq"``).
        destination: where, in that target's terms (a list key, a queue name).
        body: the message itself, replayed as is.
        meta: JSON-serializable details the target needs (headers, properties, ...).
    """

    target: str
    destination: str
    body: bytes = b""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        """Serialize; raises :class:`EnvelopeError` when ``meta`` is not JSON-serializable."""
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise EnvelopeError(f"envelope body must be bytes, got {type(self.body).__name__}: encode it first")
        if self.meta:
            head = _head(self.target, self.destination, dict(self.meta))
        else:  # bulk loads repeat one target and destination: encode that header once
            head = _bare_head(self.target, self.destination)
        return head + bytes(self.body)

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        """Parse stored bytes; raises :class:`EnvelopeError` saying what is wrong with them."""
        if len(data) < _PREFIX.size:
            raise EnvelopeError(f"envelope truncated: {len(data)} bytes, shorter than its header")
        magic, version, size = _PREFIX.unpack_from(data)
        if magic != MAGIC:
            raise EnvelopeError(f"not a delayq envelope (starts with {data[:8]!r})")
        if version != FORMAT_VERSION:
            raise EnvelopeError(
                f"envelope format version {version} is unknown to this delayq "
                f"(knows {FORMAT_VERSION}): upgrade delayq_backends on this forwarder"
            )
        end = _PREFIX.size + size
        if end > len(data):
            raise EnvelopeError(f"envelope truncated: header says {size} bytes, {len(data) - _PREFIX.size} remain")
        try:
            header = json.loads(data[_PREFIX.size : end].decode("utf-8"))
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
    return Envelope(
        envelope.target, envelope.destination, envelope.body, {**envelope.meta, RATE_KEY: check_rate_key(key)}
    )


def rate_key_of(envelope: Envelope) -> Optional[str]:
    """The rate key an envelope carries, None without one; :data:`INVALID_RATE_KEY` when what is
    stored is no valid key, so such items share one capped bucket instead of stopping a forwarder."""
    key = envelope.meta.get(RATE_KEY)
    if key is None:
        return None
    try:
        return check_rate_key(key)
    except InvalidRateKeyError:
        return INVALID_RATE_KEY
