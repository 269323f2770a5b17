"""Fixtures of the RQ adapter tests: RQ on the embedded Valkey (and the system Redis where a test
says so), a delay store on the same server, real `rq worker` and `delayq forward` processes.

RQ keys carry no prefix, so each test uses its own queue names (from the per-test prefix);
tests that scan RQ's global keys (the migration) get a database of their own on the embedded
Valkey, which is ours to flush.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis

from delayq_backends import Config, DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from tests.helpers import kill_all
from tests.test_rq.jobs import runs_key

ROOT = Path(__file__).resolve().parents[2]
SHARDS = 4


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@pytest.fixture
def conn(valkey_url: str) -> Iterator[redis.Redis]:
    """RQ's Redis: the embedded Valkey, database 0 (the delay store shares it)."""
    c = client(valkey_url)
    yield c
    c.close()


@pytest.fixture
def store(conn: redis.Redis, prefix: str) -> DelayStore:
    """A delay store on RQ's own server: the exactly-once hand-off applies."""
    return DelayStore(conn, Config(prefix=prefix, shards=SHARDS))


@pytest.fixture
def queue(conn: redis.Redis, store: DelayStore, prefix: str) -> Queue:
    return Queue(f"{prefix}-q", connection=conn, delay_store=store)


@pytest.fixture
def forwarder(store: DelayStore, conn: redis.Redis) -> Forwarder:
    """An in-process forwarder with the rq target; tests drive it with run_once()."""
    return Forwarder(store, [RQTarget(conn)], retry_delay=0.05)


def runs(conn: redis.Redis, queue_name: str) -> list[dict[str, Any]]:
    """Every recorded run of jobs of ``queue_name``, in order."""
    return [json.loads(r) for r in conn.lrange(runs_key(queue_name), 0, -1)]


class Processes:
    """Starts `rq worker` and `delayq forward` processes for one test; kills them at teardown."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DELAYQ_PREFIX": prefix,
            "DELAYQ_SHARDS": str(SHARDS),
        }
        self.env.pop("DELAYQ_URL", None)  # the queue's own Redis holds the store
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.procs.append(proc)
        return proc

    def worker(
        self,
        *queues: str,
        burst: bool = False,
        queue_class: str = "delayq_backends.rq.Queue",
        extra: tuple[str, ...] = (),
    ) -> Any:
        flags = [*extra, "--burst"] if burst else list(extra)
        return self.start("-m", "rq.cli", "worker", "-u", self.url, "--queue-class", queue_class, "-q", *flags, *queues)

    def forwarder(self, *extra: str) -> Any:
        return self.start(
            "-m", "delayq_backends.cli", "forward", "--url", self.url, "--rq-redis", self.url,
            "--log-level", "warning", *extra,
        )  # fmt: skip

    def stop_all(self) -> None:
        kill_all(self.procs)


@pytest.fixture
def processes(valkey_url: str, prefix: str) -> Iterator[Processes]:
    procs = Processes(valkey_url, prefix)
    yield procs
    procs.stop_all()
