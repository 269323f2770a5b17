"""Issue 31's group API: in the envelope (:class:`Group`, :func:`parse_groups`, :func:`with_groups`
and :func:`groups_of`, with ``slot`` and ``rate_key`` folded in as aliases; pure), and the
producer's ``group=`` on a real server (stored, delivered, kept; bad input stores nothing)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq_backends import DelayStore, InvalidSlotError
from delayq_backends.envelope import (
    GROUPS,
    MAX_GROUPS,
    Envelope,
    Group,
    Slot,
    groups_of,
    parse_groups,
    with_groups,
    with_rate_key,
    with_slot,
)
from delayq_backends.errors import InvalidGroupError
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import make_store


def plain() -> Envelope:
    return Envelope("list", "out", b"body")


def test_a_group_is_a_key_a_dict_a_group_or_a_slot() -> None:
    assert parse_groups("tenant-7") == (Group("tenant-7"),)
    full = {"key": "t", "limit": 2, "rate": "10/s", "weight": 3, "cost": 5}
    assert parse_groups(full) == (Group("t", 2, "10/s", 3.0, 5),)
    assert parse_groups(Group("t", 2)) == (Group("t", 2),)
    assert parse_groups(Slot("s", 4)) == (Group("s", 4),)
    assert parse_groups(["a", {"key": "b", "limit": 1}, Group("c")]) == (Group("a"), Group("b", 1), Group("c"))
    assert Group.parse({"key": "t", "cost": None}).cost == 1


def test_rates_and_weights_are_kept_as_a_runtime_policy_keeps_them() -> None:
    """The policy's own checks (group_policies): an item's rate means what an operator's does."""
    assert [Group("t", rate=r).rate for r in ("10/s", " 600 / m", "0.5/h", 20)] == ["10/s", "600/m", "0.5/h", "20/s"]
    assert Group("t", weight=3).weight == 3.0 and isinstance(Group("t", weight=3).weight, float)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (5, "is a int"),
        (True, "is a bool"),
        (None, "is a NoneType"),
        ("", "printable text"),
        ("x" * 201, "printable text"),
        ("a\nb", "printable text"),
        ("t}:batch", "without '}:'"),
        ({"limit": 2}, "no 'key'"),
        ({"key": "t", "lim": 2}, "unknown field(s) ['lim']"),
        ({"key": "t", "limit": 0}, "limit"),
        ({"key": "t", "limit": 2.0}, "limit"),
        ({"key": "t", "limit": True}, "limit"),
        ({"key": "t", "rate": "10/d"}, "'N/s', 'N/m' or 'N/h'"),
        ({"key": "t", "rate": "0/s"}, "'N/s', 'N/m' or 'N/h'"),
        ({"key": "t", "rate": True}, "'N/s', 'N/m' or 'N/h'"),
        ({"key": "t", "rate": "2000000/s"}, "'N/s', 'N/m' or 'N/h'"),
        ({"key": "t", "weight": 0}, "weight"),
        ({"key": "t", "weight": float("inf")}, "weight"),
        ({"key": "t", "weight": float("nan")}, "weight"),
        ({"key": "t", "weight": "3"}, "weight"),
        ({"key": "t", "weight": 1001}, "weight"),
        ({"key": "t", "cost": 0}, "cost"),
        ({"key": "t", "cost": 1.5}, "cost"),
        (["a", "b", "c", "d"], "at most 3"),
        (["a", {"key": "a", "limit": 2}], "['a'] named twice"),
        ([["a"]], "is a list"),
    ],
)
def test_bad_groups_say_what_to_pass(value: Any, says: str) -> None:
    with pytest.raises(InvalidGroupError) as raised:
        parse_groups(value)
    assert says in str(raised.value)
    assert isinstance(raised.value, InvalidSlotError)  # a slot is a group: old handlers catch it


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(InvalidGroupError) as raised:
        Group("t", limit=0, rate="1/d", weight=-1, cost=0)
    assert all(word in str(raised.value) for word in ("limit", "rate", "weight", "cost"))


def test_groups_travel_in_the_envelope_and_only_set_fields_are_stored() -> None:
    envelope = with_groups(plain(), ["tenant-7", {"key": "api", "rate": "5/s", "cost": 3}])
    assert envelope.meta[GROUPS] == [{"key": "tenant-7"}, {"key": "api", "rate": "5/s", "cost": 3}]
    decoded = Envelope.decode(envelope.encode())
    assert groups_of(decoded) == (Group("tenant-7"), Group("api", rate="5/s", cost=3))
    assert decoded.body == b"body"
    assert groups_of(plain()) == ()


