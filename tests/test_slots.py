"""Concurrency slots on a real server: the slot scripts, and the forwarder's hook releasing at
most a key's limit of its items, in their order, while other keys flow."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis
from click.testing import CliRunner

from delayq_backends import DelayStore
from delayq_backends import keys as layout
from delayq_backends.cli import main
from delayq_backends.envelope import Envelope, Slot, slot_of
from delayq_backends.errors import InvalidSlotError
from delayq_backends.forwarder import Forwarder
from delayq_backends.models import SlotGrant
from delayq_backends.slots import SlotGuard
from delayq_backends.store import SlotAsk, SlotRun
from delayq_backends.targets import Delivery, RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import make_store
from tests.helpers import wait_for

OUT = "out"


def envelope(tag: str) -> bytes:
    return RedisListTarget.envelope(OUT, tag.encode()).encode()


def schedule_line(store: DelayStore, key: str, n: int, *, limit: int | None, start: datetime) -> list[str]:
    """``n`` items of slot ``key``, due one ms apart from ``start`` on, in the order returned."""
    ids = [f"{key}-{i:02d}" for i in range(n)]
    for i, item_id in enumerate(ids):
        store.schedule(item_id, start + timedelta(milliseconds=i), envelope(item_id), slot={"key": key, "limit": limit})
    return ids


class Running:
    """A forwarder in a thread, over a collecting target."""

    def __init__(self, store: DelayStore) -> None:
        self.target = CollectingTarget("list")
        self.forwarder = Forwarder(store, [self.target], poll_interval=0.05)
        self.thread = threading.Thread(target=self.forwarder.run, kwargs={"install_signals": False})

    def of(self, key: str) -> list[str]:
        return [i for i in self.target.ids if i.startswith(f"{key}-")]

    def end(self, key: str, ids: list[str]) -> None:
        """The tasks of ``ids`` ended: their worker reports it with the tokens they came with."""
        tokens = {d.id: d.slot_token for d in self.target.delivered}
        self.forwarder.store.hold_slots({key: [SlotRun(i, tokens[i]) for i in ids]}, "end")

    def wait(self, check: Callable[[], bool], what: str) -> None:
        wait_for(check, 20, lambda: f"{what}; delivered {self.target.ids}")


@pytest.fixture
def running(valkey_url: str, prefix: str) -> Iterator[Running]:
    run = Running(make_store(valkey_url, prefix, shards=4))
    yield run
    run.forwarder.stop()
    run.thread.join(10)


def past() -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=30)


def test_a_slot_is_a_key_or_a_key_with_a_limit() -> None:
    assert Slot.parse("k") == Slot("k") and Slot.parse({"key": "k", "limit": 2}) == Slot("k", 2)
    for bad in (
        "",
        "a\nb",
        "x}:batch-1",
        {"key": "k", "limit": 0},
        {"key": "k", "limit": "2"},
        {"key": "k", "x": 1},
        3,
        None,
    ):
        with pytest.raises(InvalidSlotError):
            Slot.parse(bad)


def test_at_most_the_limit_is_released_until_slots_come_back(running: Running) -> None:
    """20 due items of key a (limit 3): 3 go, the others wait in the store, in their order, until
    slots are given back; key b (no limit) and unslotted items are not held up."""
    store = running.forwarder.store
    a = schedule_line(store, "a", 20, limit=3, start=past())
    b = schedule_line(store, "b", 10, limit=None, start=past())
    for i in range(5):
        store.schedule(f"plain-{i}", past(), envelope(f"plain-{i}"))
    running.thread.start()
    running.wait(lambda: len(running.of("b")) == 10 and len(running.of("plain")) == 5, "b and plain all go")
    running.wait(lambda: len(running.of("a")) == 3, "3 of a go")
    assert set(running.of("b")) == set(b)
    assert store.slot_status("a").running == 3 and store.slot_status("a").waiting == 17
    assert store.slot_status("b").running == 10
    for _ in range(3):  # a few rechecks of the line: nothing more goes while the slots are held
        before = running.forwarder.stats.deferred
        running.wait(lambda b=before: running.forwarder.stats.deferred > b, "the waiting items to ask again")
    assert sorted(running.of("a")) == a[:3]  # the first in their order (published together)
    running.end("a", running.of("a")[:2])  # two tasks finished
    running.wait(lambda: len(running.of("a")) == 5, "two more of a go")
    assert sorted(running.of("a")) == a[:5]
    for n in range(5, 20):  # each finished task lets the next one in
        running.end("a", [running.of("a")[n - 3]])
        running.wait(lambda n=n: len(running.of("a")) == n + 1, f"{n + 1} of a")
        assert store.slot_status("a").running <= 3
    assert running.of("a")[5:] == a[5:]  # one at a time: strictly in their order


def test_ends_show_with_no_item_of_the_key_asking(running: Running) -> None:
    """The forwarder reads the workers' reports of the keys it holds every second: a key whose
    tasks all ended shows no slot running, though no item of it asks again."""
    store = running.forwarder.store
    schedule_line(store, "a", 2, limit=2, start=past())
    running.thread.start()
    running.wait(lambda: len(running.of("a")) == 2, "2 of a")
    running.end("a", running.of("a"))
    wait_for(lambda: store.slot_status("a").running == 0, 5, "the ends to be read")
    assert store.client.hlen(layout.slot_reports_key(store.config.prefix, "a")) == 0


def test_a_higher_rank_goes_first_then_ready_time(running: Running) -> None:
    store = running.forwarder.store
    a = schedule_line(store, "a", 6, limit=1, start=past())
    store.schedule("a-urgent", past() + timedelta(seconds=1), envelope("a-urgent"), slot="a", rank=9)
    running.thread.start()
    running.wait(lambda: len(running.of("a")) == 1, "one of a")
    for n in range(1, 7):
        running.end("a", [running.of("a")[-1]])
        running.wait(lambda n=n: len(running.of("a")) == n + 1, f"{n + 1} of a")
    assert running.of("a") == ["a-urgent", *a]


def test_a_runtime_limit_overrides_the_items_and_none_means_unlimited(running: Running) -> None:
    store = running.forwarder.store
    store.set_slot_limit("a", 2)
    a = schedule_line(store, "a", 6, limit=5, start=past())
    running.thread.start()
    running.wait(lambda: len(running.of("a")) == 2, "2 of a (the runtime limit)")
    store.set_slot_limit("a", None)  # the items' own limit, 5, applies again
    running.wait(lambda: len(running.of("a")) == 5, "5 of a (the items' limit)")
    assert store.slot_status("a").limit is None
    assert sorted(running.of("a")) == a[:5]


def test_a_lapsed_hold_is_reaped_and_its_slot_goes_to_the_next(valkey_url: str, prefix: str) -> None:
    """A worker that died holds its slot until the hold lapses, then the next in line gets it."""
    store = make_store(valkey_url, prefix)
    take = lambda member, now: store.take_slots(  # noqa: E731
        {"k": SlotAsk(1, [(member, 0)])}, hold_ms=100, wait_ms=10_000, now=now
    )["k"]
    assert take("x", 1_000).places == (-1,)
    assert take("y", 1_050).places == (0,)  # x holds the one slot
    grant = take("x", 1_060)  # x asks again (a forwarder re-claiming it): it keeps it, under a new token
    assert grant.places == (-1,)
    store.hold_slots({"k": [SlotRun("x", grant.tokens[0])]}, "start", hold_ms=100)  # its worker starts it
    assert take("y", 1_150).places == (0,)  # the start is read here: x is held until 1_250
    assert take("y", 1_200).places == (0,)
    grant = take("y", 1_251)  # x's hold lapsed at 1_250: its worker died
    assert grant.places == (-1,) and grant.running == 1


def test_a_second_copy_shares_its_hold_and_either_copy_may_end_it(valkey_url: str, prefix: str) -> None:
    """A held item released again (a forwarder crashed after its publish, lossless mode's second
    copy) keeps its one slot under both tokens: the first copy, which may be the one that runs,
    still reports its start and end; a third copy's grant forgets the first token."""
    store = make_store(valkey_url, prefix)
    take = lambda member, key="k": store.take_slots(  # noqa: E731
        {key: SlotAsk(1, [(member, 0)])}, hold_ms=60_000, wait_ms=60_000
    )[key]
    first, second = take("x"), take("x")
    assert first.places == second.places == (-1,) and second.running == 1
    store.hold_slots({"k": [SlotRun("x", first.tokens[0])]}, "end")
    assert take("y").places == (-1,)  # the first copy's end freed the slot
    one, _, _ = take("z", "j"), take("z", "j"), take("z", "j")
    store.hold_slots({"j": [SlotRun("z", one.tokens[0])]}, "end")
    later = take("w", "j")
    assert later.places == (0,) and "reports without their hold's token=1" in later.reset


