"""Opening a client from a URL, plain Redis/Valkey or Redis Cluster alike."""

from __future__ import annotations

import re
from typing import Any, Protocol

import redis
from redis.cluster import RedisCluster

from .errors import ConfigError

__all__ = [
    "Client",
    "StoreServer",
    "connect",
    "connect_rq",
    "is_cluster",
    "on_store_server",
    "redact_url",
    "same_server",
]

Client = redis.Redis | RedisCluster


class _Url(Protocol):
    @property
    def url(self) -> str: ...


class StoreServer(Protocol):
    """What these helpers read of a delay store (a :class:`~delayq_backends.store.base.StoreCore`):
    its client, whether that is a cluster, and its URL; typed here so the base imports no store."""

    @property
    def client(self) -> Any: ...

    @property
    def cluster(self) -> bool: ...

    @property
    def config(self) -> _Url: ...


#: The schemes redis-py opens (``unix://`` is a socket path).
STORE_SCHEMES = ("redis", "rediss", "unix")

#: One URL's scheme; kombu takes several URLs joined by ";" (failover brokers).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_NEXT_URL = re.compile(r";(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
_QUERY_PASSWORD = re.compile(r"([?&;]password=)[^&]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with any password (in the user info or a ``password=`` query) replaced by ``***``.

    Does not trust a URL parser: a password holding an unencoded ``#``, ``/``, ``?`` or ``@``
    ends the authority early for ``urlsplit``, which would then show the rest. The user info
    ends at the *last* ``@``; when an ``@`` belongs to a query instead, more is hidden, never less.
    """
    return ";".join(_redact_one(part) for part in _NEXT_URL.split(url))


def _redact_one(url: str) -> str:
    scheme = _SCHEME.match(url)
    head, rest = (url[: scheme.end()], url[scheme.end() :]) if scheme else ("", url)
    user_info, at, tail = rest.rpartition("@")
    if at:
        user, colon, password = user_info.partition(":")
        rest = f"{user}:***@{tail}" if password else rest
    return head + _QUERY_PASSWORD.sub(r"\1***", rest)


def connect(url: str, **kwargs: Any) -> Client:
    """A client for ``url``; a server in cluster mode gets a :class:`RedisCluster`.

    The mode is asked of the server (``INFO cluster``) rather than configured, so the same URL
    works whether it names a standalone server or any node of a cluster.

    Raises:
        ConfigError: the URL is malformed or the server cannot be reached.
    """
    kwargs.setdefault("socket_connect_timeout", 5)
    client = _parse(url, kwargs)
    _check_database(url, client)
    try:
        cluster = is_cluster(client)
    except (ValueError, redis.RedisError) as exc:
        client.close()
        raise ConfigError(f"cannot use Redis at {redact_url(url)}: {exc}") from exc
    if not cluster:
        return client
    client.close()
    return RedisCluster.from_url(url, **kwargs)


def _parse(url: str, kwargs: dict[str, Any]) -> redis.Redis:
    """A client for ``url`` (not connected yet), or a ConfigError that says what is wrong with it."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in STORE_SCHEMES:
        raise ConfigError(
            f"cannot use Redis at {redact_url(url)}: a Redis/Valkey URL starts with "
            + ", ".join(f"{s}://" for s in STORE_SCHEMES)
            + " (e.g. redis://localhost:6379/0); an AMQP URL is a Celery broker, not a Redis"
        )
    try:
        return redis.Redis.from_url(url, **kwargs)
    except ValueError:
        # redis-py's message may quote part of a password that broke the parse
        raise ConfigError(
            f"cannot use Redis at {redact_url(url)}: the URL is malformed; percent-encode special characters "
            "in the password (# %23, / %2F, ? %3F, @ %40, : %3A, % %25)"
        ) from None


def _check_database(url: str, client: redis.Redis) -> None:
    """Refuse a database the server does not have, naming the URL and the server's count.

    redis-py selects the database when it connects; a PING makes that happen here, where the
    URL is known (``is_cluster`` reads a refused INFO as "not a cluster" and would hide it).
    """
    db = int(client.connection_pool.connection_kwargs.get("db") or 0)
    if not db:
        return
    try:
        client.ping()
    except redis.ResponseError as exc:
        client.close()
        raise ConfigError(
            f"cannot use Redis at {redact_url(url)}: database {db}: {exc}{_databases(client.connection_pool)}"
        ) from exc
    except redis.RedisError:
        return  # unreachable or refused: is_cluster's call says so


def _databases(pool: redis.ConnectionPool) -> str:
    """``"; the server has N databases …"``, or nothing where CONFIG GET is not allowed."""
    db0 = redis.ConnectionPool(connection_class=pool.connection_class, **{**pool.connection_kwargs, "db": 0})
    try:
        count = int(redis.Redis(connection_pool=db0).config_get("databases").get("databases") or "")
    except (redis.RedisError, KeyError, ValueError):
        return ""
    finally:
        db0.disconnect()
    return f"; the server has {count} databases (0..{count - 1}): pick one of those"


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a RedisCluster, or a node in cluster mode)."""
    if isinstance(client, RedisCluster):
        return True
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.exceptions.NoPermissionError:  # a user who may not send INFO: taken as a plain server
        return False
    except redis.ResponseError as exc:  # INFO renamed or disabled, or an in-process fake: not a cluster
        if "unknown command" in str(exc).lower():
            return False
        raise  # any other refusal (a server still loading, …) says nothing about cluster mode


def same_server(a: Any, b: Any) -> bool:
    """Whether two redis-py clients reach the same server and database (by connection settings)."""
    if a is b:
        return True
    try:
        ka, kb = a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs
    except AttributeError:
        return False
    fields = ("host", "port", "path", "db")
    return all(ka.get(f) == kb.get(f) for f in fields)


def on_store_server(store: StoreServer, client: Any) -> bool:
    """Whether ``client`` writes to the store's own (non-cluster) server and database, so its
    writes and the store's can commit in one MULTI/EXEC: the one rule every adapter asks."""
    return not store.cluster and same_server(store.client, client)


def connect_rq(url: str, store: StoreServer) -> redis.Redis:
    """RQ's Redis at ``url``, reusing the store's own client when ``url`` is the store's and
    not a cluster, so a job hash and its store entry commit in one transaction.

    The caller closes the client when it is not ``store.client``.

    Raises:
        ConfigError: ``url`` is unusable or names a Redis Cluster (RQ needs a single server).
    """
    client = store.client if url == store.config.url and not store.cluster else connect(url)
    if not isinstance(client, redis.Redis):
        client.close()
        raise ConfigError(f"{redact_url(url)} is a Redis Cluster; RQ needs a single server: give --rq-redis a node")
    return client
