"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable, Union


def wait_for(
    check: Callable[[], bool], timeout: float, what: Union[str, Callable[[], str]], *, interval: float = 0.005
) -> None:
    """Poll ``check`` every ``interval`` s until it holds; fail saying ``what`` did not happen
    within ``timeout`` s (``what`` may be a function, to describe the state at that moment).
    Benchmarks poll less often, so the check does not steal the CPU they measure."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def ms_at_or_after(when: datetime) -> int:
    """The first epoch millisecond not before ``when``: the store rounds ready times up, never to
    the nearest ms (which could be up to 0.5 ms early). Exact integer arithmetic, no float."""
    micros = (when - datetime(1970, 1, 1, tzinfo=timezone.utc)) // (datetime.resolution)
    return -(-micros // 1000)
