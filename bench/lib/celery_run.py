"""A Celery setup for the benches: a broker, a delay-store prefix, a queue and a sink, real
``celery worker`` and ``delayq forward`` subprocesses, and the records the tasks leave.

Every task records its run (id, tag, start time, eta) on a Redis list, the sink, which the
bench reads; ``dqb.ping`` tells when a worker consumes. Its own app and tasks, so no bench
imports a test module.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu import Connection

from delayq_backends.celery import install
from delayq_backends.embedded import EmbeddedServer

from .processes import Processes
from .waiting import wait_for

__all__ = ["CeleryRun", "make_app"]


def make_app(
    *,
    broker: str,
    store: str,
    prefix: str,
    queue: str,
    sink: str,
    backend: str,
    records: str,
    transport_options: dict[str, Any],
    dedupe: bool = False,
) -> Celery:
    """An app with the plugin installed whose tasks record their runs on the list ``sink`` on the
    Redis at ``records`` (apart from the store and the broker, which the chaos run restarts)."""
    app = Celery("dqb")
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
        delayq_url=store,
        delayq_prefix=prefix,
        delayq_shards=4,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        result_expires=600,
        broker_transport_options=transport_options,
        delayq_dedupe=dedupe,
        # Celery's prefetch reduction after a reconnect can leave a worker connected but idle
        # when the broker restarts with a task in flight (celery#9512 and kin); the chaos run
        # restarts brokers, and a stalled worker is Celery's fault, not a lost job
        worker_enable_prefetch_count_reduction=False,
    )
    install(app)
    out = redis.Redis.from_url(records)

    @app.task(bind=True, shared=False, name="dqb.record")  # type: ignore[untyped-decorator]
    def record(self: Any, tag: str, *args: Any, **kwargs: Any) -> str:
        run = {"id": self.request.id, "tag": tag, "started_ms": time.time_ns() // 1_000_000, "eta": self.request.eta}
        out.rpush(sink, json.dumps(run))
        return tag

    @app.task(shared=False, name="dqb.ping")  # type: ignore[untyped-decorator]
    def ping() -> str:
        out.rpush(f"{sink}:ready", "ok")
        return "pong"

    return app


@dataclass
class CeleryRun:
    """One broker, one delay-store prefix, one queue and one sink, shared by a worker, a
    forwarder and the bench's own app."""

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
    processes: Processes = field(default_factory=lambda: Processes(grace=15))

    @classmethod
    def on(cls, kind: str, broker: str, valkey: EmbeddedServer) -> CeleryRun:
        """Fresh names on the bench's Valkey: the store and sink in db 0, results in db 2."""
        tag = uuid.uuid4().hex[:10]
        base = valkey.url.rsplit("/", 1)[0]
        return cls(kind, broker, f"{base}/0", f"dqb{tag}", f"dqb-{tag}", f"dqb:{tag}:sink", f"{base}/2", f"{base}/0")

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DQB_BROKER": self.broker,
            "DQB_STORE": self.store,
            "DQB_PREFIX": self.prefix,
            "DQB_QUEUE": self.queue,
            "DQB_SINK": self.sink,
            "DQB_BACKEND": self.backend,
            "DQB_RECORDS": self.records_url,
            "DQB_TRANSPORT_OPTIONS": json.dumps(self.transport_options),
            "DQB_DEDUPE": "1" if self.dedupe else "0",
        }

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
        )

    def native_app(self) -> Celery:
        """The same app with the plugin switched off: Celery's own ETA handling."""
        app = self.app()
        app.conf.delayq_enabled = False
        return app

    def start_worker(self, tmp: Path, *, name: str = "worker", ready_timeout: float = 60) -> Any:
        """A threads-pool worker on the queue, returned once it has run a ping (it consumes);
        ``ready_timeout``: longer when the ping queues behind a backlog."""
        node = f"{name}-{uuid.uuid4().hex[:6]}@dqb"
        args = [sys.executable, "-m", "celery", "-A", "lib.celery_app", "worker", "-P", "threads", "-c", "4"]
        args += ["-Q", self.queue, "-n", node, "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
        proc = self.processes.start(args, env=self.env, log=tmp / f"{name}.log")
        self.wait_ready(proc, ready_timeout)
        return proc

    def wait_ready(self, proc: Any, timeout: float = 60) -> None:
        """Send a ping task and wait until the worker has run it: it has caught up with its queue."""
        sink = redis.Redis.from_url(self.records_url)
        ready = f"{self.sink}:ready"
        start = sink.llen(ready)
        self.app().send_task("dqb.ping", queue=self.queue)
        wait_for(
            lambda: proc.poll() is not None or sink.llen(ready) > start, timeout, "the worker to start", interval=0.05
        )
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")

    def start_forwarder(self, tmp: Path) -> Any:
        args = ["forward", "--url", self.store, "--prefix", self.prefix, "--shards", "4"]
        args += ["--celery-broker", self.broker, "--poll", "0.5", "--log-every", "2", "--lease", "10"]
        return self.processes.delayq(*args, env=self.env, log=tmp / "forwarder.log")

    def start_celery_forwarder(self, log: Path, *extra: str) -> Any:
        """``celery -A lib.celery_app delayq forward``: the forwarder as a Celery user runs it,
        with the app's broker and ``delayq_*`` settings."""
        args = [sys.executable, "-m", "celery", "-A", "lib.celery_app", "delayq", "forward", "--log-every", "5"]
        return self.processes.start([*args, *extra], env=self.env, log=log)

    def records(self) -> list[dict[str, Any]]:
        sink = redis.Redis.from_url(self.records_url)
        return [json.loads(r) for r in sink.lrange(self.sink, 0, -1)]

    def stop(self) -> None:
        self.processes.stop()

    def delete_queue(self) -> None:
        """Leave a shared RabbitMQ without this run's queue."""
        if self.kind == "rabbitmq":
            try:
                with Connection(self.broker, connect_timeout=2) as conn:
                    conn.default_channel.queue_delete(self.queue)
            except Exception:  # best effort: a leftover bench queue is harmless
                pass
