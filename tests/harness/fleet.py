"""A fleet of real ``delayq forward`` processes for one store, started and killed on demand."""

from __future__ import annotations

import random
from pathlib import Path

import redis

from delayq_backends.keys import wake_channel
from tests.harness.launch import Launcher, Proc
from tests.helpers import wait_for

__all__ = ["Forwarders"]


class Forwarders:
    """``delayq forward`` processes for one store, all with the same arguments; the launcher
    (the ``procs`` fixture) stops whichever are left at teardown."""

    def __init__(self, launcher: Launcher, url: str, prefix: str, shards: int, *extra: str) -> None:
        self.launcher = launcher
        self.url, self.channel = url, wake_channel(prefix)
        self.args = ["forward", "--url", url, "--prefix", prefix, "--shards", str(shards)]
        self.args += ["--log-level", "warning", *extra]
        self.procs: list[Proc] = []

    def start(self, log: Path | None = None) -> Proc:
        """One more forwarder; its stderr is kept in a pipe unless ``log`` is given."""
        proc = self.launcher.delayq(*self.args, log=log)
        self.procs.append(proc)
        return proc

    def wait_up(self, timeout: float = 30) -> None:
        """Wait until every forwarder started has subscribed to the store's wake channel, the
        first step of its loop: from then on it claims what falls due. Not a guessed lead time:
        two start in about 1 s on an idle machine and over 2 s on a loaded 2-core one. (One
        server's URL: a cluster counts subscribers per node.)"""
        client = redis.Redis.from_url(self.url)
        try:
            wait_for(
                lambda: client.pubsub_numsub(self.channel)[0][1] >= len(self.procs),
                timeout,
                lambda: f"{len(self.procs)} forwarders to subscribe to {self.channel} (exit codes {self._codes()})",
            )
        finally:
            client.close()

    def _codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a running forwarder picked by ``rng``."""
        victim = rng.choice([p for p in self.procs if p.poll() is None])
        self.launcher.kill(victim)
        self.procs.remove(victim)
