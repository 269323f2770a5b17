"""A chaos run of the whole Celery path, shared by ``bench/chaos.py`` (long) and
``tests/test_chaos.py`` (short).

The delay store and the Redis broker each run as a server of their own with AOF
(``appendfsync always``), and forwarders reach both through loopback proxies. A real
``celery worker`` and several ``delayq forward`` processes run while faults land on a schedule:
SIGKILL of a forwarder (restarted at once), a cut or a slow link between the forwarders and the
broker or the store, and a SIGKILL-and-restart of the broker or the store. Afterwards the run waits until every
scheduled task has run, or the deadline passes, and reports what was lost.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from kombu import Connection

from delayq_backends.audit import read_stream
from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.message import parse_time
from delayq_backends.embedded import EmbeddedServer

from .brokers import AMQP_URL
from .celery_run import CeleryRun
from .processes import Processes
from .proxy import TcpProxy
from .report import distribution

__all__ = ["ChaosPlan", "ChaosReport", "run_chaos"]


@dataclass(frozen=True)
class ChaosPlan:
    """How many tasks, over how long, and which faults (counts per kind)."""

    tasks: int = 600
    spread: float = 12.0
    forwarders: int = 3
    faults: dict[str, int] = field(
        default_factory=lambda: {
            "kill-forwarder": 8,
            "cut-broker": 2,
            "cut-store": 2,
            "restart-broker": 1,
            "restart-store": 1,
            "slow-broker": 1,
            "slow-store": 1,
        }
    )
    cut_seconds: float = 1.0
    slow_delay: float = 0.05
    settle_timeout: float = 120.0
    stall_seconds: float = 20.0  # no task ran for this long though some are missing: replace the worker
    seed: int = 1
    broker: str = "redis"  # or "rabbitmq": the system RabbitMQ, restarted with rabbitmqctl


@dataclass
class ChaosReport:
    scheduled: int
    executed: int
    waiting: int
    lost: int
    # of ``lost``: the tasks a forwarder's audit record shows the broker accepted (so the broker
    # or the worker lost them afterwards); a record can be missing (a forwarder killed before
    # its audit write), so this undercounts, never overcounts
    lost_after_broker_accepted: int
    lost_ids: list[str]
    duplicates: int
    dead_letters: int
    lateness_ms: dict[str, float]
    late_over_5s: int
    worst: list[dict[str, Any]]
    faults: dict[str, int]
    worker_restarts: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Forwarders:
    """``delayq forward`` processes through the proxies, killed and replaced on demand."""

    def __init__(self, env: CeleryRun, store_url: str, broker_url: str, count: int, logs: Path) -> None:
        self.args = ["forward", "--url", store_url]
        self.args += ["--prefix", env.prefix, "--shards", "4", "--celery-broker", broker_url]
        self.args += ["--audit-stream", audit_stream(env)]  # which tasks a broker accepted
        self.args += ["--lease", "3", "--poll", "0.2", "--log-every", "5"]
        self.env, self.logs = env.env, logs
        self.processes = Processes(grace=15)
        self.procs = [self._start(i) for i in range(count)]
        self.started = count

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        return self.processes.delayq(*self.args, env=self.env, log=self.logs / f"forwarder-{n}.log")

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.procs))
        self.procs[i].kill()
        self.procs[i].wait()
        self.procs[i] = self._start(self.started)
        self.started += 1

    def stop(self) -> None:
        self.processes.stop()


def redis_task_ids(url: str, queue: str) -> set[str]:
    """Ids of the task messages in ``queue`` (every priority list) and in the unacked hash of the
    kombu Redis transport at ``url``."""
    client = redis.Redis.from_url(url)
    raw = [m for key in client.scan_iter(match=f"{queue}*") for m in client.lrange(key, 0, -1)]
    raw += client.hvals("unacked")  # kombu's Redis transport: [message, exchange, routing_key]
    client.close()
    messages = (json.loads(blob) for blob in raw)
    return {str((m[0] if isinstance(m, list) else m).get("headers", {}).get("id")) for m in messages}


class _RedisBroker:
    """A Redis broker of the run's own, with AOF, restarted by SIGKILL and start."""

    kind = "redis"
    # the worker's unacked messages come back 10 s after a broker restart, not after an hour
    transport_options = {"visibility_timeout": 10, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}

    def __init__(self) -> None:
        self.server = EmbeddedServer(persist=True).start()
        self.port = self.server.port
        self.url = self.server.url

    def via(self, proxy: TcpProxy) -> str:
        return f"redis://127.0.0.1:{proxy.port}/0"

    def restart(self) -> None:
        self.server.kill()  # SIGKILL; AOF with appendfsync always has every acknowledged write
        self.server.start()

    def task_ids(self, queue: str) -> set[str]:
        return redis_task_ids(self.url, queue)

    def close(self, queue: str) -> None:
        self.server.stop()


