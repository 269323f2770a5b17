"""Group policies on a real server: the runtime policy (limit, rate with cost, weight, paused, a
throttle) applied by ``slot_take.lua`` at every release, set through the store's API, by
pattern, and throttled from a worker only with its hold's token; garbage in a group's policy
and bucket never stops the group for long and is reported."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from delayq_backends import DelayStore, GroupPolicies
from delayq_backends import keys as layout
from delayq_backends.celery import CelerySettings
from delayq_backends.cli import main
from delayq_backends.envelope import Slot, with_slot
from delayq_backends.errors import ConfigError, InvalidGroupPolicyError
from delayq_backends.group_policies import GROUP_POLICIES_ENV, MAX_THROTTLE_SECONDS, RATE_BURST_MS
from delayq_backends.models import GroupPolicy, GroupStatus, SlotGrant
from delayq_backends.scripts import script
from delayq_backends.store import SlotAsk, SlotRun
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, make_store
from tests.helpers import wait_for
from tests.test_security import Admin, admin, open_store, user_url  # noqa: F401 (admin: a fixture)
from tests.test_slots import Running, past, running, schedule_line  # noqa: F401 (running: a fixture)

#: Hostile writes to a group's policy and bucket: each must leave the group releasing, the
#: garbage reported (SAID) and, for a policy field, dropped.
GARBAGE: dict[str, Callable[[redis.Redis, str, str], object]] = {
    "policy of another type": lambda c, p, k: c.set(layout.group_policy_key(p, k), "junk"),
    "limit not a number": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "limit", "lots"),
    "limit 0": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "limit", "0"),
    "rate not a rate": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "rate", "0/s"),
    "rate far too high": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "rate", "1e300/s"),
    "weight negative": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "weight", "-3"),
    "paused empty": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "paused", ""),
    "throttled for years": lambda c, p, k: c.hset(
        layout.group_policy_key(p, k), mapping={"throttled_until": "99999999999999", "throttled_by": "x"}
    ),
    "throttled by no number": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "throttled_until", "soon"),
    "bucket of another type": lambda c, p, k: (
        c.hset(layout.group_policy_key(p, k), "rate", "1000/s"),
        c.rpush(layout.group_bucket_key(p, k), "x"),
    ),
    "bucket in deep debt": lambda c, p, k: (
        c.hset(layout.group_policy_key(p, k), "rate", "1000/s"),
        c.hset(layout.group_bucket_key(p, k), mapping={"tokens": "-1e300", "at": "0"}),
    ),
    "bucket refilled in the future": lambda c, p, k: (
        c.hset(layout.group_policy_key(p, k), "rate", "1000/s"),
        c.hset(layout.group_bucket_key(p, k), mapping={"tokens": "0", "at": "99999999999999"}),
    ),
    "a carried limit of 0": lambda c, p, k: c.hset(layout.group_policy_key(p, k), "carried", "0:1"),
    "a carried limit seen in the future": lambda c, p, k: c.hset(
        layout.group_policy_key(p, k), "carried", "1:99999999999999"
    ),
}
SAID = {
    "policy of another type": ":policy type=string",
    "limit not a number": "policy limit=lots",
    "limit 0": "policy limit=0",
    "rate not a rate": "policy rate=0/s",
    "rate far too high": "policy rate=1e300/s",
    "weight negative": "policy weight=-3",
    "paused empty": "policy paused=",
    "throttled for years": "policy throttled_until=99999999999999",
    "throttled by no number": "policy throttled_until=soon",
    "bucket of another type": ":bucket type=list",
    "bucket in deep debt": "bucket tokens=-1e300",
    "bucket refilled in the future": "bucket tokens=0 at=99999999999999",
    "a carried limit of 0": "policy carried=0:1",
    "a carried limit seen in the future": "policy carried=1:99999999999999",
}


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_in_policy_and_bucket_is_dropped_and_reported(
    running: Running,  # noqa: F811 (the imported fixture)
    garbage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever is written into a group's policy or bucket, every item of the group is released
    (at most its items' limit at once), with a warning naming what was dropped; a garbage
    policy field is gone after the first take that met it."""
    store = running.forwarder.store
    prefix = store.config.prefix
    GARBAGE[garbage](store.client, prefix, "a")
    a = schedule_line(store, "a", 6, limit=2, start=past())
    running.thread.start()
    for n in range(6):
        running.wait(lambda n=n: len(running.of("a")) > n, f"item {n} of a")
        assert store.slot_status("a").running <= 2
        running.end("a", [running.of("a")[n]])
    assert sorted(running.of("a")) == a
    assert any("slot 'a': " in r.message and SAID[garbage] in r.message for r in caplog.records)
    policy = store.client.hgetall(layout.group_policy_key(prefix, "a"))
    # the items' limit, recorded by their first admission (slot_take.lua), is no garbage
    assert set(policy) <= {b"rate", b"carried"}, f"garbage fields are dropped: {policy}"
    assert policy.get(b"carried", b"2:").startswith(b"2:")


