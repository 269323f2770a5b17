"""Stores opened once per key and shared afterwards: the one cache the adapters keep.

A Celery app sends many tasks and an RQ worker builds a queue per job, while opening a store
asks its server about cluster mode; so each adapter opens a store once per app or connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

from .store import DelayStore

__all__ = ["StoreCache"]

K = TypeVar("K")


class StoreCache(Generic[K]):
    """Thread-safe: two threads asking for one key at once open one store.

    Args:
        weak: hold keys weakly (an app object), so a dropped key frees its store.
    """

    def __init__(self, *, weak: bool = False) -> None:
        self._stores: MutableMapping[K, DelayStore] = WeakKeyDictionary() if weak else {}
        self.lock = threading.RLock()

    def get(
        self, key: K, open_store: Callable[[], DelayStore], *, valid: Callable[[DelayStore], bool] = lambda _: True
    ) -> DelayStore:
        """The store cached for ``key`` if ``valid``, else a new one from ``open_store``, cached."""
        store = self._stores.get(key)
        if store is not None and valid(store):
            return store
        with self.lock:
            store = self._stores.get(key)
            if store is None or not valid(store):
                store = self._stores[key] = open_store()
        return store

    def peek(self, key: K) -> DelayStore | None:
        """The cached store, or None; opens nothing."""
        return self._stores.get(key)

    def put(self, key: K, store: DelayStore) -> None:
        with self.lock:
            self._stores[key] = store

    def pop(self, key: K) -> DelayStore | None:
        """Forget ``key``'s store and return it (the caller closes it), or None."""
        with self.lock:
            return self._stores.pop(key, None)
