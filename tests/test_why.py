"""``Reader.why``: one answer per state an item can be in, each made the way production makes it
(a real forwarder's claim, flow control, a group's limit, parking, a dead letter) on a real
server, and read by the ``reader`` ACL role; plus hand-written garbage that must not break it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends.acl import acl_setuser
from delayq_backends.config import Config
from delayq_backends.connection import connect
from delayq_backends.entries import iso
from delayq_backends.envelope import Envelope
from delayq_backends.errors import InvalidIdError
from delayq_backends.flow import FlowControl
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import PARKED_MS, claim_token, claimer_of
from delayq_backends.models import WHY_STATES, FailedDelivery, Why
from delayq_backends.store import SlotAsk
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import make_store

SHARDS = 4


def item(tag: str = "x", queue: str = "out") -> Envelope:
    return RedisListTarget.envelope(queue, tag.encode())


def past(seconds: float = 30) -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=seconds)


@pytest.fixture
def vstore(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    s = make_store(valkey_url, prefix, shards=SHARDS)
    s.check_meta()
    yield s
    s.client.close()


def claim_of(store: DelayStore, item_id: str, **kwargs: object) -> object:
    """A claim of ``item_id``'s shard that holds it (a grouped item taken out of its line into
    the due index first, as an earlier release's producer wrote it: a claim meets it then)."""
    from delayq_backends.store.glines import line_group

    k = store.keys(store.shard_of(item_id))
    lease = store.client.hget(k.leased, item_id)
    if lease is not None and lease.startswith(b"%d:deferred:" % PARKED_MS):
        store.client.zrem(k.gline(line_group(store.client.hget(k.items, item_id)) or ""), item_id)
        store.client.hdel(k.leased, item_id)
        store.client.zadd(k.due, {item_id: int(lease.rsplit(b":", 1)[1])})
    claim = store.claim(store.shard_of(item_id), **kwargs)  # type: ignore[arg-type]
    assert item_id in [i.id for i in claim.items]
    return claim


def test_an_item_not_due_due_and_unknown(store: DelayStore) -> None:
    store.schedule("later", 2_000_000_000, item())
    store.schedule("now", past(), item())
    later = store.why("later")
    assert (later.state, later.until_ms) == ("scheduled", 2_000_000_000_000)
    assert later.line == "not due until 2033-05-18T03:33:20.000Z"
    due = store.why("now")
    assert due.state == "due" and due.line.startswith(f"due since {iso(due.ready_ms)}")
    gone = store.why("never-scheduled")
    assert gone == Why("never-scheduled", "unknown", gone.line)
    assert "not scheduled and no dead letter" in gone.line
    with pytest.raises(InvalidIdError):
        store.why("bad\nid")


def test_a_forwarder_names_itself_in_its_leases(vstore: DelayStore) -> None:
    """Read mid-publish, through the real forwarder's pass: the lease names its forwarder."""
    vstore.schedule("in-flight", past(), item())
    seen: list[Why] = []
    target = CollectingTarget("list", lambda d: seen.append(vstore.why(d.id)))
    Forwarder(vstore, [target], name="fwd-eu-1:4242").run_once()
    assert target.ids == ["in-flight"]
    [during] = seen
    assert (during.state, during.forwarder) == ("leased", "fwd-eu-1:4242")
    assert during.until_ms is not None and during.until_ms > vstore.server_time_ms()
    assert during.line == f"leased by forwarder fwd-eu-1:4242 until {iso(during.until_ms)} (being published)"
    assert vstore.why("in-flight").state == "unknown"  # delivered: gone from the store


def test_claim_tokens_carry_a_name_in_letters_and_digits_only() -> None:
    """Every release's claim reads a leased entry's token as %w+ (includes/checks.lua)."""
    for name in ("", "host:123", "ünï cödé/∞ " * 5, "a" * 100):
        token = claim_token(name)
        assert token.isalnum() and token.isascii()
        assert claimer_of(token) == (name.encode()[:24].decode("utf-8", "replace") or None)
    assert claimer_of("0123456789abcdef") is None  # an earlier release's token
    assert claimer_of("0123456789abcdefxzz") is None  # not hex after the mark