class _RabbitBroker:
    """The system RabbitMQ: its application stopped and started again with ``rabbitmqctl``
    (durable queue, persistent messages: they survive)."""

    kind = "rabbitmq"
    transport_options: dict[str, Any] = {}

    def __init__(self) -> None:
        if not shutil.which("rabbitmqctl"):
            raise RuntimeError("the RabbitMQ chaos run restarts the broker with rabbitmqctl, which is not on PATH")
        self.url = AMQP_URL
        self.port = urlsplit(AMQP_URL).port or 5672

    def via(self, proxy: TcpProxy) -> str:
        parts = urlsplit(self.url)
        return parts._replace(netloc=f"{parts.netloc.rpartition('@')[0]}@127.0.0.1:{proxy.port}").geturl()

    def restart(self) -> None:
        for step in ("stop_app", "start_app"):
            subprocess.run(["rabbitmqctl", "-q", step], check=True, capture_output=True, timeout=60)

    def task_ids(self, queue: str) -> set[str]:
        """Ids of the messages left in ``queue``, read by taking them (the run is over)."""
        found: set[str] = set()
        with Connection(self.url) as conn:
            channel = conn.default_channel
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                found.add(str(message.headers.get("id")))
        return found

    def close(self, queue: str) -> None:
        with Connection(self.url) as conn:
            conn.default_channel.queue_delete(queue)


def run_chaos(plan: ChaosPlan, *, log: Callable[[str], None] = lambda _: None) -> ChaosReport:
    """Run ``plan``; see the module docstring."""
    rng = random.Random(plan.seed)
    logs = Path(tempfile.mkdtemp(prefix="delayq-chaos-"))
    started = time.monotonic()
    broker = _RabbitBroker() if plan.broker == "rabbitmq" else _RedisBroker()
    with EmbeddedServer() as records, EmbeddedServer(persist=True) as store:
        store_proxy, broker_proxy = TcpProxy("127.0.0.1", store.port), TcpProxy("127.0.0.1", broker.port)
        tag = uuid.uuid4().hex[:8]
        env = CeleryRun(
            kind=broker.kind,
            broker=broker.url,
            store=store.url,
            prefix=f"chaos{tag}",
            queue=f"chaos-{tag}",
            sink=f"chaos:{tag}:sink",
            backend=f"{records.url.rsplit('/', 1)[0]}/2",
            records_url=records.url,
            transport_options=dict(broker.transport_options),
        )
        forwarders: _Forwarders | None = None
        app = env.app()
        ids: set[str] = set()
        done: dict[str, int] = {}
        restarts = 0
        waiting: set[str] = set()
        lost: set[str] = set()
        accepted: set[str] = set()
        try:
            env.start_worker(logs)
            ids = {
                app.send_task("dqb.record", args=["chaos", i], countdown=1 + rng.uniform(0, plan.spread)).id
                for i in range(plan.tasks)
            }
            forwarders = _Forwarders(env, _url(store_proxy), broker.via(broker_proxy), plan.forwarders, logs)
            done = _inflict(plan, rng, forwarders, store, broker, store_proxy, broker_proxy, log)
            restarts = _settle(env, ids, plan, logs, log)
            forwarders.stop()  # nothing moves while the stragglers are looked for
            forwarders = None
            env.stop()
            missing = ids - {r["id"] for r in env.records()}
            waiting = _still_waiting(missing, app, broker.task_ids(env.queue)) if missing else set()
            lost = missing - waiting
            accepted = {r.id for r in read_stream(redis.Redis.from_url(store.url), audit_stream(env))} & lost
        finally:
            if forwarders is not None:
                forwarders.stop()
            env.stop()
            store_proxy.close()
            broker_proxy.close()
            broker.close(env.queue)
        runs = [r for r in env.records() if r["tag"] == "chaos"]
        counts = Counter(r["id"] for r in runs)
        late = sorted((r["started_ms"] - _eta_ms(r), r["started_ms"], r["id"]) for r in runs)
        dead = len(store_for(app).dead_letters(count=10_000))
        forget_store(app)
        return ChaosReport(
            scheduled=len(ids),
            executed=len(counts),
            waiting=len(waiting),
            lost=len(lost),
            lost_after_broker_accepted=len(accepted),
            lost_ids=sorted(lost),
            duplicates=sum(counts.values()) - len(counts),
            dead_letters=dead,
            lateness_ms=distribution([ms for ms, _, _ in late]),
            late_over_5s=sum(1 for ms, _, _ in late if ms > 5000),
            worst=[{"id": i, "late_ms": round(ms), "started_ms": start} for ms, start, i in late[-5:]],
            faults=done,
            worker_restarts=restarts,
            seconds=round(time.monotonic() - started, 1),
        )