def test_a_garbage_policy_reads_as_unset_and_does_not_raise(valkey_url: str, prefix: str) -> None:
    """The store's reads treat a garbage policy as the script does: each bad value as unset."""
    store = make_store(valkey_url, prefix)
    name = layout.group_policy_key(store.config.prefix, "g")
    store.client.hset(name, mapping={"limit": "lots", "rate": "fast", "weight": "inf", "throttled_until": "1e99"})
    store.client.set(layout.slot_limit_key(store.config.prefix, "g"), "4")
    policy = store.group_policy("g")
    assert (policy.limit, policy.rate, policy.weight, policy.throttled_until) == (4, None, None, None)
    grant = store.take_slots({"g": SlotAsk(0, [("x", 0)])}, hold_ms=60_000, wait_ms=60_000)["g"]
    assert not isinstance(grant, Exception) and grant.limit == 4 and grant.places == (-1,)


# -- the store's API ---------------------------------------------------------------------------


def test_set_group_sets_what_it_is_given_and_leaves_the_rest(store: DelayStore) -> None:
    store.set_group("t", limit=2, rate=10, weight=3)
    assert store.group_policy("t") == GroupPolicy(limit=2, rate="10/s", weight=3.0)
    store.set_group("t", rate="30/m", paused=True)
    assert store.group_policy("t") == GroupPolicy(limit=2, rate="30/m", weight=3.0, paused="operator")
    store.set_group("t", limit=None, weight=None, paused=False)
    assert store.group_policy("t") == GroupPolicy(rate="30/m")
    assert store.groups_in_use() == ["t"]


def test_a_bad_policy_value_is_refused_with_what_to_pass_and_nothing_is_written(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix)
    store.set_group("t", limit=2)
    for kwargs, says in (
        ({"limit": 0}, "1 <= N <= 1000000"),
        ({"limit": True}, "1 <= N"),
        ({"rate": "10/d"}, "'N/s', 'N/m' or 'N/h'"),
        ({"rate": "-1/s"}, "N > 0"),
        ({"rate": "2000000/s"}, "at most"),
        ({"weight": 0}, "weight=0"),
        ({"weight": float("nan")}, "weight=nan"),
        ({"paused": "\n"}, "who did it"),
    ):
        with pytest.raises(InvalidGroupPolicyError, match=re.escape(says)):
            store.set_group("t", **{"weight": 5, **kwargs})  # the good value is not written either
    for key in ("", "a}:batch", "x" * 201, 7):
        with pytest.raises(InvalidGroupPolicyError):
            store.set_group(key, limit=1)  # type: ignore[arg-type]
    assert store.group_policy("t") == GroupPolicy(limit=2)
    with pytest.raises(InvalidGroupPolicyError, match="seconds > 0"):
        store.throttle_group("t", 0)
    with pytest.raises(InvalidGroupPolicyError, match="seconds > 0"):
        store.throttle_group("t", MAX_THROTTLE_SECONDS + 1)


