"""Fixtures of the RQ adapter tests: RQ on the embedded Valkey (and the system Redis where a test
says so), a delay store on the same server, real `rq worker` and `delayq forward` processes.

RQ keys carry no prefix, so each test uses its own queue names (from the per-test prefix);
tests that scan RQ's global keys (the migration) get a database of their own on the embedded
Valkey, which is ours to flush.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import pytest
import redis

from delayq_backends import Config, DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from tests.harness import Launcher, Proc
from tests.test_rq.jobs import runs_key

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
def rq_store(conn: redis.Redis, prefix: str) -> DelayStore:
    """A delay store on RQ's own server: the exactly-once hand-off applies."""
    return DelayStore(conn, Config(prefix=prefix, shards=SHARDS))


@pytest.fixture
def queue(conn: redis.Redis, rq_store: DelayStore, prefix: str) -> Queue:
    return Queue(f"{prefix}-q", connection=conn, delay_store=rq_store)


@pytest.fixture
def forwarder(rq_store: DelayStore, conn: redis.Redis) -> Forwarder:
    """An in-process forwarder with the rq target; tests drive it with run_once()."""
    return Forwarder(rq_store, [RQTarget(conn)], retry_delay=0.05)


def runs(conn: redis.Redis, queue_name: str) -> list[dict[str, Any]]:
    """Every recorded run of jobs of ``queue_name``, in order."""
    return [json.loads(r) for r in conn.lrange(runs_key(queue_name), 0, -1)]


class Processes:
    """Starts `rq worker` and `delayq forward` processes for one test through the launcher,
    which kills them at teardown."""

    def __init__(self, launcher: Launcher, url: str, prefix: str) -> None:
        self.launcher = launcher
        self.url = url
        self.env = {**os.environ, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": str(SHARDS)}
        self.env.pop("DELAYQ_URL", None)  # the queue's own Redis holds the store

    def start(self, *args: str) -> Proc:
        return self.launcher.python(*args, env=self.env)

    def worker(
        self,
        *queues: str,
        burst: bool = False,
        queue_class: str = "delayq_backends.rq.Queue",
        extra: tuple[str, ...] = (),
    ) -> Proc:
        flags = [*extra, "--burst"] if burst else list(extra)
        return self.start("-m", "rq.cli", "worker", "-u", self.url, "--queue-class", queue_class, "-q", *flags, *queues)

    def forwarder(self, *extra: str) -> Proc:
        args = ["forward", "--url", self.url, "--rq-redis", self.url, "--log-level", "warning", *extra]
        return self.launcher.delayq(*args, env=self.env)

    def stop_all(self) -> None:
        self.launcher.stop_all()


@pytest.fixture
def processes(valkey_url: str, prefix: str, procs: Launcher) -> Processes:
    return Processes(procs, valkey_url, prefix)
