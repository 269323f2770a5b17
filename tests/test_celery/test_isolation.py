"""One Celery message the broker's client cannot encode fails alone (issue 21, finding 3).

A header amqp cannot put in a frame (an integer past 64 bits) made ``struct.error`` escape the
publish: the whole call was retried, then dead-lettered. On RabbitMQ for real; the Redis
transport encodes such a header in JSON, so it has no such item.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery

from delayq_backends import DelayStore
from delayq_backends.celery import CeleryTarget, forget_store, install, store_for
from delayq_backends.forwarder import Forwarder
from tests.helpers import PAST


@pytest.fixture
def app(rabbitmq_url: str, valkey_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery("iso", broker=rabbitmq_url, set_as_current=False)
    app.conf.update(
        delayq_url=valkey_url, delayq_prefix=prefix, delayq_shards=2, task_default_queue=f"dqt-iso-{uuid.uuid4().hex}"
    )
    install(app)
    with app.connection_for_write() as conn:
        queue = app.amqp.queues[app.conf.task_default_queue].bind(conn.default_channel)
        queue.declare()
        try:
            yield app
        finally:
            queue.delete()
            forget_store(app)


def waiting_in_broker(app: Celery) -> int:
    with app.connection_for_write() as conn:
        return int(conn.default_channel.queue_declare(app.conf.task_default_queue, passive=True).message_count)


def test_a_message_amqp_cannot_encode_fails_alone(app: Celery) -> None:
    store: DelayStore = store_for(app)
    good = [app.send_task("t.good", args=[i], countdown=60).id for i in range(30)]
    bad = app.send_task("t.bad", countdown=60, headers={"huge": 2**70}).id
    for task_id in [*good, bad]:  # all due before the claim, so one call holds them all
        assert store.reschedule(task_id, PAST)
    forwarder = Forwarder(store, [CeleryTarget.from_url(app.conf.broker_url)], batch=100)

    forwarder.run_until_idle()
    assert waiting_in_broker(app) == 30, "the rest of the call was published"
    assert all(store.get(i) is None for i in good)
    item = store.get(bad)
    assert item is not None and item.attempts == 1, "retried alone, with its reason"
    assert forwarder.stats.retried == 1 and forwarder.stats.dead == 0
