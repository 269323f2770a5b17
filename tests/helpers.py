"""Small helpers shared by the tests (``wait_for`` is the benches' too, from bench/lib)."""

from __future__ import annotations

from datetime import datetime, timezone

from bench.lib.waiting import wait_for

__all__ = ["ms_at_or_after", "wait_for"]


def ms_at_or_after(when: datetime) -> int:
    """The first epoch millisecond not before ``when``: the store rounds ready times up, never to
    the nearest ms (which could be up to 0.5 ms early). Exact integer arithmetic, no float."""
    micros = (when - datetime(1970, 1, 1, tzinfo=timezone.utc)) // (datetime.resolution)
    return -(-micros // 1000)