def test_a_short_tasks_start_and_end_read_together_end_its_hold_quietly(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix)
    take = lambda member: store.take_slots(  # noqa: E731
        {"k": SlotAsk(1, [(member, 0)])}, hold_ms=60_000, wait_ms=60_000
    )["k"]
    run = SlotRun("short", take("short").tokens[0])
    for _ in range(20):  # the reports' order in the hash is the server's: try a few
        store.hold_slots({"k": [run]}, "start", hold_ms=60_000)
        store.hold_slots({"k": [run]}, "end")
        grant = take("next")
        assert grant.places == (-1,) and grant.reset == ""
        store.give_back_slots({"k": ["next"]})
        run = SlotRun("short", take("short").tokens[0])


def test_a_free_slot_waits_for_the_head_of_the_line(valkey_url: str, prefix: str) -> None:
    """An item behind another that waits (deferred, not asking now) does not jump it; once the
    head's wait lapses (cancelled while it waited), the next one gets the slot."""
    store = make_store(valkey_url, prefix)
    take = lambda member, order, now, mode="take": store.take_slots(  # noqa: E731
        {"k": SlotAsk(1, [(member, order)])}, hold_ms=60_000, wait_ms=500, now=now, mode=mode
    )["k"]
    run = take("run", 0, 1_000)
    assert run.places == (-1,)
    assert take("first", 10, 1_010).places == (0,)
    assert take("second", 20, 1_020).places == (1,)
    store.hold_slots({"k": [SlotRun("run", run.tokens[0])]}, "end")
    assert take("second", 20, 1_100).places == (1,)  # the slot is first's
    first = take("first", 10, 1_200)
    assert first.places == (-1,)
    store.hold_slots({"k": [SlotRun("first", first.tokens[0])]}, "end")
    assert take("third", 5, 1_300, "join").places == (0,)  # in line ahead of second, then never asks
    assert take("second", 20, 1_700).places == (1,)
    assert take("second", 20, 1_801).places == (-1,)  # third's place lapsed at 1_800


