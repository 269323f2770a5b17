"""Opening a client from a URL, plain Redis/Valkey or Redis Cluster alike."""

from __future__ import annotations

from typing import Any, Union
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster

from .errors import ConfigError

__all__ = ["Client", "connect", "is_cluster", "redact_url"]

Client = Union[redis.Redis, RedisCluster]


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and tables."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def connect(url: str, **kwargs: Any) -> Client:
    """A client for ``url``; a server in cluster mode gets a :class:`RedisCluster`.

    The mode is asked of the server (``INFO cluster``) rather than configured, so the same URL
    works whether it names a standalone server or any node of a cluster.

    Raises:
        ConfigError: the URL is malformed or the server cannot be reached.
    """
    try:
        client = redis.Redis.from_url(url, **kwargs)
        cluster = is_cluster(client)
    except (ValueError, redis.RedisError) as exc:
        raise ConfigError(f"cannot use Redis at {redact_url(url)}: {exc}") from exc
    if not cluster:
        return client
    client.close()
    return RedisCluster.from_url(url, **kwargs)


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a RedisCluster, or a node in cluster mode)."""
    if isinstance(client, RedisCluster):
        return True
    return bool(client.info("cluster").get("cluster_enabled"))
