"""A fleet of real ``delayq forward`` processes for one store, started and killed on demand."""

from __future__ import annotations

import random
from pathlib import Path

from tests.harness.launch import Launcher, Proc

__all__ = ["Forwarders"]


class Forwarders:
    """``delayq forward`` processes for one store, all with the same arguments; the launcher
    (the ``procs`` fixture) stops whichever are left at teardown."""

    def __init__(self, launcher: Launcher, url: str, prefix: str, shards: int, *extra: str) -> None:
        self.launcher = launcher
        self.args = ["forward", "--url", url, "--prefix", prefix, "--shards", str(shards)]
        self.args += ["--log-level", "warning", *extra]
        self.procs: list[Proc] = []

    def start(self, log: Path | None = None) -> Proc:
        """One more forwarder; its stderr is kept in a pipe unless ``log`` is given."""
        proc = self.launcher.delayq(*self.args, log=log)
        self.procs.append(proc)
        return proc

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a running forwarder picked by ``rng``."""
        victim = rng.choice([p for p in self.procs if p.poll() is None])
        self.launcher.kill(victim)
        self.procs.remove(victim)
