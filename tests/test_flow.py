"""Flow control: back-pressure on full broker queues and rate caps shared by forwarders.

Real servers and processes: RabbitMQ with a real Celery worker, RQ's Redis lists with a real
`rq worker`, and `delayq forward` processes started with `--max-queue-depth` / `--rate`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner
from kombu.connection import Connection

from delayq_backends import ConfigError, DelayStore
from delayq_backends.celery import CelerySettings
from delayq_backends.celery.target import CeleryTarget
from delayq_backends.cli.forward import ForwardOptions, forward_options
from delayq_backends.flow import FlowControl
from delayq_backends.forwarder import Forwarder
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.rq import Queue
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget, TestingForwarder, testing_store
from tests.harness import Launcher, make_store
from tests.harness.fleet import Forwarders
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, delete_queue, new_env
from tests.test_forwarder_processes import delivered
from tests.test_rq.jobs import runs_key


def scheduled(store: DelayStore) -> int:
    return sum(s.scheduled for s in store.stats())


def earliest(store: DelayStore) -> int:
    return min(h for h in store.heads() if h is not None)


def held_back_past(store: DelayStore, since_ms: int, what: str) -> None:
    """Wait until every item still scheduled waits past ``since_ms + 1 s``: the forwarder has looked
    at the full queue again (at least one recheck) after ``since_ms`` and held them back once more."""
    wait_for(lambda: earliest(store) > since_ms + 1000, 20, what)


# -- settings ---------------------------------------------------------------------------------


def test_specs_parse_with_units_and_bad_values_say_what_to_write() -> None:
    flow = FlowControl.from_specs(["a=100", "b=7", "a=50"], ["a=500/s", "b=30/m", "c=3600/h", "d=2.5"])
    assert flow.max_depth == {"a": 50, "b": 7}
    assert flow.rates == {"a": 500, "b": 0.5, "c": 1, "d": 2.5}
    for depths, rates, message in [
        (["a"], [], "use QUEUE=VALUE"),
        (["a=0"], [], "whole number of messages >= 1"),
        (["a=1.5"], [], "whole number"),
        ([], ["a=fast"], "use N/s, N/m or N/h"),
        ([], ["a=5/d"], "N/s, N/m or N/h"),
        ([], ["a=-1/s"], "N > 0"),
        ([], ["=5/s"], "QUEUE=VALUE"),
    ]:
        with pytest.raises(ConfigError, match=message):
            FlowControl.from_specs(depths, rates)
    with pytest.raises(ConfigError, match="recheck"):
        FlowControl(recheck=10, max_recheck=1)


def test_cli_options_repeat_take_env_vars_and_refuse_bad_values() -> None:
    @click.command()
    @forward_options
    def show(run: ForwardOptions) -> None:
        click.echo(json.dumps([run.given["flow"]["max_depth"], run.given["flow"]["rates"]]))

    result = CliRunner().invoke(show, ["--max-queue-depth", "a=100", "--max-queue-depth", "b=5", "--rate", "a=500/s"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [{"a": 100, "b": 5}, {"a": 500.0}]
    env = {"DELAYQ_MAX_QUEUE_DEPTH": "x=1 y=2", "DELAYQ_RATE": "x=60/m"}
    result = CliRunner().invoke(show, [], env=env)
    assert json.loads(result.output) == [{"x": 1, "y": 2}, {"x": 1.0}]
    result = CliRunner().invoke(show, ["--rate", "a=lots"])
    assert result.exit_code == 2 and "rate of 'a' is 'lots'" in result.output


def test_celery_settings_are_read_checked_and_overridden_by_options(valkey_url: str) -> None:
    from celery import Celery

    app = Celery("flow-settings")
    base = valkey_url.rsplit("/", 1)[0]
    app.conf.update(broker_url=f"{base}/1", delayq_url=valkey_url)
    app.conf.delayq_max_queue_depth = {"celery": 10_000, "slow": 50}
    app.conf.delayq_rate_limits = {"celery": "500/s", "slow": 2}
    flow = CelerySettings.of(app).forwarder.flow
    assert (flow.max_depth, flow.rates) == ({"celery": 10_000, "slow": 50}, {"celery": 500, "slow": 2})
    merged = flow.merged(FlowControl.from_specs(["slow=5"], ["celery=100/s"]))
    assert (merged.max_depth, merged.rates) == ({"celery": 10_000, "slow": 5}, {"celery": 100, "slow": 2})
    app.conf.delayq_rate_limits = {"celery": "500 per second"}
    with pytest.raises(ConfigError, match="delayq_rate_limits.*'celery' is '500 per second'"):
        CelerySettings.of(app)
    app.conf.delayq_rate_limits = ["celery=5/s"]
    with pytest.raises(ConfigError, match="use a dict"):
        CelerySettings.of(app)


def test_celery_forward_command_merges_app_settings_and_options(
    valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import Celery

    from delayq_backends.cli import celery as command

    app = Celery("flow-command")
    app.conf.update(broker_url=f"{valkey_url.rsplit('/', 1)[0]}/1", delayq_url=valkey_url, delayq_shards=4)
    app.conf.update(delayq_prefix=f"cmd{int(time.time() * 1000)}", delayq_rate_limits={"a": "10/s", "b": "20/s"})
    seen: list[FlowControl] = []
    monkeypatch.setattr(command, "run_forwarder", lambda settings, **_: seen.append(settings.forwarder.flow))
    result = CliRunner().invoke(
        command.forward, ["--rate", "b=5/s", "--max-queue-depth", "a=9"], obj=SimpleNamespace(app=app)
    )
    assert result.exit_code == 0, result.output
    assert (seen[0].max_depth, seen[0].rates) == ({"a": 9}, {"a": 10, "b": 5})


# -- in process: the deliver path ---------------------------------------------------------------


def list_items(key: str, n: int, tag: str = "x") -> list[tuple[str, float, Any]]:
    now = time.time()
    return [(f"{tag}-{i}", now - 1 + i / 1e6, RedisListTarget.envelope(key, tag.encode())) for i in range(n)]


def test_full_queue_pauses_others_flow_and_lateness_counts_the_wait(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    full, other = f"{{{prefix}}}:full", f"{{{prefix}}}:other"
    scheduled_at = store.server_time_ms()
    store.schedule_many(list_items(full, 250, "f") + list_items(other, 60, "o"))
    flow = FlowControl(max_depth={full: 100}, recheck=0.2, max_recheck=0.4, probe_ttl=0.05)
    metrics = ForwarderMetrics()
    forwarder = Forwarder(store, [RedisListTarget(store.client)], batch=50, flow=flow, metrics=metrics)  # type: ignore[arg-type]
    backpressure = lambda: metrics.registry.get_sample_value("delayq_backpressure", {"target": "list", "queue": full})  # noqa: E731
    forwarder.run_once()
    assert (store.client.llen(full), store.client.llen(other), scheduled(store)) == (100, 60, 150)
    assert forwarder.flow.state == {full: True} and backpressure() == 1
    assert forwarder.stats.deferred >= 150 and forwarder.stats.retried == 0
    deferred = metrics.registry.get_sample_value("delayq_deferred_total", {"target": "list", "queue": full})
    assert deferred == forwarder.stats.deferred
    assert all(item.attempts == 0 for item in store.scan())  # held back, no attempt counted
    started = store.server_time_ms()
    taken = [store.client.llen(full)]
    store.client.delete(full)

    def work() -> bool:  # a worker that takes everything between two passes of the forwarder
        forwarder.run_once()
        taken.append(store.client.llen(full))
        assert taken[-1] <= 100, "over the ceiling"
        store.client.delete(full)
        return scheduled(store) == 0

    wait_for(work, 10, "the paused queue to drain")
    assert sum(taken) == 250 and forwarder.flow.state == {full: False} and backpressure() == 0
    # published after `started`, ready about 1 s before scheduled_at: the hold counts as lateness
    assert max(forwarder.stats.lateness_ms) >= started - (scheduled_at - 1000)
    assert forwarder.stats.dead == 0 and store.dead_letters() == []


class BrokenProbe(RedisListTarget):
    def queue_depth(self, queue: str) -> int:
        raise redis.ConnectionError("probe refused")


def test_a_failing_probe_lets_items_flow(valkey_url: str, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    key = f"{{{prefix}}}:q"
    store.schedule_many(list_items(key, 30))
    forwarder = Forwarder(store, [BrokenProbe(store.client)], flow=FlowControl(max_depth={key: 1}))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="delayq.flow"):
        assert forwarder.run_once() == 30
    assert store.client.llen(key) == 30 and forwarder.flow.state == {key: False}
    assert "cannot read the depth" in caplog.text and "probe refused" in caplog.text


@pytest.mark.alone  # a rate measured in ms: a busy core stretches the pass
def test_rate_cap_sends_a_burst_then_books_the_rest_at_the_rate(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=4)
    capped, free = f"{{{prefix}}}:capped", f"{{{prefix}}}:free"
    store.schedule_many(list_items(capped, 100, "c") + list_items(free, 100, "f"))
    target = RedisListTarget(store.client)  # type: ignore[arg-type]
    forwarder = Forwarder(store, [target], batch=500, flow=FlowControl(rates={capped: 50}))
    forwarder.run_once()
    assert store.client.llen(free) == 100
    sent = store.client.llen(capped)
    assert 5 <= sent <= 7  # a burst of 0.1 s worth, and a token or two refilled during the pass
    held = sorted(item.leased_until_ms or 0 for item in store.scan())  # deferred: "held until"
    assert len(held) == 100 - sent
    span = held[-1] - held[0]
    assert abs(span - len(held) / 50 * 1000) <= 150, f"{len(held)} slots over {span} ms, not at 50/s"


def test_on_a_fake_clock_a_capped_backlog_goes_at_the_rate_and_is_claimed_once_per_slot() -> None:
    store = testing_store(shards=4)
    store.schedule_many((f"i{n}", store.clock() / 1000, RedisListTarget.envelope("q", b"x")) for n in range(100))
    inbox = CollectingTarget("list")
    forwarder = TestingForwarder(store, [inbox], flow=FlowControl(rates={"q": 10}))
    forwarder.run_once()
    assert len(inbox.ids) == 1 and forwarder.stats.deferred == 99  # a burst of 1, 99 slots booked
    for tick in range(1, 51):  # a forwarder wakes at each slot (a 100 ms grid at 10/s)
        store.clock.advance(0.1)
        forwarder.run_once()
        assert abs(len(inbox.ids) - (1 + tick)) <= 1, (tick, len(inbox.ids))
    # each held item was claimed about once more, at its slot: not on every pass
    assert forwarder.stats.deferred <= 99 + 10
    assert sorted(inbox.ids) == sorted(set(inbox.ids))


def test_the_forwarder_acl_role_may_defer_and_take_tokens(valkey_server: Any, prefix: str) -> None:
    from tests.test_security import Admin, user_url

    admin = Admin(redis.Redis.from_url(valkey_server.url), valkey_server.url, valkey_server.port)
    admin.install_functions()  # the role may call our functions only
    try:
        admin_store = make_store(valkey_server.url, prefix, shards=4)
        admin_store.schedule_many(list_items("out", 20))
        store = make_store(user_url(admin, prefix, "forwarder"), prefix, shards=4)
        forwarder = Forwarder(store, [CollectingTarget("list")], flow=FlowControl(rates={"out": 10}))
        assert forwarder.run_once() == 20  # burst of 1 sent, 19 deferred (a token may refill meanwhile)
        assert forwarder.stats.forwarded + forwarder.stats.deferred == 20 and forwarder.stats.deferred >= 18
        assert scheduled(admin_store) == forwarder.stats.deferred
    finally:
        admin.clean_up()


# -- broker depth probes --------------------------------------------------------------------------


def test_celery_probe_on_redis_counts_priority_sublists_and_missing_queue_is_0(valkey_url: str, prefix: str) -> None:
    broker = f"{valkey_url.rsplit('/', 1)[0]}/1"
    queue = f"{prefix}-q"
    lists = redis.Redis.from_url(broker)
    with Connection(broker) as conn:
        producer = conn.Producer()
        for priority in (0, 0, 5, 9):  # kombu keeps priorities > 0 on lists of their own
            producer.publish({"n": priority}, routing_key=queue, priority=priority)
    assert len(list(lists.scan_iter(match=f"{queue}*"))) == 3
    target = CeleryTarget.from_url(broker)
    try:
        assert target.queue_depth(queue) == 4
        assert target.queue_depth(f"{prefix}-missing") == 0
        assert target.queue_depth(queue) == 4
    finally:
        target.close()
        lists.delete(*lists.scan_iter(match=f"{queue}*"))


def test_celery_probe_on_rabbitmq_is_a_passive_declare(rabbitmq_url: str, prefix: str) -> None:
    queue = f"{prefix}-probe"
    target = CeleryTarget.from_url(rabbitmq_url)
    try:
        assert target.queue_depth(queue) == 0  # NOT_FOUND closes the channel; the probe reopens one
        with Connection(rabbitmq_url) as conn:
            simple = conn.SimpleQueue(queue)
            simple.put({"a": 1})
            simple.put({"a": 2})
            simple.close()
        wait_for(lambda: target.queue_depth(queue) == 2, 5, "RabbitMQ to count 2 messages")
    finally:
        target.close()
        with Connection(rabbitmq_url) as conn:
            conn.default_channel.queue_delete(queue)


# -- real processes -----------------------------------------------------------------------------


def test_rq_queue_at_its_ceiling_waits_in_the_store_other_queue_flows_then_drains(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    conn = redis.Redis.from_url(valkey_url)
    store = DelayStore(conn, make_store(valkey_url, prefix, shards=4).config)
    capped, other = (
        Queue(f"{prefix}-capped", connection=conn, delay_store=store),
        Queue(f"{prefix}-other", connection=conn, delay_store=store),
    )
    for queue, n in ((capped, 300), (other, 50)):
        for i in range(n):
            queue.enqueue_in(timedelta(milliseconds=200), "tests.test_rq.jobs.record", i)
    fleet = Forwarders(
        procs, valkey_url, prefix, 4, "--rq-redis", valkey_url, "--max-queue-depth", f"{capped.name}=100"
    )
    fleet.start()
    wait_for(
        lambda: (capped.count, other.count, scheduled(store)) == (100, 50, 200),
        20,
        lambda: f"100 capped + 50 other queued, 200 held: {capped.count}, {other.count}, {scheduled(store)}",
    )
    held_back_past(store, store.server_time_ms(), "a recheck of the full queue")
    assert (capped.count, scheduled(store)) == (100, 200), "the ceiling held"
    worker = ["-m", "rq.cli", "worker", "-u", valkey_url, "--queue-class", "delayq_backends.rq.Queue"]
    procs.python(*worker, capped.name, other.name, log=tmp_path / "worker.log")
    wait_for(
        lambda: conn.llen(runs_key(capped.name)) == 300 and conn.llen(runs_key(other.name)) == 50, 60, "all jobs run"
    )
    tags = sorted(json.loads(r)["tag"] for r in conn.lrange(runs_key(capped.name), 0, -1))
    assert tags == list(range(300)), "each capped job ran exactly once"
    assert scheduled(store) == 0 and store.dead_letters() == []
    assert fleet.procs[0].poll() is None


def test_rabbitmq_queue_stops_at_its_ceiling_until_a_worker_drains_it(
    rabbitmq_url: str, valkey_server: Any, tmp_path: Path
) -> None:
    env: CeleryEnv = new_env("rabbitmq", rabbitmq_url, valkey_server)
    app = env.app()
    store = make_store(env.store, env.prefix, shards=4)
    try:
        ids = [app.send_task("dqt.record", args=[f"t{i}"], countdown=0.3, queue=env.queue).id for i in range(300)]
        assert scheduled(store) == 300
        forward = [sys.executable, "-m", "delayq_backends.cli", "forward", "--url", env.store, "--prefix", env.prefix]
        forward += ["--shards", "4", "--celery-broker", rabbitmq_url, "--max-queue-depth", f"{env.queue}=100"]
        env.start(forward + ["--poll", "0.5", "--log-every", "2"], "forwarder", tmp_path)
        probe = CeleryTarget.from_url(rabbitmq_url)
        wait_for(
            lambda: probe.queue_depth(env.queue) == 100 and scheduled(store) == 200,
            20,
            lambda: f"100 in RabbitMQ, 200 held: {probe.queue_depth(env.queue)}, {scheduled(store)}\n{env.tail()}",
        )
        held_back_past(store, store.server_time_ms(), "a recheck of the full queue")
        assert (probe.queue_depth(env.queue), scheduled(store)) == (100, 200), "the ceiling held"
        probe.close()
        env.start_worker(tmp_path)
        wait_for(lambda: len(env.records()) >= 300, 60, lambda: f"300 tasks run, {len(env.records())}\n{env.tail()}")
        ran = [r["id"] for r in env.records()]
        assert sorted(ran) == sorted(ids), "every task ran exactly once"
        assert scheduled(store) == 0 and store.dead_letters() == []
    finally:
        env.stop()
        delete_queue(env)


@pytest.mark.alone  # a rate measured in ms: a busy core stretches the pass
def test_rate_cap_is_shared_by_two_forwarder_processes(valkey_url: str, prefix: str, procs: Launcher) -> None:
    store = make_store(valkey_url, prefix, shards=8)
    key = f"{{{prefix}}}:paced"
    fleet = Forwarders(procs, valkey_url, prefix, 8, "--rate", f"{key}=500/s")
    fleet.start()
    fleet.start()
    fleet.wait_up()
    now = store.server_time_ms()
    ids = [f"job-{i}" for i in range(2000)]
    due = (now + 500) / 1000  # time to schedule the 2000 items
    store.schedule_many((i, due, RedisListTarget.envelope(key, json.dumps({"id": i}).encode())) for i in ids)
    client = redis.Redis.from_url(valkey_url)
    wait_for(lambda: client.llen(key) > 0, 20, "the first item forwarded")
    first = time.monotonic()
    wait_for(lambda: client.llen(key) >= 2000, 30, lambda: f"2000 forwarded, {client.llen(key)}")
    took = time.monotonic() - first
    counts = delivered(client, key)
    assert set(counts) == set(ids) and max(counts.values()) == 1
    assert scheduled(store) == 0 and store.dead_letters() == []
    # a burst of 50 (0.1 s worth) goes at once; the other 1950 at 500/s take 3.9 s
    assert 3.6 <= took <= 6.0, f"2000 items at 500/s took {took:.2f} s"
    assert all(p.poll() is None for p in fleet.procs), "a forwarder died"