def test_an_item_that_will_not_be_published_gives_up_its_place(valkey_url: str, prefix: str) -> None:
    """An item that joined the line but is not published (lossless mode found it started) leaves
    it, so the free slot goes to the next at once instead of after the place lapses."""
    store = make_store(valkey_url, prefix)
    ask = lambda member, order, mode: store.take_slots(  # noqa: E731
        {"k": SlotAsk(1, [(member, order)])}, hold_ms=60_000, wait_ms=60_000, mode=mode
    )["k"]
    assert ask("skipped", 0, "join").places == (0,)
    assert ask("next", 1, "take").places == (1,)  # the free slot is kept for the head of the line
    ask("skipped", 0, "leave")
    assert ask("next", 1, "take").places == (-1,)


#: Hostile writes to a slot key's keys (every kind of keys.py's slot_*_key): each must leave the
#: line flowing. Those the take reports are logged, naming the key or what was dropped (SAID).
GARBAGE: dict[str, Callable[[redis.Redis, str, str], object]] = {
    "holds of another type": lambda c, p, k: c.set(layout.slot_holds_key(p, k), "junk"),
    "holds far ahead": lambda c, p, k: c.zadd(layout.slot_holds_key(p, k), {"ghost-1": 1e15, "ghost-2": float("inf")}),
    "waiting of another type": lambda c, p, k: c.hset(layout.slot_waiting_key(p, k), "a", "b"),
    "waiting entries without a wait": lambda c, p, k: c.zadd(
        layout.slot_waiting_key(p, k), {f"g{i}": -1 for i in range(50)}
    ),
    "waits of another type": lambda c, p, k: c.lpush(layout.slot_waits_key(p, k), "x"),
    "waits far ahead": lambda c, p, k: (
        c.zadd(layout.slot_waiting_key(p, k), {"ghost": -1}),
        c.zadd(layout.slot_waits_key(p, k), {"ghost": float("inf")}),
    ),
    "limit not a number": lambda c, p, k: c.set(layout.slot_limit_key(p, k), "\xff2"),
    "limit 0": lambda c, p, k: c.set(layout.slot_limit_key(p, k), "0"),
    "limit of another type": lambda c, p, k: c.sadd(layout.slot_limit_key(p, k), "3"),
    "tokens of another type": lambda c, p, k: c.set(layout.slot_tokens_key(p, k), "x"),
    "tokens for no hold": lambda c, p, k: c.hset(
        layout.slot_tokens_key(p, k), mapping={f"a-0{i}": "0" * 40 for i in range(6)}
    ),
    "reports of another type": lambda c, p, k: c.rpush(layout.slot_reports_key(p, k), "x"),
    "reports forged": lambda c, p, k: c.hset(
        layout.slot_reports_key(p, k),
        mapping={"no-newline": "end:x", "a-00\nn1": "start:nothex:99999999", "a-01\nn2": "beat::x", "a-02\nn3": "?"},
    ),
    "reports past one call": lambda c, p, k: c.hset(
        layout.slot_reports_key(p, k), mapping={f"g{i}\nn": "end:" for i in range(3000)}
    ),
}


