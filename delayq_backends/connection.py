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
    """``url`` with any password (in the user info or a ``password=`` query) replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{name}=***" if name.lower() == "password" else field
        for field in parts.query.split("&")
        for name in [field.partition("=")[0]]
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def connect(url: str, **kwargs: Any) -> Client:
    """A client for ``url``; a server in cluster mode gets a :class:`RedisCluster`.

    The mode is asked of the server (``INFO cluster``) rather than configured, so the same URL
    works whether it names a standalone server or any node of a cluster.

    Raises:
        ConfigError: the URL is malformed or the server cannot be reached.
    """
    kwargs.setdefault("socket_connect_timeout", 5)
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
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.ResponseError:  # INFO renamed or disabled, or an in-process fake: not a cluster
        return False
