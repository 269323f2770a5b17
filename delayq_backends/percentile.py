"""The one percentile definition of the package: the forwarder's stats, the web API and the
benchmarks report lateness with it, so their figures compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["percentile"]

N = TypeVar("N", int, float)


def percentile(ordered: Sequence[N], q: float) -> N | None:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of *sorted* values; None when there are none."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
