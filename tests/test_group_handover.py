"""A group's hand-over (issue 31), on a real server: a limit carried only by the items holds
across forwarders however often the group is woken; a hand-over gives the free slots to the
earliest heads across the shards, in two round trips."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import PARKED_MS, group_wake_channel
from delayq_backends.store import SlotAsk
from delayq_backends.store.glines import GroupRoom
from delayq_backends.testing import CollectingTarget
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


@pytest.mark.parametrize("known", [0, 3])
def test_a_hand_over_gives_the_free_slots_to_the_earliest_heads_across_the_shards(
    valkey_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, known: int
) -> None:
    """Group g at limit 3 (set at runtime), one item running, 12 items waiting in its lines of 4
    shards: a hand-over releases the 2 earliest (wherever they wait) and holds the group's lines
    until ``held_until``, in two round trips when the forwarder knows the limit (``known``), three
    when it does not (its heads are read again: the room has more free slots than were read)."""
    store = make_store(valkey_url, prefix, shards=4)
    store.set_group("g", limit=3)
    store.schedule_many([(f"g-{i}", past(40 - i), envelope(f"g-{i}", "g")) for i in range(12)])
    now = store.server_time_ms()
    grant = store.take_slots({"g": SlotAsk(0, [("running", 0)])}, hold_ms=60_000, wait_ms=60_000)["g"]
    assert not isinstance(grant, Exception) and grant.running == 1
    trips = []  # round trips: pipelines and single commands (a lone script call)
    execute, command = redis.client.Pipeline.execute, redis.Redis.execute_command

    def single(client: redis.Redis, *args: object, **options: object) -> object:
        if not isinstance(client, redis.client.Pipeline):
            trips.append(args[0])
        return command(client, *args, **options)

    monkeypatch.setattr(
        redis.client.Pipeline, "execute", lambda pipe, *a, **k: trips.append(1) or execute(pipe, *a, **k)
    )
    monkeypatch.setattr(redis.Redis, "execute_command", single)
    rooms = store.hand_over(["g"], now=now, held_until=now + 60_000, limits={"g": known} if known else {}, hold_ms=1)
    assert len(trips) == (2 if known else 3), trips
    assert rooms["g"] == GroupRoom(3, 1)
    released = [
        f"g-{i}"
        for i in range(12)
        if store.client.zscore(store.keys(store.shard_of(f"g-{i}")).due, f"g-{i}") != PARKED_MS
    ]
    assert released == ["g-0", "g-1"]
    for n in range(4):  # its lines that still hold items wait for the next look or wake
        ready = store.client.zscore(store.keys(n).gready, "g")
        assert ready is None or ready == now + 60_000 or store.client.zcard(store.keys(n).gline("g")) == 0


def test_a_sweeps_first_pass_looks_only_where_the_heads_just_read_found_a_line_due(
    valkey_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop reads every shard's heads (and lines) just before a sweep: its first pass looks
    at the lines only in the shards found due there (none after a hand-over held its group), a
    later pass of the sweep at every shard (a quiet group's item due meanwhile)."""
    store = make_store(valkey_url, prefix, shards=4)
    step = Forwarder(store, [CollectingTarget("list")]).lines
    step.hook.admits = True  # a grouped item was met
    looked: list[list[int]] = []
    due_groups = store.due_groups
    monkeypatch.setattr(
        store, "due_groups", lambda shards, **kw: looked.append(list(shards)) or due_groups(shards, **kw)
    )
    now = store.server_time_ms()
    step.saw([None, now - 1, now + 60_000, None])  # shard 1's lines due, shard 2's later
    step.release([1, 3])
    step.release([1, 3])
    step.saw([None, None, None, None])
    step.release([0])
    assert looked == [[1], [0, 1, 2, 3]]