SAID = {
    "holds of another type": ":holds type=string",
    "waiting of another type": ":waiting type=hash",
    "waiting entries without a wait": "waiting entry=g",
    "waits of another type": ":waits type=list",
    "limit not a number": "limit=",
    "limit 0": "limit=0",
    "limit of another type": ":limit type=set",
    "tokens of another type": ":tokens type=string",
    "reports of another type": ":reports type=list",
    "reports forged": "reports without their hold's token=3",
    "reports past one call": "reports waiting past one call",
}


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_in_slot_keys_never_stops_the_line(
    running: Running, garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever a producer writes into a slot key's keys, every item of the key is released
    (at most the limit at once), with a warning naming what was dropped."""
    store = running.forwarder.store
    GARBAGE[garbage](store.client, store.config.prefix, "a")
    a = schedule_line(store, "a", 6, limit=2, start=past())
    running.thread.start()
    for n in range(6):
        running.wait(lambda n=n: len(running.of("a")) > n, f"item {n} of a")
        assert store.slot_status("a").running <= 2
        running.end("a", [running.of("a")[n]])
    assert sorted(running.of("a")) == a
    if garbage in SAID:
        assert any("slot 'a': " in r.message and SAID[garbage] in r.message for r in caplog.records)


def test_a_slot_travels_in_the_envelope_with_the_rank(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix)
    store.schedule("x", past(), envelope("x"), slot={"key": "k", "limit": 4}, rank=7)
    stored = store.get("x")
    assert stored is not None
    assert slot_of(Envelope.decode(stored.envelope)) == (Slot("k", 4), 7)
    assert slot_of(Delivery("y", RedisListTarget.envelope(OUT, b""), 0, 0).envelope) is None


def test_delayq_slots_lists_the_keys_and_sets_their_limits(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    store.check_meta()
    store.take_slots({"k}odd": SlotAsk(1, [("a", 0), ("b", 1), ("c", 2)])}, hold_ms=60_000, wait_ms=60_000)
    options = ["--url", valkey_url, "--prefix", prefix, "--shards", "4"]
    run = lambda *args: CliRunner().invoke(main, ["slots", *args, *options])  # noqa: E731
    assert run("set", "other", "3").exit_code == 0
    listed = run("list", "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output) == [
        {"key": "k}odd", "limit": None, "running": 1, "waiting": 2},  # a brace in the key is no trouble
        {"key": "other", "limit": 3, "running": 0, "waiting": 0},
    ]
    assert "limit removed" in run("set", "other", "none").output and store.slot_status("other").limit is None
    refused = run("set", "other", "0")
    assert refused.exit_code != 0 and "1 <= N" in refused.output


def test_a_heartbeat_keeps_a_long_task_and_a_dead_worker_lets_go(valkey_url: str, prefix: str) -> None:
    """A worker's hold outlives many hold periods while it beats; once the worker stops beating
    (it died), the hold lapses and the next in line gets the slot."""
    store = make_store(valkey_url, prefix)

    def take(member: str) -> SlotGrant:
        grant = store.take_slots({"k": SlotAsk(1, [(member, 0)])}, hold_ms=60_000, wait_ms=60_000)["k"]
        assert not isinstance(grant, Exception)
        return grant

    long = SlotRun("long", take("long").tokens[0])
    guard = SlotGuard(store, hold_ms=300)
    guard.start("k", long)
    deadline = time.monotonic() + 1.5  # five hold periods
    while time.monotonic() < deadline:
        assert take("next").places == (0,), "the long task's slot was given away while it ran"
        time.sleep(0.05)
    guard.close()  # the worker dies: no more beats, no end
    wait_for(lambda: take("next").places == (-1,), 5, "the dead worker's hold to lapse")
    assert guard.held() == {"k": [long]}


def test_a_start_after_its_hold_lapsed_is_said_to_risk_the_limit(valkey_url: str, prefix: str) -> None:
    """A run whose hold lapsed before it started (a redelivery later than the start window) runs
    all the same: the next take says so, since the slot may have gone to another task meanwhile,
    and does not count it (its report is not its hold's any more)."""
    store = make_store(valkey_url, prefix)
    take = lambda member, now: store.take_slots(  # noqa: E731
        {"k": SlotAsk(1, [(member, 0)])}, hold_ms=100, wait_ms=60_000, now=now
    )["k"]
    late = SlotRun("late", take("late", 1_000).tokens[0])
    assert take("next", 1_101).places == (-1,)  # late's start window lapsed at 1_100
    store.hold_slots({"k": [late]}, "start", hold_ms=60_000)
    grant = take("other", 1_102)
    assert grant.places == (0,) and grant.running == 1
    assert "started after their hold lapsed (may run over the limit)=late" in grant.reset


def test_a_slot_in_an_envelope_that_is_none_runs_unlimited() -> None:
    for meta in ({"slot": 5}, {"slot": {"key": ""}}, {"slot": {"key": "k", "limit": -1}}, {"slot": {"limit": 2}}):
        assert slot_of(Envelope("list", OUT, meta=meta)) is None
    assert slot_of(Envelope("list", OUT, meta={"slot": {"key": "k", "limit": 2, "rank": "x"}})) == (Slot("k", 2), 0)


def test_a_batch_bigger_than_luas_unpack_limit_takes_and_gives_back_its_slots(valkey_url: str, prefix: str) -> None:
    """9,000 items of one key in one call (a claim's batch goes up to 10,000; Lua's unpack stops
    near 8,000): each joins the line, two are granted, all leave or end in one call each."""
    store = make_store(valkey_url, prefix, shards=1)
    members = [(f"m{i:05d}", i) for i in range(9000)]
    joined = store.take_slots({"big": SlotAsk(2, members)}, hold_ms=60_000, wait_ms=60_000, mode="join")["big"]
    assert not isinstance(joined, Exception) and len(joined.places) == 9000
    taken = store.take_slots({"big": SlotAsk(2, members)}, hold_ms=60_000, wait_ms=60_000)["big"]
    assert not isinstance(taken, Exception)
    assert taken.places[:3] == (-1, -1, 0) and taken.places[-1] == 8997
    runs = [SlotRun(m, t) for (m, _), t in zip(members, taken.tokens)]
    assert store.hold_slots({"big": runs}, "beat", hold_ms=60_000) == {"big": None}
    assert store.give_back_slots({"big": [m for m, _ in members]}) == {"big": 2}
    left = store.take_slots({"big": SlotAsk(2, members[2:])}, hold_ms=60_000, wait_ms=60_000, mode="leave")["big"]
    assert not isinstance(left, Exception) and store.slot_status("big").waiting == 0


def test_a_slot_given_back_goes_to_the_head_of_the_line_at_once(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's end brings the next in line forward and wakes the forwarder: with rechecks
    set 5 s apart, each given-back slot is still taken within a second (it idled up to a
    recheck before)."""
    monkeypatch.setattr("delayq_backends.forwarder.slots.RECHECK_MS", 5_000)
    store = running.forwarder.store
    a = schedule_line(store, "a", 8, limit=2, start=past())
    running.thread.start()
    running.wait(lambda: len(running.of("a")) == 2, "2 of a")
    running.wait(lambda: running.forwarder.stats.deferred >= 6, "the others deferred 5 s")
    for n in range(2, 8):
        running.end("a", [running.of("a")[n - 2]])
        wait_for(lambda n=n: len(running.of("a")) == n + 1, 1.0, lambda n=n: f"{n + 1} of a within 1 s of an end")
    assert sorted(running.of("a")[:2]) == a[:2] and running.of("a")[2:] == a[2:]  # then in their order


def test_a_slot_given_back_brings_the_head_of_the_line_forward(valkey_url: str, prefix: str) -> None:
    """A worker's end brings the head of the line forward to now (waking the forwarders) and the
    next take gives it the free slot, whoever asks first; an item leased (a forwarder asking for
    it right now) keeps its lease; a forwarder's give-back does the same; a line of another type
    brings nothing forward and the give-back still counts."""
    store = make_store(valkey_url, prefix, shards=1)
    keys = store.keys(0)
    for item_id in ("deferred", "leased"):
        store.schedule(item_id, past(), envelope(item_id))
    store.lease(0).defer([("deferred", 10**13)])
    holder = store.take_slots({"k": SlotAsk(1, [("holder", 0)])}, hold_ms=60_000, wait_ms=60_000)["k"]
    assert not isinstance(holder, Exception)
    line = [("deferred#0", 1), ("leased", 2)]  # a member with a run names its item
    store.take_slots({"k": SlotAsk(1, line)}, hold_ms=60_000, wait_ms=60_000, mode="join")
    pubsub = store.subscribe_wake()
    before = int(time.time() * 1000)
    assert store.hold_slots({"k": [SlotRun("holder", holder.tokens[0])]}, "end") == {"k": None}
    assert before <= store.client.zscore(keys.due, "deferred") <= time.time() * 1000 + 1
    wakes: list[dict[str, bytes]] = []
    wait_for(lambda: bool(m := pubsub.get_message(timeout=0.1)) and not wakes.append(m), 5, "a wake-up")  # type: ignore[func-returns-value]
    assert before <= int(wakes[0]["data"]) <= time.time() * 1000 + 1
    ask = lambda member, order: store.take_slots(  # noqa: E731
        {"k": SlotAsk(1, [(member, order)])}, hold_ms=60_000, wait_ms=60_000
    )["k"]
    assert ask("leased", 2).places == (1,)  # the end is read here; the free slot is the head's
    assert ask("deferred#0", 1).places == (-1,)
    leased_before = store.client.hget(keys.leased, "leased"), store.client.zscore(keys.due, "leased")
    assert store.give_back_slots({"k": ["deferred#0"]}) == {"k": 1}  # its publish failed
    assert (store.client.hget(keys.leased, "leased"), store.client.zscore(keys.due, "leased")) == leased_before
    assert ask("leased", 2).places == (-1,)
    store.client.set(layout.slot_waiting_key(store.config.prefix, "k"), "junk")
    assert store.give_back_slots({"k": ["leased"]}) == {"k": 1}
    assert store.client.zcard(layout.slot_holds_key(store.config.prefix, "k")) == 0


def test_a_hand_over_that_fails_leaves_the_end_done_and_says_so(
    valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bringing the next item forward fails (its shard's due key is garbage): the hold is ended
    and passed all the same, the failure is logged, and the item would ask at its recheck."""
    store = make_store(valkey_url, prefix, shards=1)
    store.take_slots({"k": SlotAsk(1, [("holder", 0)])}, hold_ms=60_000, wait_ms=60_000)
    store.take_slots({"k": SlotAsk(1, [("next", 1)])}, hold_ms=60_000, wait_ms=60_000, mode="join")
    store.client.set(store.keys(0).due, "junk")
    with caplog.at_level("WARNING", logger="delayq.slots"):
        assert store.give_back_slots({"k": ["holder"]}) == {"k": 1}
    assert "could not bring the next in a slot line forward" in caplog.text
    grant = store.take_slots({"k": SlotAsk(1, [("next", 1)])}, hold_ms=60_000, wait_ms=60_000)["k"]
    assert not isinstance(grant, Exception) and grant.places == (-1,)
