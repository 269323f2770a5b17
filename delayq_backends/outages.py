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

__all__ = ["CONNECTION_ERRORS", "config_error", "config_fix", "gives_back", "is_transient"]

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
    (BUSY and NOREPLICAS have no class of their own). A configuration error (see
    :func:`config_error`) is not one, though redis-py makes AuthenticationError a ConnectionError."""
    if config_error(exc) is not None:
        return False
    if isinstance(exc, _TRANSIENT_TYPES + _AMQP_TRANSIENT):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES


#: Redis/Valkey error replies that mean "this client may not": a configuration error.
_CONFIG_REPLIES = ("NOPERM", "WRONGPASS", "NOAUTH")
#: amqp's reply codes that mean the same: ACCESS_REFUSED (403, a wrong user or password, or no
#: permission on the vhost) and NOT_ALLOWED (530, an unknown vhost).
_AMQP_CONFIG_CODES = (403, 530)


def config_error(exc: BaseException) -> BaseException | None:
    """The configuration error behind ``exc`` (itself or what it was raised from), or None.

    A configuration error does not clear by itself nor belongs to one item: a missing module,
    a refused login or permission (Redis AuthenticationError, NOPERM, WRONGPASS, NOAUTH; AMQP
    ACCESS_REFUSED), an unknown vhost (AMQP NOT_ALLOWED). A forwarder refuses to start on one
    and pauses the target when one appears later, counting no attempt. kombu wraps the Redis
    transport's errors in its OperationalError, so the causes are looked at too."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_config(current):
            return current
        current = current.__cause__ or current.__context__
    return None


def _is_config(exc: BaseException) -> bool:
    if isinstance(exc, (ImportError, redis.AuthenticationError, redis.exceptions.NoPermissionError)):
        return True
    if isinstance(exc, redis.ResponseError):
        return str(exc).split(" ", 1)[0].upper() in _CONFIG_REPLIES
    return type(exc).__module__.startswith("amqp") and getattr(exc, "code", None) in _AMQP_CONFIG_CODES


def config_fix(exc: BaseException) -> str:
    """One line: what the configuration error ``exc`` (from :func:`config_error`) is and what to do."""
    said = " ".join(str(exc).split())[:200]
    if isinstance(exc, ImportError):
        module = exc.name or said
        return (
            f"module {module!r} is missing ({said}): install it where the forwarder runs "
            f"(pip install {module.split('.')[0]}, or the delayq_backends extra for this broker)"
        )
    if getattr(exc, "code", None) == 530:
        return f"the broker refused the vhost ({said}): create it or fix the vhost in the broker URL"
    if isinstance(exc, redis.exceptions.NoPermissionError) or said.upper().startswith("NOPERM"):
        return f"the server refused a command to this user ({said}): grant the user the permission (ACL SETUSER)"
    return f"the server refused the login ({said}): fix the user and password in the URL of this target"


def gives_back(exc: BaseException) -> bool:
    """Whether items a target could not send because of ``exc`` are given back with no attempt
    counted: an outage (:func:`is_transient`) or a configuration error (:func:`config_error`)."""
    return config_error(exc) is not None or is_transient(exc)