def test_a_lease_that_ran_out_and_a_lossless_publish(vstore: DelayStore) -> None:
    vstore.schedule("stale", past(120), item())
    now = vstore.server_time_ms()
    claim_of(vstore, "stale", lease_ms=1_000, now=now - 60_000)
    stale = vstore.why("stale")
    assert (stale.state, stale.until_ms) == ("due", now - 59_000)
    assert "its lease ran out at" in stale.line
    vstore.schedule("kept", past(), item())
    claim = claim_of(vstore, "kept")
    vstore.keep(claim, {"kept": 60_000})  # type: ignore[arg-type]
    kept = vstore.why("kept")
    assert kept.state == "awaiting_start" and kept.until_ms is not None and kept.until_ms > now + 50_000
    assert kept.line.startswith("published, awaiting its worker's start until")


def test_flow_control_holds_an_item_on_its_queue(vstore: DelayStore) -> None:
    """A real forwarder with a rate cap of 1/s on queue "slow": the rest are deferred by flow."""
    vstore.schedule_many([(f"f{n}", past(), item(str(n), "slow")) for n in range(20)])
    target = CollectingTarget("list")
    Forwarder(vstore, [target], flow=FlowControl(rates={"slow": 1.0})).run_once()
    held = [vstore.why(f"f{n}") for n in range(20) if f"f{n}" not in target.ids]
    assert held and all(w.state == "flow" and w.queue == "slow" for w in held), held
    first = held[0]
    assert first.until_ms is not None and first.until_ms > vstore.server_time_ms()
    assert first.line == f"held by flow control on queue slow until {iso(first.until_ms)} " + (
        "(deferred by flow: a full broker queue or a rate cap)"
    )


def test_a_group_at_its_limit_names_what_runs(vstore: DelayStore) -> None:
    """Group (slot) tenant-7 at limit 2: a real forwarder releases 2 of 5; the rest wait for it."""
    start = past()
    ids = [f"t7-{n}" for n in range(5)]
    for n, item_id in enumerate(ids):
        vstore.schedule(item_id, start + timedelta(milliseconds=n), item(item_id), slot={"key": "tenant-7", "limit": 2})
    target = CollectingTarget("list")
    Forwarder(vstore, [target]).run_until_idle()  # a group new to a forwarder goes an item at a time at first
    assert sorted(target.ids) == ids[:2]
    waiting = vstore.why(ids[3])
    assert (waiting.state, waiting.group, waiting.running, waiting.limit) == ("group_limit", "tenant-7", 2, 2)
    assert sorted(waiting.running_ids) == ids[:2] and waiting.ahead == 1
    assert (
        waiting.line
        == f"waiting for group tenant-7 (2 of 2 running: {', '.join(waiting.running_ids)}); 1 ahead of it in its line"
    )
    vstore.schedule("t7-new", past(), item("t7-new"), slot={"key": "tenant-7", "limit": 2})
    due = vstore.why("t7-new")  # waits in its group's line from its schedule on, behind the 3 before it
    assert (due.state, due.until_ms, due.ahead, due.running) == ("group_limit", None, 3, 2)
    vstore.set_slot_limit("tenant-7", 4)  # room now: the item is in line until its recheck
    roomy = vstore.why(ids[3])
    assert (roomy.state, roomy.ahead, roomy.limit) == ("group_line", 1, 4)
    assert roomy.line == "behind 1 items of group tenant-7"
    assert vstore.why("t7-new").state == "group_line"


def test_the_first_of_an_items_groups_that_holds_it_is_named(vstore: DelayStore) -> None:
    """An item of tenant-1 (no limit) and endpoint-x (limit 1, its one slot taken): endpoint-x holds it."""
    vstore.take_slots({"endpoint-x": SlotAsk(1, [("other", 0)])}, hold_ms=60_000, wait_ms=60_000)
    vstore.schedule("call", past(), item(), group=["tenant-1", {"key": "endpoint-x", "limit": 1}])
    held = vstore.why("call")
    assert (held.state, held.group, held.running_ids, held.limit) == ("group_limit", "endpoint-x", ("other",), 1)
    assert held.line == "waiting for group endpoint-x (1 of 1 running: other)"
    vstore.schedule("free", past(), item(), group=["tenant-1", "endpoint-y"])
    assert vstore.why("free").state == "group_line"  # in its line until a pass releases it


