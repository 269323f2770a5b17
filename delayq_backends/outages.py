"""Which errors are outages (retry later, no attempt counted) rather than failures of an item.

A target reports an outage as ``unsent`` with a ``broker_error``: the forwarder releases the
batch and backs off. A failure is counted against the item and, repeated, dead-letters it.
Overload is an outage: a broker at ``maxmemory`` (OOM), a replica after a failover
(READONLY), a cluster resharding or electing (TRYAGAIN, CLUSTERDOWN, MASTERDOWN), a server
loading its dataset (LOADING) or busy in a script (BUSY), a RabbitMQ memory or disk alarm
(connection blocked, resource locked or exhausted) all clear by themselves; dead-lettering a
whole batch after one attempt would turn a minute of overload into thousands of dead letters.
"""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

__all__ = ["CONNECTION_ERRORS", "is_transient"]

#: The server cannot be reached or did not answer. redis-py raises RedisClusterException (not
#: a RedisError) when no cluster node answers, as in the seconds of a failover.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
    RedisClusterException,
)

#: Redis/Valkey error replies that mean "not now" (their first word).
_TRANSIENT_REPLIES = ("OOM", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "LOADING", "BUSY", "MASTERDOWN", "NOREPLICAS")

_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.MasterDownError,
)


def _amqp_transient() -> tuple[type[BaseException], ...]:
    """amqp's "resource locked" (405), "resource error" (506, a memory or disk alarm),
    "connection forced" (320, a broker shutting down) and its recoverable connection errors."""
    try:
        from amqp import exceptions as amqp_errors
    except ImportError:  # the Celery extra is not installed
        return ()
    names = ("ResourceLocked", "ResourceError", "ConnectionForced", "RecoverableConnectionError", "Blocked")
    return tuple(e for e in (getattr(amqp_errors, n, None) for n in names) if isinstance(e, type))


_AMQP_TRANSIENT = _amqp_transient()


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage or overload that clears by itself: release, don't fail.

    By type where redis-py or amqp has one, else by the first word of a Redis error reply
    (BUSY and NOREPLICAS have no class of their own)."""
    if isinstance(exc, _TRANSIENT_TYPES + _AMQP_TRANSIENT):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES
