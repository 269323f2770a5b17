"""A short chaos run on each broker: forwarders killed, the broker restarted (a Redis broker by
kill -9 with AOF, RabbitMQ with rabbitmqctl), the store restarted (AOF), network cut and slowed
between forwarders and broker and store, all while tasks fall due. Nothing may be lost."""

from __future__ import annotations

import pytest

from bench.lib.celery_run import CeleryRun
from bench.lib.chaos import ChaosPlan, _still_waiting, redis_task_ids, run_chaos
from delayq_backends.celery import forget_store
from delayq_backends.embedded import EmbeddedServer


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_nothing_is_lost_under_kills_restarts_and_cuts(broker: str, request: pytest.FixtureRequest) -> None:
    if broker == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")  # skips, or fails under DELAYQ_REQUIRE_RABBITMQ=1, when it is down
    plan = ChaosPlan(broker=broker)
    report = run_chaos(plan, log=print)
    print(f"chaos report: {report.as_dict()}")
    assert report.faults == plan.faults, "every planned fault happened"
    assert report.lost == report.lost_after_broker_accepted, f"delayq lost tasks: {report.lost_ids}"
    # kombu's Redis transport pops a message (BRPOP) before it records it as unacked, so a broker
    # killed between the two loses it: at most one per broker restart, never on RabbitMQ
    # (publisher confirms, durable queue, persistent messages)
    assert report.lost_after_broker_accepted <= (plan.faults["restart-broker"] if broker == "redis" else 0)
    assert report.waiting == 0 and report.executed + report.lost == report.scheduled == plan.tasks
    assert report.dead_letters == 0
    assert report.worker_restarts <= 1, "a Celery worker stalled more than once (see _settle)"
    # at-least-once: a killed forwarder's batch comes back after its lease; bounded by kills x batch
    assert report.duplicates <= plan.faults["kill-forwarder"] * 200 + plan.tasks // 10


def test_stragglers_are_found_in_the_store_and_the_broker(valkey_server: EmbeddedServer) -> None:
    """What a timed-out run counts as "still waiting", not lost: a task in the store, a message in
    the broker's queue; an id that is nowhere is lost."""
    env = CeleryRun.on("redis", f"{valkey_server.url.rsplit('/', 1)[0]}/1", valkey_server)
    app = env.app()
    try:
        in_store = app.send_task("dqb.record", args=["x"], countdown=3600).id
        in_broker = env.native_app().send_task("dqb.record", args=["y"]).id
        found = _still_waiting({in_store, in_broker, "ghost"}, app, redis_task_ids(env.broker, env.queue))
        assert found == {in_store, in_broker}
    finally:
        forget_store(app)
