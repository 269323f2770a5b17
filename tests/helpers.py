"""Small helpers shared by the tests (``wait_for`` is the benches' too, from bench/lib)."""

from __future__ import annotations

from datetime import datetime, timezone

from bench.lib.waiting import wait_for

__all__ = ["max_overlap", "ms_at_or_after", "wait_for"]


def ms_at_or_after(when: datetime) -> int:
    """The first epoch millisecond not before ``when``: the store rounds ready times up, never to
    the nearest ms (which could be up to 0.5 ms early). Exact integer arithmetic, no float."""
    micros = (when - datetime(1970, 1, 1, tzinfo=timezone.utc)) // (datetime.resolution)
    return -(-micros // 1000)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most of the (start, end) ``intervals`` open at one moment: an end before a start at the
    same instant (the slot tests: tasks of one key running at once, by their own clocks)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most