def test_set_slot_limit_is_set_group_limit_and_the_older_limit_string_yields(store: DelayStore) -> None:
    """A limit an earlier release stored (the limit string) applies until the policy sets one;
    setting or removing the limit through either name leaves one value in force."""
    store.client.set(layout.slot_limit_key(store.config.prefix, "k"), "5")  # an earlier release's set_slot_limit
    assert store.group_policy("k").limit == 5 and store.slot_status("k").limit == 5
    store.set_slot_limit("k", 2)
    assert (
        store.group_policy("k").limit == 2 and store.client.exists(layout.slot_limit_key(store.config.prefix, "k")) == 0
    )
    grant = store.take_slots({"k": SlotAsk(4, [("a", 0), ("b", 1), ("c", 2)])}, hold_ms=60_000, wait_ms=60_000)["k"]
    assert not isinstance(grant, Exception) and (grant.limit, grant.places) == (2, (-1, -1, 0))
    assert grant.reasons == ("", "", "limit")
    store.set_group("k", limit=None)
    assert store.group_policy("k").limit is None and store.slot_status("k").limit is None


def test_pause_resume_and_throttle(store: DelayStore) -> None:
    take = lambda member: store.take_slots({"g": SlotAsk(0, [(member, 0)])}, hold_ms=60_000, wait_ms=60_000)["g"]  # noqa: E731
    store.pause_group("g", by="ops-alice")
    paused = take("a")
    assert not isinstance(paused, Exception) and paused.paused and paused.reasons == ("paused",)
    assert store.group_policy("g").paused == "ops-alice"
    store.resume_group("g")
    assert not isinstance(granted := take("b"), Exception) and granted.places == (-1,) and not granted.paused
    now = store.server_time_ms()
    store.clock = lambda: now  # type: ignore[method-assign]  # the throttle counts from the store's clock
    until = store.throttle_group("g", 30)
    assert until == now + 30_000
    assert store.throttle_group("g", 5) == until, "a shorter throttle does not cut a longer one"
    throttled = take("c")
    assert not isinstance(throttled, Exception) and throttled.reasons == ("throttled",)
    assert throttled.throttled_until == until
    assert store.group_policy("g").throttled_by == "operator"
    store.resume_group("g")
    assert store.group_policy("g") == GroupPolicy()
    assert not isinstance(again := take("c"), Exception) and again.places == (-1,)


def test_group_statuses_read_policy_running_and_waiting(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix)
    store.set_group("busy", limit=1, weight=2)
    store.take_slots({"busy": SlotAsk(0, [("a", 0), ("b", 1), ("c", 2)])}, hold_ms=60_000, wait_ms=60_000)
    store.set_group("idle", rate="1/h")
    assert store.group_statuses(["busy", "idle", "none"]) == [
        GroupStatus("busy", GroupPolicy(limit=1, weight=2.0), running=1, parked=2),
        GroupStatus("idle", GroupPolicy(rate="1/h"), running=0, parked=0),
        GroupStatus("none", GroupPolicy(), running=0, parked=0),
    ]
    assert store.groups_in_use() == ["busy", "idle"]


# -- slot_take.lua: the policy over the items' values over the patterns' -------------------------

T0 = 1_800_000_000_000  # a fixed clock (ms): the script is given it instead of TIME


def test_the_runtime_policy_wins_over_the_items_values_and_they_over_the_patterns(valkey_url: str, prefix: str) -> None:
    patterns = {"t-*": {"limit": 1, "rate": "1/s", "weight": 2}, "*": {"weight": 9}}
    store = make_store(valkey_url, prefix, group_policies=patterns)
    ask = lambda key, a: store.take_slots({key: a}, hold_ms=60_000, wait_ms=60_000, now=T0)[key]  # noqa: E731
    by_pattern = ask("t-1", SlotAsk(0, [("a", 0)]))
    assert not isinstance(by_pattern, Exception)
    assert (by_pattern.limit, by_pattern.rate_per_s, by_pattern.weight) == (1, 1.0, 2.0)
    by_item = ask("t-2", SlotAsk(3, [("a", 0)], rate="5/s", weight=4))
    assert not isinstance(by_item, Exception)
    assert (by_item.limit, by_item.rate_per_s, by_item.weight) == (3, 5.0, 4.0)
    store.set_group("t-2", limit=2, rate="1/m", weight=0.5)
    by_policy = ask("t-2", SlotAsk(3, [("b", 1)], rate="5/s", weight=4))
    assert not isinstance(by_policy, Exception)
    assert (by_policy.limit, by_policy.rate_per_s, by_policy.weight) == (2, pytest.approx(1 / 60), 0.5)
    other = ask("u", SlotAsk(0, [("a", 0)]))
    assert not isinstance(other, Exception) and (other.limit, other.rate_per_s, other.weight) == (0, None, 9.0)