def test_with_groups_replaces_and_none_or_an_empty_list_removes() -> None:
    once = with_groups(plain(), "a")
    assert groups_of(with_groups(once, "b")) == (Group("b"),)
    assert GROUPS not in with_groups(once, None).meta
    assert GROUPS not in with_groups(once, []).meta
    assert parse_groups([]) == ()  # a list computed per item may come out empty: no group


def test_slot_and_rate_key_are_groups() -> None:
    slotted = with_slot(plain(), Slot("customer-42", 2), rank=7)
    assert groups_of(slotted) == (Group("customer-42", 2),)
    keyed = with_rate_key(plain(), "tenant-1")
    assert groups_of(keyed) == (Group("tenant-1"),)
    both = with_rate_key(slotted, "tenant-1")
    assert groups_of(both) == (Group("customer-42", 2), Group("tenant-1"))
    same = with_rate_key(slotted, "customer-42")  # one key named by both aliases: one group
    assert groups_of(same) == (Group("customer-42", 2),)


def test_groups_come_first_and_a_key_named_twice_is_one_group() -> None:
    slotted = with_rate_key(with_slot(plain(), Slot("t-7", 3)), "t-7")
    envelope = with_groups(slotted, [{"key": "api"}, {"key": "t-7", "rate": "10/s"}])
    assert groups_of(envelope) == (Group("api"), Group("t-7", limit=3, rate="10/s"))
    ours = with_groups(slotted, {"key": "t-7", "limit": 1})  # the group's own field wins
    assert groups_of(ours) == (Group("t-7", limit=1),)


def test_aliases_count_towards_the_most_groups() -> None:
    envelope = with_rate_key(with_slot(plain(), Slot("s")), "r")
    assert len(groups_of(with_groups(envelope, "g"))) == MAX_GROUPS
    with pytest.raises(InvalidGroupError, match="at most 3 groups"):
        with_groups(envelope, ["g", "h"])
    assert groups_of(with_groups(envelope, ["s", "r", "g"])) == (Group("s"), Group("r"), Group("g"))


@pytest.mark.parametrize(
    "stored",
    [
        "tenant",
        [{"key": ""}, {"key": "ok"}],
        [{"key": "ok"}, 7, None, {"key": "a", "limit": -1}, {"key": "ok", "limit": 5}],
        [{"key": "ok", "sneaky": 1}],
    ],
)
def test_stored_garbage_is_skipped_not_stuck(stored: Any) -> None:
    """Written by another tool: groups that are no groups are skipped, so the item runs as if it
    did not name them instead of stopping a forwarder."""
    found = groups_of(Envelope("list", "out", meta={GROUPS: stored}))
    assert found in ((), (Group("ok"),), (Group("ok", 5),))


def test_only_the_first_three_stored_are_read() -> None:
    stored = [{"key": k} for k in "abcd"]
    assert [g.key for g in groups_of(Envelope("list", "out", meta={GROUPS: stored}))] == ["a", "b", "c"]
    planted = [7] * 3 + [{"key": f"k{i}"} for i in range(100_000)]  # garbage first: none of the rest is read
    assert groups_of(Envelope("list", "out", meta={GROUPS: planted})) == ()


