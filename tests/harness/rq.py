"""Real `rq worker` and `delayq forward` processes for RQ tests (tests/test_rq, tests/test_web),
and the runs their jobs record."""

from __future__ import annotations

import json
import os
from typing import Any

import redis

from tests.harness.launch import Launcher, Proc
from tests.test_rq.jobs import runs_key

#: shards of the RQ tests' stores
SHARDS = 4


def runs(conn: redis.Redis, queue_name: str) -> list[dict[str, Any]]:
    """Every recorded run of jobs of ``queue_name``, in order."""
    return [json.loads(r) for r in conn.lrange(runs_key(queue_name), 0, -1)]


class Processes:
    """Starts `rq worker` and `delayq forward` processes for one test through the launcher,
    which kills them at teardown."""

    def __init__(self, launcher: Launcher, url: str, prefix: str) -> None:
        self.launcher = launcher
        self.url = url
        self.env = {**os.environ, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": str(SHARDS)}
        self.env.pop("DELAYQ_URL", None)  # the queue's own Redis holds the store

    def start(self, *args: str, env: dict[str, str] | None = None, group: bool = False) -> Proc:
        return self.launcher.python(*args, env={**self.env, **(env or {})}, group=group)

    def worker(
        self,
        *queues: str,
        burst: bool = False,
        queue_class: str = "delayq_backends.rq.Queue",
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        group: bool = False,
    ) -> Proc:
        """An `rq worker`; ``env`` added to its environment; ``group``: in a process group of its
        own (``launcher.kill_group`` kills it; RQ puts its work horse in a session of its own)."""
        flags = [*extra, "--burst"] if burst else list(extra)
        args = ("-m", "rq.cli", "worker", "-u", self.url, "--queue-class", queue_class, "-q", *flags, *queues)
        return self.start(*args, env=env, group=group)

    def forwarder(self, *extra: str) -> Proc:
        args = ["forward", "--url", self.url, "--rq-redis", self.url, "--log-level", "warning", *extra]
        return self.launcher.delayq(*args, env=self.env)

    def stop_all(self) -> None:
        self.launcher.stop_all()