def test_a_rate_charges_each_item_its_cost_and_says_when_the_next_may_go(store: DelayStore) -> None:
    """100/s holds 50 tokens (RATE_BURST_MS, 0.5 s worth); an item takes its cost, one costing
    more than the bucket holds goes when it is full and leaves a debt the next items wait out; a
    refusal keeps the order (none behind it goes in that call)."""
    assert f"local BURST_MS = {RATE_BURST_MS} " in script("slot_take").body
    store.set_group("r", rate="100/s")
    n = iter(range(1000))

    def ask(at: int, *costs: int) -> SlotGrant:
        members = [(f"m{next(n)}", 0) for _ in costs]
        grant = store.take_slots({"r": SlotAsk(0, members, costs=costs)}, hold_ms=60_000, wait_ms=60_000, now=T0 + at)[
            "r"
        ]
        assert not isinstance(grant, Exception)
        return grant

    first = ask(0, *[1] * 52)
    assert first.reasons == ("",) * 50 + ("rate", "rate") and first.rate_until == T0 + 10
    assert ask(10, 1, 1).reasons == ("", "rate")
    costly = ask(1_000, 80, 1)  # full again (50): the 80 goes, the bucket owes 30
    assert costly.reasons == ("", "rate") and costly.rate_until == T0 + 1_000 + 310
    assert ask(1_309, 1).reasons == ("rate",)
    assert ask(1_310, 1).reasons == ("",)
    order = ask(2_000, 60, 1)  # 50 held: the 60 goes first, the 1 waits its turn behind it
    assert order.reasons == ("", "rate")
    assert ask(3_000).rate_until is None  # no item asking: the bucket is full


def test_a_paused_group_keeps_its_items_in_line_and_a_resume_lets_them_go_in_order(
    valkey_url: str, prefix: str
) -> None:
    store = make_store(valkey_url, prefix)
    store.pause_group("k")
    ask = lambda *m: store.take_slots(  # noqa: E731
        {"k": SlotAsk(2, [(x, "abc".index(x)) for x in m])}, hold_ms=60_000, wait_ms=60_000
    )["k"]
    paused = ask("a", "b", "c")
    assert not isinstance(paused, Exception)
    assert paused.places == (0, 1, 2) and paused.reasons == ("paused",) * 3 and paused.heads == ()
    store.resume_group("k")
    resumed = ask("c", "b")  # "a" is deferred: the free slot it heads the line for stays its own
    assert not isinstance(resumed, Exception) and resumed.places == (1, -1) and resumed.heads == ("a",)


# -- real `delayq forward` processes: a policy holds at every forwarder ---------------------------


