"""The Celery path end to end with the delay store on a 3-master Redis Cluster: a real worker,
a real forwarder, shards spread over every master."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from delayq_backends.celery import forget_store, reschedule, store_for
from delayq_backends.celery.message import parse_time
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, new_env, running

pytestmark = pytest.mark.cluster


@pytest.fixture
def clustered(
    redis_cluster: EmbeddedCluster, valkey_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryEnv]:
    env = new_env("redis", f"{valkey_server.url.rsplit('/', 1)[0]}/1", valkey_server)
    env.store = redis_cluster.url  # the delay store on the cluster; broker and records stay put
    env.prefix = f"dqc{uuid.uuid4().hex[:6]}"
    with running(env, tmp_path_factory.mktemp("celery-cluster")):
        yield env


def test_delayed_tasks_through_a_clustered_store(clustered: CeleryEnv) -> None:
    app = clustered.app()
    try:
        store = store_for(app)
        assert store.cluster
        owners = Counter(store.client.get_node_from_key(store.keys(k).due).name for k in range(store.shards))
        shares = sorted(owners.values())
        assert len(shares) == 3 and shares[-1] - shares[0] <= 1, f"{store.shards} shards, evenly on 3 masters: {owners}"

        tag = uuid.uuid4().hex[:6]
        sent = {app.send_task("dqt.record", args=[tag, i], countdown=1 + i / 100).id for i in range(200)}
        doomed = app.send_task("dqt.record", args=[tag, "doomed"], countdown=2)
        moved = app.send_task("dqt.record", args=[tag, "moved"], countdown=3600)
        doomed.revoke()
        new_eta = datetime.now(timezone.utc) + timedelta(seconds=2)
        assert reschedule(app, moved.id, new_eta)
        expected = sent | {moved.id}
        wait_for(lambda: {r["id"] for r in clustered.records()} >= expected, 60, lambda: clustered.tail())
        runs = Counter(r["id"] for r in clustered.records() if r["tag"] == tag)
        assert set(runs) == expected and max(runs.values()) == 1
        for r in clustered.records():
            eta = parse_time(r["eta"])
            assert eta is not None and r["started_ms"] >= eta.timestamp() * 1000 - 1
    finally:
        forget_store(app)
