"""A group's hand-over (issue 31), on a real server: a limit carried only by the items holds
across forwarders however often the group is woken."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from delayq_backends.keys import group_wake_channel
from tests.harness import make_store
from tests.test_group_lines import Running, envelope, past


@pytest.fixture
def two(valkey_url: str, prefix: str) -> Iterator[tuple[Running, Running]]:
    runs = (Running(make_store(valkey_url, prefix, shards=4)), Running(make_store(valkey_url, prefix, shards=4)))
    yield runs
    for run in runs:
        run.forwarder.stop()
    for run in runs:
        if run.thread.is_alive():
            run.thread.join(10)


@pytest.mark.parametrize("keyed", [0, 3])
def test_a_carried_limit_holds_across_two_forwarders_however_often_woken(
    two: tuple[Running, Running], keyed: int
) -> None:
    """40 items of group g, each carrying limit 2 but ``keyed`` after the first (named by key
    alone: a producer that left the limit out), no runtime policy, two forwarders, the group woken
    2,000 times and no task ending: at most 2 are ever published (before, each key-only item was
    admitted as if its group had no limit)."""
    a, b = two
    store = a.forwarder.store
    store.schedule_many(
        [(f"g-{i}", past(40 - i), envelope(f"g-{i}", "g", None if 0 < i <= keyed else 2)) for i in range(40)]
    )
    for run in two:
        run.thread.start()
    channel = group_wake_channel(store.config.prefix)
    for _ in range(2000):
        store.client.publish(channel, "g")
        time.sleep(0.001)
    time.sleep(1.2)  # a look at the group (RECHECK_MS) after the last wake
    published = a.of("g") + b.of("g")
    assert len(published) <= 2, f"{len(published)} published at limit 2: {published}"