class Arrivals:
    """The items two real `delayq forward` processes deliver to a Redis list, with the time each
    arrived (read by a thread of this test: BLPOP, so within a ms of its RPUSH)."""

    def __init__(self, url: str, prefix: str, procs: Launcher, tmp: Path) -> None:
        self.url, self.prefix, self.out = url, prefix, f"{prefix}-out"
        self.store = make_store(url, prefix, shards=4)
        self.store.check_meta()
        self.logs = [tmp / f"forwarder-{i}.log" for i in range(2)]
        self.procs = procs
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        client = redis.Redis.from_url(self.url)
        while not self._stop.is_set():
            popped = client.blpop([self.out], timeout=0.2)
            if popped is not None:
                self.seen[popped[1].decode()] = time.time()

    def schedule(self, group: str, n: int, *, first: float, step: float = 0.0) -> list[str]:
        """``n`` items of ``group``, the i-th due at ``first + i * step`` (epoch seconds)."""
        ids = [f"{group}-{i:04d}" for i in range(n)]
        self.store.schedule_many(
            (
                item,
                first + i * step,
                with_slot(RedisListTarget.envelope(self.out, item.encode()), Slot(group)).encode(),
            )
            for i, item in enumerate(ids)
        )
        return ids

    def start(self, *extra: str, env: dict[str, str] | None = None) -> None:
        for log in self.logs:
            args = ["forward", "--url", self.url, "--prefix", self.prefix, "--shards", "4", "--poll", "0.05"]
            self.procs.delayq(*args, "--log-level", "info", "--log-every", "1", *extra, log=log, env=env)

    def of(self, group: str) -> dict[str, float]:
        return {i: t for i, t in list(self.seen.items()) if i.startswith(f"{group}-")}

    def forwarded(self) -> list[int]:
        """What each forwarder says it forwarded, at its last summary."""
        counts = [re.findall(r"forwarded (\d+),", log.read_text(errors="replace")) for log in self.logs]
        return [int(found[-1]) if found else 0 for found in counts]

    def close(self) -> None:
        self._stop.set()
        self._reader.join(2)


@pytest.fixture
def arrivals(valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path) -> Iterator[Arrivals]:
    found = Arrivals(valkey_url, prefix, procs, tmp_path)
    yield found
    found.close()


@pytest.mark.alone  # a rate within 2 %: a busy core skews it
def test_a_rate_holds_within_2_percent_across_two_forwarders(arrivals: Arrivals) -> None:
    """1,000 items of a group at 100/s, all due now, released by two forwarders together: the
    releases after the first burst come at 100/s within 2 %, and both forwarders released."""
    arrivals.store.set_group("r", rate="100/s")
    ids = arrivals.schedule("r", 1_000, first=time.time() - 1)
    arrivals.start()
    wait_for(lambda: len(arrivals.of("r")) == len(ids), 30, lambda: f"{len(arrivals.of('r'))} arrived")
    times = sorted(arrivals.of("r").values())
    steady = times[100:-50]  # past the bucket's first 50 (0.5 s worth) and the forwarders' start
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    assert 98 <= rate <= 102, f"{rate:.2f}/s"
    wait_for(lambda: all(n > 0 for n in arrivals.forwarded()), 5, lambda: f"forwarded {arrivals.forwarded()}")


def test_a_throttle_and_a_pause_stop_a_group_at_every_forwarder_within_100_ms(arrivals: Arrivals) -> None:
    """Items of two groups due every 20 ms; group s throttled for 1 s, later paused and resumed:
    none of its items arrives from 100 ms after the throttle (or the pause) until it ends, group
    q's keep arriving, and every item arrives once."""
    arrivals.start()
    arrivals.schedule("warm", 1, first=time.time())
    wait_for(lambda: len(arrivals.seen) == 1, 30, "the forwarders to start")
    start = time.time() + 0.5
    s = arrivals.schedule("s", 250, first=start, step=0.02)
    q = arrivals.schedule("q", 250, first=start, step=0.02)
    wait_until(start + 1)
    throttled = time.time()
    until = arrivals.store.throttle_group("s", 1.0) / 1000
    wait_until(start + 3)
    paused = time.time()
    arrivals.store.pause_group("s")
    wait_until(start + 4)
    resumed = time.time()
    arrivals.store.resume_group("s")
    wait_for(lambda: len(arrivals.seen) == 501, 20, lambda: f"{len(arrivals.seen)} arrived")
    assert set(arrivals.of("s")) == set(s) and set(arrivals.of("q")) == set(q)
    s_times = list(arrivals.of("s").values())
    for stopped, ended in ((throttled, until), (paused, resumed)):
        inside = [t - stopped for t in s_times if stopped + 0.1 <= t < ended]
        assert inside == [], f"{len(inside)} items of s arrived while it was stopped (first at +{min(inside):.3f} s)"
        assert sum(stopped + 0.1 <= t < ended for t in arrivals.of("q").values()) >= 20, "q kept flowing"
    assert min(t for t in s_times if t >= resumed) - resumed < 1.2, "a resume is seen within a second"


