"""Functions a ``BeatLazyFunc`` names in the tests: importable by path, as a forwarder needs them."""

from __future__ import annotations

import itertools
from typing import Any

_counts = itertools.count(1)


def counter() -> int:
    """1, 2, 3… per call in this process: each run's value differs from the last one's."""
    return next(_counts)


def pair(a: Any, *, b: Any = None) -> list[Any]:
    """Its arguments back: the lazy call's own args and kwargs reach the function."""
    return [a, b]


def broken() -> None:
    raise RuntimeError("the lazy function failed")