def test_a_paused_throttled_or_rate_capped_group_says_so(vstore: DelayStore) -> None:
    """Runtime policies, applied by a real forwarder's take (slot_take.lua): a paused group
    releases nothing, a throttle holds it until its end, a rate of 1/m lets one go a minute."""
    vstore.pause_group("tenant-9")
    vstore.set_group("api", rate="1/m")
    for n in range(2):
        vstore.schedule(f"t9-{n}", past(), item(), slot="tenant-9")
        vstore.schedule(f"api-{n}", past(), item(), slot="api")
    target = CollectingTarget("list")
    Forwarder(vstore, [target]).run_once()
    [released] = target.ids
    assert released in ("api-0", "api-1")
    paused = vstore.why("t9-1")
    assert (paused.state, paused.group, paused.reason) == ("group_paused", "tenant-9", "operator")
    assert paused.line == "group tenant-9 paused (by operator)"
    over = vstore.why({"api-0": "api-1", "api-1": "api-0"}[released])
    now = vstore.server_time_ms()
    assert over.state == "group_rate" and over.until_ms is not None and now + 55_000 < over.until_ms <= now + 60_000
    assert over.line == f"over group api's rate until {iso(over.until_ms)}"
    vstore.resume_group("tenant-9")
    until = vstore.throttle_group("tenant-9", 30, by="worker:t9-0")
    throttled = vstore.why("t9-0")
    assert (throttled.state, throttled.until_ms, throttled.reason) == ("group_throttled", until, "worker:t9-0")
    assert throttled.line == f"group tenant-9 throttled until {iso(until)} (by worker:t9-0)"
    vstore.resume_group("tenant-9")  # the throttle ends too: only its deferral holds it now
    assert vstore.why("t9-0").state in ("flow", "due", "group_line")


def test_an_item_parked_for_its_group_answers_from_the_group(vstore: DelayStore) -> None:
    """Parked in a group's line: by a forwarder's refusal (reason ``group:<key>``, park.lua) or
    born there by a producer (no reason recorded: the due score and leased entry as
    group_schedule.lua writes them). Either way the group says what holds it."""
    vstore.take_slots({"G": SlotAsk(1, [("runner", 0)])}, hold_ms=60_000, wait_ms=60_000)
    vstore.schedule("refused", past(), item(), group=["tenant-2", {"key": "G", "limit": 1}])
    claim = claim_of(vstore, "refused")
    assert vstore.park(claim, {"refused": "group:G"}, recheck_ms=vstore.server_time_ms() + 60_000).count == 1  # type: ignore[arg-type]
    refused = vstore.why("refused")
    assert (refused.state, refused.group, refused.running_ids) == ("group_limit", "G", ("runner",))
    vstore.schedule("born", past(), item(), group="tenant-3")
    k = vstore.keys(vstore.shard_of("born"))
    ready = vstore.server_time_ms() - 1_000
    vstore.client.zadd(k.due, {"born": PARKED_MS})
    vstore.client.hset(k.leased, "born", f"{PARKED_MS}:deferred:{ready}")
    born = vstore.why("born")
    assert (born.state, born.group, born.ready_ms, born.ahead) == ("group_line", "tenant-3", ready, 0)
    assert born.line == "waiting in group tenant-3's line: the group has room, a forwarder's pass releases it"
    vstore.pause_group("tenant-3")
    assert vstore.why("born").line == "group tenant-3 paused (by operator)"


def test_a_parked_item_says_why_and_when_it_is_looked_at(vstore: DelayStore) -> None:
    vstore.schedule("rq-job", past(), Envelope("rq", "default", b""))
    target = CollectingTarget("list")
    Forwarder(vstore, [target]).run_once()  # no rq target here: parked
    parked = vstore.why("rq-job")
    assert (parked.state, parked.reason) == ("parked", "target:rq")
    assert parked.until_ms is not None and parked.until_ms > vstore.server_time_ms()
    assert parked.line == (
        "parked: the forwarders that claimed it have no 'rq' target (start one that has); "
        f"looked at again at {iso(parked.until_ms)}"
    )


