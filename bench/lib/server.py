"""The server a bench owns: a Valkey it starts itself, so the only data it ever wipes is its own."""

from __future__ import annotations

import os
from pathlib import Path

import redis

from delayq_backends import Config, DelayStore
from delayq_backends.embedded import EmbeddedServer

__all__ = ["PREFIX", "BenchServer"]

#: the key prefix of the benches' stores
PREFIX = "bench"


class BenchServer:
    """A Valkey started by this run: the only server the benchmark ever wipes."""

    def __init__(self) -> None:
        self.embedded = EmbeddedServer()

    def __enter__(self) -> BenchServer:
        self.embedded.start()
        # no 5 s default timeout: FLUSHALL SYNC of a 10M-item backlog takes longer
        self.client = redis.Redis.from_url(self.embedded.url, socket_timeout=600)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.embedded.stop()

    @property
    def url(self) -> str:
        return self.embedded.url

    @property
    def port(self) -> int:
        return self.embedded.port

    def wipe(self) -> None:
        """FLUSHALL between measurements: safe because this process started the server.

        SYNC, because Valkey frees flushed data in a background thread by default
        (lazyfree-lazy-user-flush yes): freeing a 1M-item backlog would otherwise steal a core
        from the next measurement.
        """
        self.client.execute_command("FLUSHALL", "SYNC")
        self.client.config_resetstat()

    def connect(self) -> redis.Redis:
        """A fresh client (its own connection pool, like a real producer or forwarder)."""
        return redis.Redis.from_url(self.url)

    def store(self, *, shards: int = 16, client: redis.Redis | None = None) -> DelayStore:
        """A store with the benchmark's prefix, on ``client`` or a fresh one."""
        return DelayStore(client or self.connect(), Config(prefix=PREFIX, shards=shards))

    def version(self) -> str:
        info = self.client.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        return f"{name} {info.get('valkey_version') or info.get('redis_version')}"

    def settings(self) -> dict[str, str]:
        """Server settings the figures depend on (allocator, small-hash encoding limit)."""
        config = self.client.config_get("hash-max-listpack-entries")
        return {
            "mem_allocator": str(self.client.info("memory").get("mem_allocator")),
            **{str(k): str(v) for k, v in config.items()},
        }

    def cpu_seconds(self) -> float | None:
        """User+system CPU of the server process (Linux /proc), to split wall time by side."""
        process = self.embedded.process
        try:
            fields = Path(f"/proc/{process.pid if process else 0}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def command_seconds(self) -> float:
        """Time the server spent executing commands (INFO commandstats), scripts included."""
        return float(sum(v["usec"] for v in self.client.info("commandstats").values())) / 1e6
