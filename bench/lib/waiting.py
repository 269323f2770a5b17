"""Waiting on a condition with a deadline, for the benches and the tests alike."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_for"]


def wait_for(
    check: Callable[[], bool], timeout: float, what: str | Callable[[], str], *, interval: float = 0.005
) -> float:
    """Poll ``check`` every ``interval`` s until it holds and return the seconds that took; fail
    saying ``what`` did not happen within ``timeout`` s (``what`` may be a function, to describe
    the state at that moment). Benchmarks poll less often, so the check does not steal the CPU
    they measure."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
    return time.monotonic() - start