def test_a_dead_letter_and_a_paused_entry(vstore: DelayStore) -> None:
    vstore.schedule("doomed", past(), item())
    claim = claim_of(vstore, "doomed")
    vstore.fail(claim, [FailedDelivery("doomed", None, "ValueError: no such customer")])  # type: ignore[arg-type]
    dead = vstore.why("doomed")
    assert (dead.state, dead.reason, dead.attempts) == ("dead", "ValueError: no such customer", 1)
    assert dead.line == f"dead since {iso(dead.since_ms)}: ValueError: no such customer (1 attempts)"
    vstore.schedule("paused-entry", datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc), item())
    paused = vstore.why("paused-entry")
    assert (paused.state, paused.until_ms, paused.line) == (
        "scheduled",
        None,
        "never due: a paused or finished periodic entry",
    )


def test_garbage_in_the_store_never_breaks_an_answer(vstore: DelayStore) -> None:
    """Hand writes: a leased entry that is no lease, a group limit that is no number and holds of
    another type (read as the item's own limit and none running, as the group scripts do), a dead
    letter's info that is no JSON."""
    shard_of = vstore.shard_of
    vstore.schedule("odd-lease", past(), item())
    k = vstore.keys(shard_of("odd-lease"))
    vstore.client.hset(k.leased, "odd-lease", b"\xff:not:a:lease")
    assert vstore.why("odd-lease").state == "due"
    vstore.schedule("slotted", past(), item(), slot={"key": "g-bad", "limit": 1})
    vstore.take_slots({"g-bad": SlotAsk(1, [("slotted", 0)])}, hold_ms=60_000, wait_ms=60_000, mode="join")
    holds, _, _, limit, _, _ = vstore.slot_keys("g-bad")
    vstore.client.set(limit, "lots")
    vstore.client.hset(holds, "x", "y")  # no ZSET: holds nothing
    claim = claim_of(vstore, "slotted")
    vstore.defer(claim, [("slotted", vstore.server_time_ms() + 60_000)])  # type: ignore[arg-type]
    odd = vstore.why("slotted")
    assert (odd.state, odd.limit, odd.running) == ("group_line", 1, 0)
    k = vstore.keys(shard_of("dead-odd"))
    vstore.client.zadd(k.dead, {"dead-odd": 1_700_000_000_000})
    vstore.client.hset(k.dead_info, "dead-odd", b"\x00 not json")
    odd_dead = vstore.why("dead-odd")
    assert odd_dead.state == "dead" and odd_dead.since_ms == 1_700_000_000_000


def test_every_state_has_its_line() -> None:
    from delayq_backends.store.why import _LINES

    assert set(_LINES) == set(WHY_STATES)


def test_the_reader_role_answers(vstore: DelayStore, prefix: str, valkey_url: str) -> None:
    """Reads only: a ``reader`` ACL user gets the same answers (a lease, a group's limit, a dead letter)."""
    for n in range(3):
        vstore.schedule(f"r{n}", past(), item(), slot={"key": "one", "limit": 1})
    Forwarder(vstore, [CollectingTarget("list")]).run_once()
    vstore.schedule("r-later", 2_000_000_000, item())
    admin = redis.Redis.from_url(valkey_url)
    name, password = f"reader-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.execute_command(*acl_setuser(name, prefix, "reader", password=password))
    try:
        port = admin.connection_pool.connection_kwargs["port"]
        reader = DelayStore(
            connect(f"redis://{name}:{password}@127.0.0.1:{port}/0"), Config(prefix=prefix, shards=SHARDS)
        )
        for item_id in ("r0", "r1", "r2", "r-later", "nothing"):
            assert reader.why(item_id) == vstore.why(item_id)
        # one of the three went (they are due at once: any may be first), two wait for its slot
        assert sorted(reader.why(i).state for i in ("r0", "r1", "r2")) == ["group_limit", "group_limit", "unknown"]
        reader.client.close()
    finally:
        admin.acl_deluser(name)
        admin.close()


def test_a_concurrent_answer_never_fails_while_items_move(vstore: DelayStore) -> None:
    """Read while a forwarder delivers: every answer is one of the states, never an error."""
    vstore.schedule_many([(f"m{n}", past(), item()) for n in range(300)])
    answers: list[str] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            answers.extend(vstore.why(f"m{n}").state for n in range(0, 300, 7))

    reader = threading.Thread(target=ask)
    reader.start()
    Forwarder(vstore, [CollectingTarget("list")], batch=20).run_once()
    stop.set()
    reader.join(10)
    assert answers and set(answers) <= {"due", "leased", "unknown"}
    assert {vstore.why(f"m{n}").state for n in range(300)} == {"unknown"}