def wait_until(epoch: float) -> None:
    time.sleep(max(0.0, epoch - time.time()))


# -- the roles' credentials ----------------------------------------------------------------------


def test_only_an_operator_sets_a_policy_and_a_worker_throttles_only_with_its_holds_token(
    admin: Admin,  # noqa: F811 (the imported fixture)
    prefix: str,
) -> None:
    """A producer or worker credential can neither set a group's policy (the API or raw writes
    to the policy and bucket) nor throttle a group without the token of a hold it was given; a
    worker's throttle with its token stops the group; the operator sets, pauses, resumes and
    throttles; the reader reads."""
    admin.install_functions()
    operator, forwarder, producer, worker, reader = (
        open_store(user_url(admin, prefix, role), prefix)
        for role in ("operator", "forwarder", "producer", "worker", "reader")
    )
    forwarder.check_meta()
    operator.set_slot_limit("g", 3)  # the limit string removed too: DEL on that key alone
    operator.set_group("g", limit=4, rate="1000/s", weight=2)
    for store in (producer, worker, reader):
        for write in (
            lambda s: s.set_group("g", limit=100),
            lambda s: s.pause_group("g"),
            lambda s: s.throttle_group("g", 60),
            lambda s: s.client.hset(layout.group_policy_key(prefix, "g"), "paused", "x"),
            lambda s: s.client.hset(layout.group_bucket_key(prefix, "g"), "tokens", "-1e9"),
            lambda s: s.client.delete(layout.slot_limit_key(prefix, "g")),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                write(store)
    assert reader.group_policy("g") == GroupPolicy(limit=4, rate="1000/s", weight=2.0)
    take = lambda m: forwarder.take_slots({"g": SlotAsk(0, [(m, 0)])}, hold_ms=60_000, wait_ms=60_000)["g"]  # noqa: E731
    held = take("a")
    assert not isinstance(held, Exception) and held.places == (-1,)
    worker.hold_slots({"g": [SlotRun("a", "not-its-token"), SlotRun("other", "")]}, "throttle", hold_ms=60_000)
    ignored = take("b")
    assert not isinstance(ignored, Exception) and ignored.places == (-1,) and ignored.throttled_until is None
    assert "reports without their hold's token=2" in ignored.reset  # a wrong token, and none
    tokenless = forwarder.take_slots({"g": SlotAsk(0, [("p", 0)])}, hold_ms=60_000, wait_ms=60_000, mode="skip")["g"]
    assert not isinstance(tokenless, Exception) and tokenless.places == (-1,)  # a periodic run's tokenless hold
    worker.hold_slots({"g": [SlotRun("p", "")]}, "throttle", hold_ms=60_000)
    still = take("b2")
    assert not isinstance(still, Exception) and still.throttled_until is None, "a tokenless throttle never counts"
    assert "reports without their hold's token=1" in still.reset
    worker.hold_slots({"g": [SlotRun("a", held.tokens[0])]}, "throttle", hold_ms=60_000)
    stopped = take("c")
    assert not isinstance(stopped, Exception) and stopped.reasons == ("throttled",)
    assert reader.group_policy("g").throttled_by == "worker:a"
    operator.resume_group("g")
    operator.pause_group("g")
    assert not isinstance(paused := take("c"), Exception) and paused.reasons == ("paused",)
    operator.resume_group("g")
    assert not isinstance(again := take("c"), Exception) and again.places == (0,)  # at its limit: 4 held


# -- policies by pattern -------------------------------------------------------------------------


def test_patterns_from_forward_options_and_the_environment_apply_at_every_forwarder(arrivals: Arrivals) -> None:
    """``--group-policy 'p-*={"limit": 1}'`` and ``DELAYQ_GROUP_POLICIES`` (after the options):
    no worker ends a hold, so one item of p-1 goes; q-1's go at 5/s (the environment's rate);
    r-1's limit is the option's 2 (the first pattern that sets a value), not the environment's 50."""
    env = {**os.environ, GROUP_POLICIES_ENV: json.dumps({"q-*": {"rate": "5/s"}, "*": {"limit": 50, "rate": "10/s"}})}
    now = time.time() - 1
    p, q = arrivals.schedule("p-1", 5, first=now), arrivals.schedule("q-1", 15, first=now)
    r = arrivals.schedule("r-1", 3, first=now)
    arrivals.start("--group-policy", 'p-*={"limit": 1}', "--group-policy", 'r-*={"limit": 2}', env=env)
    wait_for(lambda: len(arrivals.of("q-1")) == len(q), 10, lambda: f"{len(arrivals.of('q-1'))} of q-1 arrived")
    times = sorted(arrivals.of("q-1").values())[3:]  # past the bucket's first 3 (0.5 s worth)
    assert 4.5 <= (len(times) - 1) / (times[-1] - times[0]) <= 5.5
    assert len(arrivals.of("p-1")) == 1 and len(arrivals.of("r-1")) == 2
    assert p and r and arrivals.store.slot_status("r-1").running == 2


def test_group_policies_from_settings_say_what_is_wrong(valkey_url: str) -> None:
    app = Celery("policies")
    app.conf.update(delayq_url=valkey_url, delayq_group_policies={"tenant-*": {"limit": 2}, "*": {"weight": 3}})
    policies = CelerySettings.of(app).config.group_policies
    assert policies.of("tenant-7") == GroupPolicy(limit=2, weight=3.0) and policies.of("x") == GroupPolicy(weight=3.0)
    for bad, says in (
        ({"t-*": {"limit": 0}}, "delayq_group_policies: group policy group 't-*': limit=0"),
        ({"t-*": {"paused": True}}, "use an object of limit, rate, weight"),
        (["t-*"], "use an object of pattern -> policy"),
        ({"": {"limit": 1}}, "pattern '': use a non-empty glob"),
    ):
        app.conf.delayq_group_policies = bad
        with pytest.raises(ConfigError, match=re.escape(says)):
            CelerySettings.of(app)
    with pytest.raises(ConfigError, match="DELAYQ_GROUP_POLICIES: not JSON"):
        GroupPolicies.from_env({GROUP_POLICIES_ENV: "{tenant: 1}"})
    assert GroupPolicies.from_env({GROUP_POLICIES_ENV: " "}) == GroupPolicies()
    with pytest.raises(ConfigError, match="--group-policy 'x': use PATTERN=JSON"):
        GroupPolicies.from_specs(["x"])
    refused = CliRunner().invoke(main, ["forward", "--url", valkey_url, "--group-policy", 'a={"rate": "fast"}'])
    assert refused.exit_code == 2 and "rate='fast': use 'N/s'" in refused.output


def test_a_periodic_runs_overlap_modes_obey_the_policy_too(valkey_url: str, prefix: str) -> None:
    """A run's "skip" is skipped while its group is paused or over its rate; "buffer" keeps the
    one place in line it is allowed instead."""
    store = make_store(valkey_url, prefix)
    run = lambda member, mode, at: store.take_slots(  # noqa: E731
        {"e": SlotAsk(1, [(member, 0)])}, hold_ms=60_000, wait_ms=60_000, mode=mode, now=T0 + at
    )["e"]
    store.pause_group("e")
    for mode, place in (("skip", -2), ("buffer", 0)):
        grant = run("r1", mode, 0)
        assert not isinstance(grant, Exception) and (grant.places, grant.reasons) == ((place,), ("paused",))
    store.resume_group("e")
    store.take_slots({"e": SlotAsk(1, [("r1", 0)])}, hold_ms=60_000, wait_ms=60_000, mode="leave")
    store.set_group("e", limit=5, rate="1/m")
    assert not isinstance(first := run("r2", "skip", 0), Exception) and first.places == (-1,)
    over = run("r3", "skip", 1_000)
    assert not isinstance(over, Exception) and (over.places, over.reasons) == ((-2,), ("rate",))
    assert over.rate_until == T0 + 60_000
