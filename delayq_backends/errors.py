"""Every error delayq raises derives from :class:`DelayqError`.

Errors that describe bad input also derive from :class:`ValueError`, so code that already
catches ``ValueError`` around scheduling keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BatchClosedError",
    "BatchError",
    "BrokerUnavailable",
    "ConfigError",
    "DelayqError",
    "EnvelopeError",
    "InvalidDebounceError",
    "InvalidIdError",
    "InvalidRankError",
    "InvalidRateKeyError",
    "InvalidGroupError",
    "InvalidGroupPolicyError",
    "InvalidSlotError",
    "InvalidTimeError",
    "MissingExtraError",
    "NewerFormatError",
    "PayloadTooLargeError",
    "ServerNotFoundError",
    "ServerStartError",
    "NotDurableError",
    "ShardMismatchError",
    "StoreFullError",
    "StoreMetaError",
    "install_hint",
]


class DelayqError(Exception):
    """Base class of every delayq error."""


class ConfigError(DelayqError, ValueError):
    """A setting is missing, malformed or contradicts what the store already holds."""


class ShardMismatchError(ConfigError):
    """The configured shard count differs from the one recorded in Redis.

    Routing by ``crc32(id) % shards`` with the wrong count would look items up in the wrong
    shard, so this is refused instead of silently misrouting.
    """


class StoreMetaError(ShardMismatchError):
    """The store's metadata (``<prefix>:meta``) holds garbage or disagrees with the shard keys
    in Redis: the message names the key and the command that restores it."""


def install_hint(extra: str) -> str:
    """How to install ``extra``: delayq_backends comes from its repository, not a package index
    (README: Installing), so the command is the checkout's."""
    return f'install delayq_backends with its {extra} extra (in a checkout: pip install ".[{extra}]")'


class MissingExtraError(DelayqError, ImportError):
    """An optional dependency is not installed: the message names the extra that brings it.

    An ``ImportError`` still, so ``except ImportError`` around an optional import keeps working;
    a ``DelayqError`` too, so the CLI prints it as one line instead of a traceback.
    """

    def __init__(self, needs: str, extra: str) -> None:
        super().__init__(f"{needs}: {install_hint(extra)}")
        self.extra = extra


class InvalidTimeError(DelayqError, ValueError):
    """A ready time that cannot be scheduled (naive, NaN, negative, absurdly far)."""


class InvalidIdError(DelayqError, ValueError):
    """An item id that is empty, too long or not text."""


class InvalidRankError(DelayqError, ValueError):
    """A rank that is not an integer in 0..MAX_RANK."""


class InvalidDebounceError(DelayqError, ValueError):
    """A debounce/throttle option that is not a key or a {key, mode, keep} dict."""


class InvalidRateKeyError(DelayqError, ValueError):
    """A rate key (tenant, customer) that is not short printable text."""


class InvalidSlotError(DelayqError, ValueError):
    """A concurrency slot that is not a short printable key with an optional limit >= 1."""


class InvalidGroupError(InvalidSlotError):
    """A group (or a list of them) that is not what :meth:`~delayq_backends.envelope.Group.parse`
    takes. A slot is a group, so code catching :class:`InvalidSlotError` catches this too."""


class InvalidGroupPolicyError(InvalidSlotError):
    """A group policy value out of range (a limit, rate, weight, throttle) or a key that names
    no group: a slot key is a group, so it is also an :class:`InvalidSlotError`."""


class PayloadTooLargeError(DelayqError, ValueError):
    """An envelope over the configured ``max_payload_bytes``."""


class EnvelopeError(DelayqError, ValueError):
    """Stored bytes that are not a delayq envelope (corrupt, truncated, unknown version)."""


class NewerFormatError(EnvelopeError):
    """An envelope of a format newer than this delayq reads: written by a newer release, not
    corrupt. A forwarder leaves such an item for a newer forwarder instead of dead-lettering it.

    Attributes:
        version: the envelope's format version.
    """

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class BrokerUnavailable(DelayqError):
    """A target could not reach its broker; the batch is released, not failed."""


class ServerNotFoundError(DelayqError):
    """No Valkey/Redis server binary could be found to start an embedded server."""


class ServerStartError(DelayqError):
    """An embedded server (or cluster) was started but did not come up."""


class StoreFullError(DelayqError):
    """The delay store's Redis is at ``maxmemory`` and refused a write.

    Attributes:
        stored: how many items of a bulk write were stored before the refusal (0 for a single
            write: nothing of it was stored).
        not_stored: the ids of a bulk write that were not stored (retry those; scheduling is
            idempotent by id, so retrying all of them is safe too).
    """

    def __init__(self, message: str, *, stored: int = 0, not_stored: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.stored = stored
        self.not_stored = list(not_stored)


class NotDurableError(DelayqError):
    """A write reached the primary but not ``durable_replicas`` replicas in time.

    It is stored, but a failover now could lose it. Scheduling is idempotent by id: retrying
    is safe.
    """


class BatchError(DelayqError, ValueError):
    """A batch key that is no batch (never opened, or its keys hold garbage), or bad batch input:
    the message names the key and the fix."""


class BatchClosedError(BatchError):
    """A sub-job added to a batch already closed: it was NOT scheduled (open another batch)."""
