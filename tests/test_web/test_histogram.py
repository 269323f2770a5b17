"""``DelayStore.due_histogram``: ZCOUNT buckets, half-open [start, end), leased items at their deadline."""

from __future__ import annotations

import pytest

from delayq_backends import DelayStore
from delayq_backends.envelope import Envelope
from delayq_backends.errors import ConfigError

ITEM = Envelope("list", "k", b"")
START = 1_900_000_000_000


def test_buckets_are_half_open_and_earlier_items_are_counted_apart(web_store: DelayStore) -> None:
    ready = {"before": START - 1, "first": START, "edge": START + 999, "second": START + 1000, "after": START + 3000}
    web_store.schedule_many([(i, ms / 1000, ITEM) for i, ms in ready.items()])
    assert web_store.due_histogram(START, 1000, 3) == (1, [2, 1, 0])


def test_a_leased_item_counts_at_its_lease_deadline(web_store: DelayStore) -> None:
    web_store.schedule("due", 1.0, ITEM)
    claim = next(c for c in (web_store.claim(s, lease_ms=45_000) for s in range(web_store.shards)) if c.items)
    now = web_store.server_time_ms()
    overdue, counts = web_store.due_histogram(now, 30_000, 4)
    assert overdue == 0 and counts == [0, 1, 0, 0], claim.deadline_ms - now


@pytest.mark.parametrize("bucket_ms, buckets", [(0, 10), (1000, 0), (-5, 3)])
def test_bad_buckets_are_refused(web_store: DelayStore, bucket_ms: int, buckets: int) -> None:
    with pytest.raises(ConfigError, match="must both be positive"):
        web_store.due_histogram(START, bucket_ms, buckets)
