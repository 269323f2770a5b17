"""URLs never show a password; cluster mode is detected from the server."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from delayq_backends.connection import connect, redact_url
from delayq_backends.embedded import EmbeddedCluster


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
        ("redis://:p@[::1]:6379", "redis://:***@[::1]:6379"),
        ("redis://host:6379/0?password=s3cret&db=1", "redis://host:6379/0?password=***&db=1"),
    ],
)
def test_redact_url_hides_every_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)


@pytest.mark.cluster
def test_cluster_mode_is_detected_from_any_node(redis_cluster: EmbeddedCluster) -> None:
    for node in redis_cluster.nodes:
        assert isinstance(connect(node.url), RedisCluster)


def test_standalone_server_gets_a_plain_client(valkey_url: str) -> None:
    assert not isinstance(connect(valkey_url), RedisCluster)
