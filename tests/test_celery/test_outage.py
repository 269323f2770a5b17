"""The broker goes away while tasks fall due: nothing is lost or dead-lettered, all arrive after.

The forwarder reaches the broker through a loopback proxy the test cuts and restores; the worker
connects directly, so it keeps consuming what arrives.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from celery import Celery

from bench.lib.proxy import TcpProxy
from delayq_backends.celery import CeleryTarget, forget_store, store_for
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.forwarder import Forwarder
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, delete_queue, new_env, via


@pytest.fixture(params=BROKERS)
def outage_env(
    request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryEnv]:
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    try:
        env.start_worker(tmp_path_factory.mktemp("outage"))
        yield env
    finally:
        env.stop()
        delete_queue(env)


def test_broker_down_while_tasks_fall_due(outage_env: CeleryEnv) -> None:
    app: Celery = outage_env.app()
    upstream = urlsplit(outage_env.broker)
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5672)
    store = store_for(app)
    forwarder = Forwarder(store, [CeleryTarget.from_url(via(proxy, outage_env.broker))], max_outage_backoff=0.5)
    runner = threading.Thread(target=forwarder.run, kwargs={"install_signals": False}, daemon=True)
    tag = uuid.uuid4().hex[:6]
    try:
        ids = {app.send_task("dqt.record", args=[tag, i], countdown=1 + i / 100).id for i in range(300)}
        runner.start()
        wait_for(lambda: forwarder.stats.forwarded > 0, 20, "the first tasks to be forwarded")
        proxy.cut()
        wait_for(lambda: forwarder.stats.outages >= 3, 20, "the forwarder to meet the outage")
        assert forwarder.stats.released > 0 and forwarder.stats.dead == 0
        waiting = sum(s.scheduled for s in store.stats())
        assert waiting > 0, "some tasks fell due during the outage and wait in the store"
        proxy.restore()
        wait_for(
            lambda: len({r["id"] for r in outage_env.records() if r["tag"] == tag}) == len(ids),
            60,
            f"all tasks to run after the broker came back:\n{outage_env.tail()}",
        )
        # a message the broker took but whose confirm the cut lost was released: it runs, and
        # is sent again (at-least-once) once the store serves it again
        wait_for(lambda: sum(s.scheduled for s in store.stats()) == 0, 20, "the released tasks to be sent again")
        counts = Counter(r["id"] for r in outage_env.records() if r["tag"] == tag)
        assert set(counts) == ids
        assert forwarder.stats.dead == 0 and store.dead_letters() == []
        # at-least-once: a batch whose publish was uncertain when the link dropped is sent again
        assert sum(counts.values()) - len(ids) <= forwarder.stats.outages * forwarder.batch
    finally:
        forwarder.stop()
        runner.join(10)
        proxy.close()
        forget_store(app)
