"""A list of keys found by a SCAN, made again at most every few seconds: the dashboard refreshes
every 2 s and a scrape comes every 15 s, and neither may walk the keyspace each time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["KeyList"]


class KeyList:
    """The keys ``list_keys`` returns (a SCAN), listed again at most every ``ttl`` seconds. A key
    that appears meanwhile shows up within ``ttl``; callers read the listed keys' values fresh.

    Thread-safe: the exporter and the dashboard serve several requests at once.
    """

    def __init__(self, list_keys: Callable[[], list[str]], *, ttl: float):
        self.list_keys = list_keys
        self.ttl = ttl
        self._keys: list[str] = []
        self._listed: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> list[str]:
        """The keys, listed again when the last list is ``ttl`` old (a SCAN error propagates)."""
        with self._lock:
            now = time.monotonic()  # an age, not a time: not the store's clock
            if self._listed is None or now - self._listed >= self.ttl:
                self._keys = self.list_keys()
                self._listed = now
            return self._keys

    def forget(self) -> None:
        """List again on the next call: a key was just written, maybe one not listed yet."""
        with self._lock:
            self._listed = None
