"""Per-key rate caps at fire time: each rate key (a tenant) of a queue configured with
``--key-rate`` gets its own token bucket shared by every forwarder, with booked slots, so one
key's flood waits at its cap while the other keys' items go on time."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter

import click
import pytest
import redis
from click.testing import CliRunner

from delayq_backends import ConfigError, Envelope, InvalidRateKeyError
from delayq_backends.cli.forward import ForwardOptions, forward_options
from delayq_backends.envelope import RATE_KEY, rate_key_of, with_rate_key
from delayq_backends.flow import FlowControl
from delayq_backends.keys import key_rate_key
from delayq_backends.models import TokenGrant
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget, TestingForwarder, testing_store
from tests.harness import Launcher, make_store
from tests.harness.fleet import Forwarders
from tests.helpers import wait_for


def keyed(queue: str, key: str, body: bytes = b"x") -> Envelope:
    return with_rate_key(RedisListTarget.envelope(queue, body), key)


def test_settings_parse_from_options_env_and_celery(valkey_url: str) -> None:
    assert FlowControl.from_specs(key_rates=["q=20/s", "r=60/m"]).key_rates == {"q": 20, "r": 1}
    assert "q 20/s per key" in FlowControl(key_rates={"q": 20}).describe()

    @click.command()
    @forward_options
    def show(run: ForwardOptions) -> None:
        click.echo(json.dumps(run.given["flow"]["key_rates"]))

    assert json.loads(CliRunner().invoke(show, ["--key-rate", "q=5/s"]).output) == {"q": 5.0}
    assert json.loads(CliRunner().invoke(show, [], env={"DELAYQ_KEY_RATE": "a=1 b=2/s"}).output) == {"a": 1, "b": 2}
    bad = CliRunner().invoke(show, ["--key-rate", "q=lots"])
    assert bad.exit_code == 2 and "rate of 'q' is 'lots'" in bad.output

    from celery import Celery

    from delayq_backends.celery import CelerySettings

    app = Celery("key-rate-settings")
    app.conf.update(broker_url=f"{valkey_url.rsplit('/', 1)[0]}/1", delayq_url=valkey_url)
    app.conf.delayq_key_rate_limits = {"celery": "20/s"}
    assert CelerySettings.of(app).forwarder.flow.key_rates == {"celery": 20}
    app.conf.delayq_key_rate_limits = {"celery": "fast"}
    with pytest.raises(ConfigError, match="delayq_key_rate_limits.*'celery' is 'fast'"):
        CelerySettings.of(app)


def test_bad_rate_keys_are_refused_when_scheduling(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    for key in ("", 42, "x" * 201, "a\nb", b"k"):
        with pytest.raises(InvalidRateKeyError, match="pass printable text"):
            store.schedule("a", 1.0e9, RedisListTarget.envelope("q", b"x"), rate_key=key)  # type: ignore[arg-type]
    assert store.get("a") is None
    store.schedule("a", 1.0e9, RedisListTarget.envelope("q", b"x").encode(), rate_key="tenant-1")
    item = store.get("a")
    assert item is not None and rate_key_of(Envelope.decode(item.envelope)) == "tenant-1"


def test_on_a_fake_clock_a_flooding_key_waits_at_its_cap_the_other_goes_on_time() -> None:
    store = testing_store(shards=4)
    t0 = store.clock()
    store.schedule_many((f"a{n}", t0 / 1000, keyed("q", "A")) for n in range(200))
    # B: one item every 200 ms (5/s, under its cap), interleaved with A's flood
    store.schedule_many((f"b{n}", (t0 + 200 * n) / 1000, keyed("q", "B")) for n in range(20))
    store.schedule_many((f"free{n}", t0 / 1000, RedisListTarget.envelope("q", b"x")) for n in range(50))
    inbox = CollectingTarget("list")
    forwarder = TestingForwarder(store, [inbox], flow=FlowControl(key_rates={"q": 10}))
    sent_at: dict[str, int] = {}
    for _ in range(81):  # 4 s in 50 ms steps
        forwarder.run_once()
        for d in inbox.delivered:
            sent_at.setdefault(d.id, store.clock())
        store.clock.advance(0.05)
    late_b = [sent_at[f"b{n}"] - (t0 + 200 * n) for n in range(20)]
    assert max(late_b) <= 100, late_b  # B on time, to the slot grid (100 ms at 10/s)
    assert all(f"free{n}" in sent_at for n in range(50))  # no key: not held
    a_sent = sorted(sent_at[i] for i in sent_at if i.startswith("a"))
    assert 35 <= len(a_sent) <= 45, len(a_sent)  # 10/s for 4 s, plus a burst of 1
    assert sorted(inbox.ids) == sorted(set(inbox.ids))
    assert all(item.attempts == 0 for item in store.scan())  # held back, no attempt counted


def test_garbage_rate_keys_share_one_capped_bucket_and_never_stop_the_forwarder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = testing_store(shards=4)
    now = store.clock() / 1000
    for n, junk in enumerate([42, "", "x" * 500, {"a": 1}, "bad\nkey"]):
        store.schedule(f"junk{n}", now, Envelope("list", "q", b"x", {RATE_KEY: junk}))
    store.schedule("good", now, keyed("q", "tenant"))
    inbox = CollectingTarget("list")
    forwarder = TestingForwarder(store, [inbox], flow=FlowControl(key_rates={"q": 10}))
    with caplog.at_level(logging.WARNING, logger="delayq.flow"):
        forwarder.run_once()
    assert "good" in inbox.ids and sum(i.startswith("junk") for i in inbox.ids) == 1  # a burst of 1
    assert "carries an invalid rate key" in caplog.text
    for _ in range(12):
        store.clock.advance(0.1)
        forwarder.run_once()
    assert sorted(inbox.ids) == sorted(["good", *(f"junk{n}" for n in range(5))])
    assert store.dead_letters() == []


def test_buckets_of_idle_keys_expire(server_url: str, prefix: str) -> None:
    store = make_store(server_url, prefix, shards=4)
    taken = store.take_key_tokens("q", {f"tenant-{n}": 2 for n in range(50)}, rate=10, burst=1)
    assert all(isinstance(t, TokenGrant) and t.granted == 1 for t in taken.values())
    bucket = key_rate_key(prefix, "q", "tenant-7")
    # a booked slot (0.1 s), the refill (0.1 s) plus a second, then gone
    assert 0 < store.client.pttl(bucket) <= 1300


def test_a_failing_key_bucket_holds_its_items_back_and_the_others_go(
    valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    now = store.server_time_ms() / 1000 - 1
    store.schedule_many([("a1", now, keyed("q", "A")), ("b1", now, keyed("q", "B"))])
    take = store.take_key_tokens

    def failing_a(queue: str, wanted: dict[str, int], **kw: object) -> dict[str, TokenGrant | Exception]:
        taken = take(queue, wanted, **kw)  # type: ignore[arg-type]
        return {**taken, "A": redis.ResponseError("NOPERM this user has no permissions to access the key")}

    monkeypatch.setattr(store, "take_key_tokens", failing_a)
    inbox = CollectingTarget("list")
    forwarder = TestingForwarder(store, [inbox], flow=FlowControl(key_rates={"q": 10}))
    with caplog.at_level(logging.ERROR, logger="delayq.flow"):
        forwarder.run_once()
    assert inbox.ids == ["b1"] and "rate bucket of 'q' key 'A'" in caplog.text and "failed" in caplog.text
    item = store.get("a1")
    assert item is not None and item.attempts == 0 and item.leased_until_ms is not None  # deferred


# -- real forwarder processes -----------------------------------------------------------------


class Drain(threading.Thread):
    """A worker on a Redis list: pops everything, noting when each item arrived."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.key = key
        self.arrived: dict[str, list[float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            popped = self.client.lpop(self.key, 500) or []
            now = time.time()
            for raw in popped:
                self.arrived.setdefault(json.loads(raw)["id"], []).append(now)
            if not popped:
                time.sleep(0.005)


def test_two_tenants_one_flooding_the_other_stays_on_time_across_two_forwarders(
    valkey_url: str, prefix: str, procs: Launcher
) -> None:
    store = make_store(valkey_url, prefix, shards=8)
    queue = f"{{{prefix}}}:tenants"
    fleet = Forwarders(procs, valkey_url, prefix, 8, "--key-rate", f"{queue}=20/s")
    fleet.start()
    fleet.start()
    drain = Drain(valkey_url, queue)
    drain.start()
    fleet.wait_up()
    start = store.server_time_ms() / 1000 + 0.5  # time to schedule the 130 items

    def env(item_id: str, tenant: str) -> Envelope:
        return keyed(queue, tenant, json.dumps({"id": item_id}).encode())

    flood = [f"a{n}" for n in range(100)]
    store.schedule_many((i, start, env(i, "A")) for i in flood)
    calm = {f"b{n}": start + 0.1 * n for n in range(30)}  # 10/s: within B's cap of 20/s
    store.schedule_many((i, ready, env(i, "B")) for i, ready in calm.items())
    try:
        wait_for(lambda: len(drain.arrived) >= 130, 30, lambda: f"130 forwarded, {len(drain.arrived)}")
    finally:
        drain.stop.set()
        drain.join()
    counts = Counter({i: len(t) for i, t in drain.arrived.items()})
    assert set(counts) == {*flood, *calm} and max(counts.values()) == 1
    late = {i: drain.arrived[i][0] - ready for i, ready in calm.items()}
    assert max(late.values()) < 0.5, sorted(late.values())[-5:]
    flood_times = sorted(drain.arrived[i][0] for i in flood)
    span = flood_times[-1] - flood_times[0]
    assert span >= (100 - 2 - 2) / 20, f"A's 100 items took {span:.2f} s, faster than 20/s"
    assert all(p.poll() is None for p in fleet.procs), "a forwarder died"
    assert store.dead_letters() == []
