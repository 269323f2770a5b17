"""URLs never show a password; cluster mode is detected from the server."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from delayq_backends.connection import connect, is_cluster, redact_url
from delayq_backends.embedded import EmbeddedCluster
from delayq_backends.errors import ConfigError


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
        ("redis://:p@[::1]:6379", "redis://:***@[::1]:6379"),
        ("redis://host:6379/0?password=s3cret&db=1", "redis://host:6379/0?password=***&db=1"),
        # unencoded characters that end the authority early for urlsplit
        ("redis://:s3cret#a/ss?@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://:p#s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:p@s3cret@host", "rediss://user:***@host"),
        ("redis://user:s3/cr?et@host:1/2?db=3", "redis://user:***@host:1/2?db=3"),
        ("redis://user:s3:cret@host", "redis://user:***@host"),
        ("redis://:s3cret@host/0?password=s3cret", "redis://:***@host/0?password=***"),
        ("redis://host/0?PASSWORD=s3cret#frag", "redis://host/0?PASSWORD=***"),
        # unix sockets
        ("unix://:s3cret@/var/run/redis.sock?db=0", "unix://:***@/var/run/redis.sock?db=0"),
        ("unix:///var/run/redis.sock?password=s3cret&db=1", "unix:///var/run/redis.sock?password=***&db=1"),
        # kombu broker URLs, failover lists included
        ("amqp://u:s3cret@h//", "amqp://u:***@h//"),
        ("amqp://u:s3c@ret@h1:5672//;amqp://u:s3cret@h2//", "amqp://u:***@h1:5672//;amqp://u:***@h2//"),
        ("sentinel://:s3;cret@h:26379", "sentinel://:***@h:26379"),
        ("redis+socket://:s3cret@/tmp/r.sock", "redis+socket://:***@/tmp/r.sock"),
    ],
)
def test_redact_url_hides_every_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3" not in redact_url(url) and "cret" not in redact_url(url)


@pytest.mark.parametrize("url", ["redis://h:6379/1", "redis://:@h:6379/1", "amqp://guest@h//"])
def test_a_url_without_a_password_is_shown_without_stars(url: str) -> None:
    """Issue 22: banners showed ``redis://:***@…`` for a URL that has no password."""
    assert "***" not in redact_url(url)


@pytest.mark.parametrize("url", ["redis://:s3cret/x@host:6379/0", "redis://u:s3cret@host:notaport/0"])
def test_a_malformed_url_is_refused_without_quoting_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        connect(url)
    assert "s3cret" not in str(refused.value) and "percent-encode" in str(refused.value)


@pytest.mark.cluster
def test_cluster_mode_is_detected_from_any_node(redis_cluster: EmbeddedCluster) -> None:
    for node in redis_cluster.nodes:
        assert isinstance(connect(node.url), RedisCluster)


def test_standalone_server_gets_a_plain_client(valkey_url: str) -> None:
    assert not isinstance(connect(valkey_url), RedisCluster)


class _Refusing:
    """A client whose INFO fails with ``error`` (no server refuses it so on demand)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def info(self, section: str) -> dict[str, object]:
        raise self.error


def test_only_a_missing_or_forbidden_info_means_not_a_cluster(valkey_url: str) -> None:
    """INFO renamed away or forbidden by ACL: a plain server. Any other error is no answer
    about cluster mode and is raised, not taken for "not a cluster"."""
    assert not is_cluster(_Refusing(redis.ResponseError("unknown command 'INFO', with args beginning with:")))
    assert not is_cluster(_Refusing(redis.exceptions.NoPermissionError("NOPERM this user has no permissions")))
    with pytest.raises(redis.ResponseError, match="MASTERDOWN"):
        is_cluster(_Refusing(redis.ResponseError("MASTERDOWN Link with MASTER is down")))
    assert not is_cluster(redis.Redis.from_url(valkey_url))
