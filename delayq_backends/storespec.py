"""Where a store is (URL, prefix, shard count), as the CLI, the exporter and the dashboard
take it, and how to open it checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import DEFAULT_URL, Config
from .connection import connect
from .store import DelayStore

__all__ = ["StoreSpec", "open_store"]


@dataclass(frozen=True)
class StoreSpec:
    """A store's address, one argument instead of three; the URL may hold credentials, so log
    it through :func:`~delayq_backends.connection.redact_url`."""

    url: str = DEFAULT_URL
    prefix: str = "delayq"
    shards: int = 16

    def config(self, **settings: Any) -> Config:
        """The store's :class:`Config`; ``settings`` are further fields (``lease_seconds``, ...).

        Raises:
            ConfigError: a bad or unknown setting.
        """
        return Config(url=self.url, prefix=self.prefix, shards=self.shards, **settings)

    def open(self, *, writes: bool, socket_timeout: float | None = None, **settings: Any) -> DelayStore:
        """Connect and check the shard layout before anything is read or written; the caller
        closes ``store.client``.

        A read-only user (``writes=False``) checks against a recorded layout but never records
        one, so a mistyped shard count on an empty prefix cannot pin that layout for producers.
        Servers that answer requests (the exporter, the dashboard) pass a ``socket_timeout``, so a
        store that hangs, rather than refusing connections, fails a request instead of freezing it.

        Raises:
            ConfigError: the URL is unusable or the server unreachable.
            ShardMismatchError: ``shards`` differs from the count recorded for ``prefix``.
        """
        return open_store(self.config(**settings), writes=writes, socket_timeout=socket_timeout)


def open_store(config: Config, *, writes: bool, socket_timeout: float | None = None) -> DelayStore:
    """:meth:`StoreSpec.open` for a whole :class:`Config`; the caller closes ``store.client``."""
    store = DelayStore(connect(config.url, socket_timeout=socket_timeout), config)
    try:
        store.check_meta(record=writes)
    except BaseException:
        store.close()
        raise
    return store