@pytest.mark.parametrize("header", [42, "", ["a", "b", "c", "d"], {"key": "k", "limit": "many"}])
def test_a_worker_runs_a_task_whose_group_header_is_garbage(header: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Planted or corrupted in a message: the worker logs it and holds the groups it can read
    (the task's slot here), and the task runs."""
    from types import SimpleNamespace

    from delayq_backends.celery.slots import groups_of_request

    request = SimpleNamespace(id="t1", retries=0, delayq_group=header, delayq_slot="s", delayq_slot_token="tok")
    found = groups_of_request(request)
    assert found is not None and found[0] == (Group("s"),) and found[1].token == "tok"
    assert any("task t1: header delayq_group" in r.message for r in caplog.records)


keys = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Co", "Cn")), min_size=1, max_size=30)
groups = st.builds(
    Group,
    keys.filter(lambda k: "}:" not in k and k.isprintable()),
    st.none() | st.integers(1, 1_000_000),
    st.none() | st.builds(lambda n, p: f"{n}/{p}", st.integers(1, 10**6), st.sampled_from("smh")),
    st.none() | st.floats(0.001, 1000),
    st.integers(1, 10**9),
)


@given(st.lists(groups, min_size=1, max_size=MAX_GROUPS, unique_by=lambda g: g.key))
def test_any_groups_round_trip(gs: list[Group]) -> None:
    envelope = Envelope.decode(with_groups(plain(), gs).encode())
    assert groups_of(envelope) == tuple(gs)


# -- the producer API on a real server ------------------------------------------------------------


def list_envelope(tag: str) -> Envelope:
    return RedisListTarget.envelope("out", tag.encode())


def stored_groups(store: DelayStore, item_id: str) -> tuple[Group, ...]:
    item = store.get(item_id)
    assert item is not None, f"{item_id} is not stored"
    return groups_of(Envelope.decode(item.envelope))


def stored_count(store: DelayStore) -> int:
    return sum(s.scheduled for s in store.stats())


def test_schedule_stores_the_groups_and_a_forwarder_delivers_them(server_url: str, prefix: str) -> None:
    store = make_store(server_url, prefix, shards=4)
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    store.schedule("key", past, list_envelope("key"), group="tenant-7")
    store.schedule("dict", past, list_envelope("dict"), group={"key": "tenant-7", "limit": 2, "rate": "10/s"})
    three = ["tenant-7", {"key": "api", "weight": 3, "cost": 5}, Group("region-eu")]
    store.schedule("three", past, list_envelope("three").encode(), group=three)  # bytes are decoded once
    expected = {
        "key": (Group("tenant-7"),),
        "dict": (Group("tenant-7", 2, "10/s"),),
        "three": (Group("tenant-7"), Group("api", weight=3.0, cost=5), Group("region-eu")),
    }
    assert {i: stored_groups(store, i) for i in expected} == expected
    target = CollectingTarget("list")
    Forwarder(store, [target]).run_once()
    assert {d.id: groups_of(d.envelope) for d in target.delivered} == expected


def test_slot_and_rate_key_go_with_group_as_aliases(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix)
    later = timedelta(hours=1)
    store.schedule("a", later, list_envelope("a"), slot={"key": "s", "limit": 2}, rate_key="r", group="g")
    assert stored_groups(store, "a") == (Group("g"), Group("s", 2), Group("r"))
    store.schedule("b", later, list_envelope("b"), slot="t-7", group={"key": "t-7", "rate": "5/m"})
    assert stored_groups(store, "b") == (Group("t-7", rate="5/m"),)
    with pytest.raises(InvalidGroupError, match="at most 3 groups"):
        store.schedule("c", later, list_envelope("c"), slot="s", rate_key="r", group=["g", "h"])
    assert store.get("c") is None


def test_reschedule_schedule_many_and_debounce_keep_the_groups(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    store.schedule("moved", later, list_envelope("moved"), group={"key": "t", "limit": 1})
    assert store.reschedule("moved", later + timedelta(hours=1))
    assert stored_groups(store, "moved") == (Group("t", 1),)
    bulk = [(f"m{i}", later, with_groups(list_envelope(f"m{i}"), f"t-{i % 3}")) for i in range(6)]
    assert store.schedule_many(bulk).added == 6
    assert [stored_groups(store, f"m{i}") for i in range(6)] == [(Group(f"t-{i % 3}"),) for i in range(6)]
    for tag in ("first", "last"):
        run = store.debounce("doc-1", timedelta(seconds=30), list_envelope(tag), group=["t", "doc"])
    assert stored_groups(store, run.id) == (Group("t"), Group("doc"))
    run = store.throttle("doc-1", timedelta(seconds=30), list_envelope("x"), group="t")
    assert stored_groups(store, run.id) == (Group("t"),)


@pytest.mark.parametrize(
    "bad",
    ["", {"key": "t", "limit": 0}, {"key": "t", "rate": "fast"}, ["a", "b", "c", "d"], {"key": "t", "typo": 1}],
)
def test_a_bad_group_stores_nothing_on_any_path(valkey_url: str, prefix: str, bad: Any) -> None:
    store = make_store(valkey_url, prefix)
    later = timedelta(hours=1)
    with pytest.raises(InvalidGroupError):
        store.schedule("x", later, list_envelope("x"), group=bad)
    with pytest.raises(InvalidGroupError):
        store.debounce("k", later, list_envelope("x"), group=bad)
    with store.client.pipeline() as pipe:  # checked before anything is queued on the caller's pipeline
        with pytest.raises(InvalidGroupError):
            store.schedule("x", later, list_envelope("x"), group=bad, pipeline=pipe)
        assert len(pipe.command_stack) == 0
    store.open_batch("b")
    with pytest.raises(InvalidGroupError):
        store.schedule("x", later, list_envelope("x"), group=bad, batch="b")
    assert stored_count(store) == 0
    status = store.batch_status("b")
    assert status is not None and status.total == 0  # not counted into its batch either
