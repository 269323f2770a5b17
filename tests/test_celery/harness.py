"""Run a Celery setup for tests and benchmarks: a broker, a delay-store prefix, a queue, a sink,
real ``celery worker`` and forwarder subprocesses, and the execution records they leave."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Celery
from kombu import Connection

from bench.lib.proxy import TcpProxy
from delayq_backends.embedded import EmbeddedServer
from tests.harness import ROOT, Launcher, Proc, checkout_env
from tests.helpers import wait_for
from tests.test_celery.tasks import make_app


@dataclass
class CeleryEnv:
    """One broker, one delay-store prefix, one queue and one sink, shared by a worker, a
    forwarder and the test process's app."""

    kind: str
    broker: str
    store: str
    prefix: str
    queue: str
    sink: str
    backend: str
    records_url: str
    transport_options: dict[str, Any] = field(default_factory=dict)
    #: workers drop a second delivery of a started run (``delayq_dedupe``)
    dedupe: bool = False
    #: tasks ack after they ran, and a killed worker's tasks go back to the broker
    acks_late: bool = False
    #: the module ``celery -A`` loads in worker and forwarder subprocesses
    app_module: str = "tests.test_celery.worker_app"
    #: more settings of the app, here and in the subprocesses (``make_app(conf=...)``)
    conf: dict[str, Any] = field(default_factory=dict)
    launcher: Launcher = field(default_factory=Launcher)
    #: the node names of the workers started (``-n``), for control commands addressed to them
    nodes: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return checkout_env(
            DQT_BROKER=self.broker,
            DQT_STORE=self.store,
            DQT_PREFIX=self.prefix,
            DQT_QUEUE=self.queue,
            DQT_SINK=self.sink,
            DQT_BACKEND=self.backend,
            DQT_RECORDS=self.records_url,
            DQT_TRANSPORT_OPTIONS=json.dumps(self.transport_options),
            DQT_DEDUPE="1" if self.dedupe else "0",
            DQT_ACKS_LATE="1" if self.acks_late else "0",
            DQT_CONF=json.dumps(self.conf),
        )

    def app(self) -> Celery:
        return make_app(
            broker=self.broker,
            store=self.store,
            prefix=self.prefix,
            queue=self.queue,
            sink=self.sink,
            backend=self.backend,
            records=self.records_url,
            transport_options=self.transport_options,
            dedupe=self.dedupe,
            acks_late=self.acks_late,
            conf=self.conf,
        )

    def native_app(self) -> Celery:
        """The same app with the plugin switched off: Celery's own ETA handling, for comparison."""
        app = self.app()
        app.conf.delayq_enabled = False
        return app

    def start(self, args: list[str], name: str, tmp: Path, *, group: bool = False) -> Proc:
        return self.launcher.start(args, env=self.env, log=tmp / f"{name}.log", group=group)

    def start_worker(
        self,
        tmp: Path,
        *,
        name: str = "worker",
        pool: str = "threads",
        concurrency: int = 4,
        wait: bool = True,
        group: bool = False,
    ) -> Proc:
        """A ``celery worker`` (``group``: in a process group of its own, with its pool, which
        ``launcher.kill_group`` kills whole)."""
        node = f"{name}-{uuid.uuid4().hex[:6]}@dqt"
        args = [sys.executable, "-m", "celery", "-A", self.app_module, "worker"]
        args += ["-P", pool, "-c", str(concurrency), "-Q", self.queue, "-n", node, "--loglevel", "INFO"]
        args += ["--without-gossip", "--without-mingle"]
        proc = self.start(args, name, tmp, group=group)
        self.nodes.append(node)
        if wait:
            self.wait_ready(proc)
        return proc

    def inspect(self, app: Celery, timeout: float = 2) -> Any:
        """``app.control.inspect`` of this env's workers: it returns once each has replied,
        instead of always waiting out ``timeout`` for replies from workers that may exist."""
        return app.control.inspect(destination=self.nodes, timeout=timeout, limit=len(self.nodes))

    def wait_ready(self, proc: Proc, timeout: float = 60) -> None:
        """Send a ping task until the worker has run one: it is consuming."""
        sink = redis.Redis.from_url(self.records_url)
        app = self.app()
        ready_key = f"{self.sink}:ready"
        start = sink.llen(ready_key)
        app.send_task("dqt.ping", queue=self.queue)
        wait_for(lambda: proc.poll() is not None or sink.llen(ready_key) > start, timeout, "the worker to start")
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}:\n{self.tail()}")

    def start_forwarder(
        self, tmp: Path, *, via_celery: bool = False, broker: str | None = None, extra: Sequence[str] = ()
    ) -> Proc:
        """Start a forwarder; ``extra`` options are added to the command (e.g. ``--lossless``)."""
        common = ["--poll", "0.5", "--log-every", "2", "--lease", "10", *extra]
        if via_celery:  # the celery.commands entry point: settings come from the app
            args = [sys.executable, "-m", "celery", "-A", self.app_module, "delayq", "forward"]
        else:
            args = [sys.executable, "-m", "delayq_backends.cli", "forward", "--url", self.store]
            args += ["--prefix", self.prefix, "--shards", "4", "--celery-broker", broker or self.broker]
        return self.start(args + common, "forwarder", tmp)

    def records(self) -> list[dict[str, Any]]:
        sink = redis.Redis.from_url(self.records_url)
        return [json.loads(r) for r in sink.lrange(self.sink, 0, -1)]

    def tail(self) -> str:
        return self.launcher.tail()

    def stop(self) -> None:
        self.launcher.stop_all(grace=15)


@contextmanager
def watched(env: CeleryEnv) -> Iterator[CeleryEnv]:
    """``env`` for one block: its processes' logs printed if the block fails, the processes
    stopped and a RabbitMQ queue deleted at its end."""
    try:
        yield env
    except BaseException:
        print(env.tail())
        raise
    finally:
        env.stop()
        delete_queue(env)


@contextmanager
def running(env: CeleryEnv, tmp: Path, *, via_celery: bool = False) -> Iterator[CeleryEnv]:
    """``env`` with a worker and a forwarder running; their logs are printed if the block fails."""
    with watched(env):
        env.start_worker(tmp)
        env.start_forwarder(tmp, via_celery=via_celery)
        yield env


def new_env(kind: str, broker: str, valkey: EmbeddedServer) -> CeleryEnv:
    tag = uuid.uuid4().hex[:10]
    base = valkey.url.rsplit("/", 1)[0]
    return CeleryEnv(
        kind=kind,
        broker=broker,
        store=f"{base}/0",
        prefix=f"dqt{tag}",
        queue=f"dqt-{tag}",
        sink=f"dqt:{tag}:sink",
        backend=f"{base}/2",
        records_url=f"{base}/0",
    )


def delete_queue(env: CeleryEnv) -> None:
    """Leave the shared RabbitMQ as we found it."""
    if env.kind != "rabbitmq":
        return
    try:
        with Connection(env.broker, connect_timeout=2) as conn:
            conn.default_channel.queue_delete(env.queue)
    except Exception:  # best effort: a leftover test queue is harmless
        pass


def delayq_cli(env: CeleryEnv, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A <env's app module> delayq ARGS…`` in ``env``, run to its end, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", env.app_module, "delayq", *args],
        cwd=ROOT,
        env=env.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def via(proxy: TcpProxy, url: str) -> str:
    """``url`` with its host and port (stated or not) replaced by the loopback ``proxy``'s."""
    parts = urlsplit(url)
    login, at, _ = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{login}{at}127.0.0.1:{proxy.port}").geturl()
