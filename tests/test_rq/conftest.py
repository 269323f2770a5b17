"""Fixtures of the RQ adapter tests: RQ on the embedded Valkey (and the system Redis where a test
says so), a delay store on the same server, real `rq worker` and `delayq forward` processes.

RQ keys carry no prefix, so each test uses its own queue names (from the per-test prefix);
tests that scan RQ's global keys (the migration) get a database of their own on the embedded
Valkey, which is ours to flush.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from delayq_backends import Config, DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from tests.harness.rq import SHARDS


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
