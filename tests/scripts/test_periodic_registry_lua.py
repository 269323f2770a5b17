"""periodic_registry.lua: the registry's lines added and removed, each name's answer its own; a
registry of another type (a hand write) is left as it is."""

from __future__ import annotations

from delayq_backends import DelayStore
from delayq_backends.keys import periodic_key


def test_lines_are_added_once_and_removed_by_name(store: DelayStore) -> None:
    assert store.register_entry("a", "periodic:a") and store.register_entry("b", "periodic:b")
    assert store.register_entry("a", "periodic:a")  # there already: still listed, nothing else
    assert store.client.hgetall(periodic_key(store.config.prefix)) == {b"a": b"periodic:a", b"b": b"periodic:b"}
    assert store.unregister_entries(["a", "gone", "b"]) == [True, False, True]
    assert store.registry_size() == 0 and store.unregister_entries([]) == []


def test_a_registry_of_another_type_is_refused_not_replaced(store: DelayStore) -> None:
    key = periodic_key(store.config.prefix)
    store.client.set(key, "planted")
    assert not store.register_entry("a", "periodic:a")
    assert store.unregister_entries(["a"]) is None
    assert store.client.get(key) == b"planted"