def _settle(env: CeleryRun, ids: set[str], plan: ChaosPlan, logs: Path, log: Callable[[str], None]) -> int:
    """Wait until every task has run, or the deadline; returns how many times the worker was replaced.

    A Celery worker can stay connected but idle after a broker restart that found a task in
    flight (its prefetch bookkeeping after a reconnect; celery#9512 and kin). That is Celery's
    failure, not a lost job, so a worker that runs nothing for ``stall_seconds`` while tasks are
    missing is replaced by a fresh one, and the report counts it: the tasks it then runs were in
    the broker all along. A task the store or the forwarders lost stays missing however many
    workers run.
    """
    deadline = time.monotonic() + plan.settle_timeout
    seen, progress_at, restarts, replaced = -1, time.monotonic(), 0, False
    while time.monotonic() < deadline:
        ran = len(ids & {r["id"] for r in env.records()})
        if ran == len(ids):
            return restarts
        if ran != seen:
            seen, progress_at, replaced = ran, time.monotonic(), False
        elif time.monotonic() - progress_at > plan.stall_seconds and not replaced:
            # once per stall: if a fresh worker runs nothing either, the tasks are not in the broker
            log(f"chaos: nothing ran for {plan.stall_seconds:.0f} s, {len(ids) - ran} missing; replacing the worker")
            env.stop()
            restarts += 1
            env.start_worker(logs, name=f"worker{restarts}")
            replaced = True
        time.sleep(0.2)  # the poll interval of this wait, not a wait for something to happen
    log(f"chaos: timed out after {plan.settle_timeout:.0f} s waiting for every task")
    return restarts


def _eta_ms(record: dict[str, Any]) -> float:
    eta = parse_time(record["eta"])
    assert eta is not None, record
    return eta.timestamp() * 1000


def _still_waiting(missing: set[str], app: Any, in_broker: set[str]) -> set[str]:
    """The ``missing`` task ids still held somewhere: scheduled, leased or dead in the store, or
    queued or unacked in the broker. Whatever is in neither is lost."""
    if not missing:
        return set()
    store = store_for(app)
    found = {i for i in missing if store.get(i) is not None}
    found |= {d.id for d in store.dead_letters(count=len(missing) + 1000)} & missing
    return found | (in_broker & missing)


def audit_stream(env: CeleryRun) -> str:
    """The forwarders' audit stream of a run, on the store's server."""
    return f"{env.prefix}:audit"


def _url(proxy: TcpProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


def _inflict(
    plan: ChaosPlan,
    rng: random.Random,
    forwarders: _Forwarders,
    store: EmbeddedServer,
    broker: _RedisBroker | _RabbitBroker,
    store_proxy: TcpProxy,
    broker_proxy: TcpProxy,
    log: Callable[[str], None],
) -> dict[str, int]:
    """The faults of ``plan``, shuffled and spread evenly over the time the tasks fall due."""
    schedule = [kind for kind, n in plan.faults.items() for _ in range(n)]
    rng.shuffle(schedule)
    step = plan.spread / max(1, len(schedule))
    begin = time.monotonic()
    done: Counter[str] = Counter()
    for n, kind in enumerate(schedule):
        time.sleep(max(0.0, begin + 1 + n * step - time.monotonic()))  # the fault schedule itself
        if kind == "kill-forwarder":
            forwarders.kill_one(rng)
        elif kind.startswith(("cut-", "slow-")):
            proxy = broker_proxy if kind.endswith("broker") else store_proxy
            if kind.startswith("cut-"):
                proxy.cut()
                time.sleep(plan.cut_seconds)
                proxy.restore()
            else:  # every packet held slow_delay seconds for as long as a cut lasts
                proxy.delay = plan.slow_delay
                time.sleep(plan.cut_seconds)
                proxy.delay = 0.0
        elif kind == "restart-broker":
            broker.restart()
        else:
            store.kill()  # SIGKILL; AOF with appendfsync always has every acknowledged write
            store.start()
        done[kind] += 1
        log(f"chaos: {kind} ({n + 1}/{len(schedule)})")
    return dict(done)
