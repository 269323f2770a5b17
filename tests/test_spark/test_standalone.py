"""The path users take when they outgrow one machine, on loopback: ``schedule_dataframe`` and the
audit run by a ``spark://`` driver on a standalone cluster (executors in their own JVMs), writing
into the 3-master Redis Cluster. Every row lands on the shard its id hashes to, on the master that
owns that shard's slot; a forwarder moves them all; the audit finds the run clean and finds the
anomalies planted in a copy of the forwarders' log.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq_backends.audit import JsonLinesAudit
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from tests.harness import make_store
from tests.helpers import wait_for
from tests.test_spark.standalone import SparkStandalone

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow]

N = 1_000
SHARDS = 6  # two per master: key layout 2 spreads a multiple of the masters exactly
ROOT = Path(__file__).resolve().parents[2]
#: Deadline of one driver request (the first starts the executors): about 30 s on a quiet 2-core
#: machine, minutes on one loaded 10x by other jobs.
TIMEOUT = 400


class Driver:
    """The driver process (``standalone_driver``) on the standalone cluster: one session for the
    whole test, one JSON reply per request."""

    def __init__(self, cluster: SparkStandalone, log: Path) -> None:
        self.cluster, self.log = cluster, log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.test_spark.standalone_driver", cluster.url],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
            )

    def ask(self, timeout: float, **request: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"no reply to {request['command']} in {timeout} s:\n{self.tail()}"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) + "\n" + self.cluster.logs()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def driver(spark_standalone: SparkStandalone, tmp_path: Path) -> Iterator[Driver]:
    started = Driver(spark_standalone, tmp_path / "driver.log")
    yield started
    started.close()


def per_master(cluster_client: Any, keys: list[str]) -> dict[str, list[int]]:
    """For each master: the ZCARD of each key whose slot it owns, asked with a plain client (no
    redirects): where the items physically are."""
    held: dict[str, list[int]] = defaultdict(list)
    for key in keys:
        node = cluster_client.get_node_from_key(key)
        with redis.Redis(host=node.host, port=node.port) as plain:
            held[f"{node.host}:{node.port}"].append(int(plain.zcard(key)))
    return dict(held)


def test_dataframe_to_cluster_and_audit_on_a_standalone_spark(
    spark_standalone: SparkStandalone,
    driver: Driver,
    redis_cluster: EmbeddedCluster,
    valkey_server: EmbeddedServer,
    tmp_path: Path,
) -> None:
    tag, prefix, list_key = f"sa-{uuid.uuid4().hex[:6]}", f"t{uuid.uuid4().hex[:12]}", f"out:{uuid.uuid4().hex[:8]}"
    store = make_store(redis_cluster.url, prefix, shards=SHARDS)
    snapshot = tmp_path / "snapshot.jsonl"
    ready_ms = store.server_time_ms()  # due at once: nothing moves them before the forwarder below
    ran = driver.ask(
        TIMEOUT, command="schedule", url=redis_cluster.url, prefix=prefix, shards=SHARDS, tag=tag, n=N,
        ready_ms=ready_ms, list_key=list_key, snapshot=str(snapshot),
    )  # fmt: skip
    assert (ran["added"], ran["rejected"], ran["master"]) == (N, 0, spark_standalone.url)
    jvms = ran["executor_jvms"]
    assert len(jvms) == 2 and all(is_executor for _, is_executor in jvms), f"tasks ran in {jvms}, not 2 executors"

    # every row on the shard its id hashes to, and each shard on the master that owns its slot
    ids = [f"{tag}-{i}" for i in range(N)]
    expected = Counter(store.shard_of(i) for i in ids)
    due_keys = [store.keys(k).due for k in range(SHARDS)]
    assert [store.client.zcard(key) for key in due_keys] == [expected[k] for k in range(SHARDS)]
    held = per_master(store.client, due_keys)
    assert sorted(len(shards) for shards in held.values()) == [2, 2, 2], f"6 shards spread 2/2/2: {held}"
    assert sum(map(sum, held.values())) == N, held
    assert {i.id: i.ready_ms for i in store.scan()} == {f"{tag}-{i}": ready_ms + i for i in range(N)}
    assert sorted(json.loads(line)["id"] for line in snapshot.read_text().splitlines()) == sorted(ids)

    # a forwarder moves them all, logging each forward
    out = redis.Redis.from_url(valkey_server.url)
    log = JsonLinesAudit(tmp_path / "forwarded", stem="forwarded", background=False)
    forwarder = Forwarder(store, [RedisListTarget(out)], batch=200, audit=log)
    wait_for(lambda: forwarder.run_once() == 0 and out.llen(list_key) >= N, 60, "the forwarder to move every item")
    log.close()
    assert out.llen(list_key) == N and [store.client.zcard(key) for key in due_keys] == [0] * SHARDS

    # a copy of the log with one forward lost and one repeated
    planted = tmp_path / "planted"
    planted.mkdir()
    lines = [line for f in sorted((tmp_path / "forwarded").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len(lines) == N
    (planted / "forwarded.jsonl").write_text("\n".join(lines[1:] + [lines[2]]) + "\n")
    lost, repeated = json.loads(lines[0])["id"], json.loads(lines[2])["id"]

    as_of = int(time.time() * 1000)
    forwarded = [str(tmp_path / "forwarded"), str(planted)]
    reports = driver.ask(TIMEOUT, command="audit", snapshot=str(snapshot), forwarded=forwarded, as_of_ms=as_of)
    clean, dirty = reports[str(tmp_path / "forwarded")], reports[str(planted)]
    assert clean["overall"] == {"forwarding": N}
    assert clean["anomalies"] == dict.fromkeys(clean["anomalies"], 0) and len(clean["anomalies"]) == 5
    assert (dirty["anomalies"]["never_forwarded"], dirty["anomalies"]["duplicate_forwards"]) == (1, 1), (lost, repeated)
    out.delete(list_key)
    out.close()
