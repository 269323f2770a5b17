"""A periodic entry's run options (``periodic/options.py``) reach a real ``celery worker``: an entry
added with ``celery -A … delayq periodic add --expires --priority --headers --exchange
--routing-key`` is fired by a real forwarder, and the worker's request has them; and an
every-second entry with ``expires`` queues no stale runs while the workers are down (7 s):
the runs sent meanwhile expire at the worker instead of running late."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange

from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.periodic import entry_spec
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.periodic import ops
from delayq_backends.periodic.state import CODE
from delayq_backends.timeutil import now_ms
from tests.harness import Proc
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, delayq_cli, new_env, watched


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    with watched(env):  # each test starts its own worker and forwarder
        yield env


def _worker(env: CeleryEnv, tmp: Path, *queues: str) -> Proc:
    """A ``celery worker`` on the env's queue and ``queues`` (it declares their exchanges)."""
    node = f"w-{uuid.uuid4().hex[:6]}@dqt"
    args = [sys.executable, "-m", "celery", "-A", env.app_module, "worker", "-P", "threads", "-c", "4"]
    args += ["-Q", ",".join([env.queue, *queues]), "-n", node, "--without-gossip", "--without-mingle"]
    proc = env.start(args, f"worker-{node}", tmp)
    env.nodes.append(node)
    env.wait_ready(proc)
    return proc


def _runs(env: CeleryEnv, tag: str) -> list[dict[str, Any]]:
    return [r for r in env.records() if r["tag"] == tag]


def test_a_runs_expires_priority_headers_and_routing_reach_the_worker(env: CeleryEnv, tmp_path: Path) -> None:
    alt = f"{env.queue}-alt"
    _worker(env, tmp_path, alt)
    env.start_forwarder(tmp_path, via_celery=True)
    added = delayq_cli(
        env, "periodic", "add", "opt", "--task", "dqt.record", "--every", "3600", "--args", '["opt"]',
        "--expires", "300", "--priority", "7", "--headers", '{"x_custom": "from-entry"}',
        "--exchange", alt, "--routing-key", alt,
    )  # fmt: skip
    assert added.returncode == 0 and "added: opt" in added.stdout, added.stderr
    app = env.app()
    store = store_for(app)
    shown = ops.get(store, "opt")
    assert shown is not None and shown.options == {
        "expires": 300.0, "priority": 7, "headers": {"x_custom": "from-entry"}, "exchange": alt, "routing_key": alt,
    }  # fmt: skip
    sent = now_ms()
    ops.run_now(store, "opt")
    wait_for(lambda: _runs(env, "opt"), 20, "the run")
    [run] = _runs(env, "opt")
    assert run["priority"] == 7 and run["custom"] == "from-entry"
    assert run["routing_key"] == alt, "the worker got it from the entry's exchange and routing key"
    if env.kind == "rabbitmq":  # kombu's Redis transport does not say which exchange a message came by
        assert run["exchange"] == alt
    expires_ms = datetime.fromisoformat(run["expires"]).timestamp() * 1000
    assert sent + 300_000 <= expires_ms <= now_ms() + 300_000, "expires counted from the run's own send"
    forget_store(app)


def test_an_every_second_entry_with_expires_queues_no_stale_runs_while_workers_are_down(
    env: CeleryEnv, tmp_path: Path
) -> None:
    worker = _worker(env, tmp_path)
    env.start_forwarder(tmp_path, via_celery=True)
    added = delayq_cli(
        env, "periodic", "add", "tick", "--task", "dqt.record", "--every", "1", "--args", '["tick"]', "--expires", "1.5"
    )
    assert added.returncode == 0, added.stderr
    wait_for(lambda: len(_runs(env, "tick")) >= 2, 20, "runs while the worker is up")
    env.launcher.stop(worker, timeout=30)
    down = now_ms()
    time.sleep(7.0)  # the outage: seven periods are sent to the broker meanwhile
    up = now_ms()
    _worker(env, tmp_path)
    wait_for(lambda: any(r["periodic"]["due"] > up for r in _runs(env, "tick")), 20, "a run after the restart")
    time.sleep(1.0)  # the queued runs have all been received by now (and run, had they not expired)
    stale = [r for r in _runs(env, "tick") if down + 500 < r["periodic"]["due"] < up - 2000]
    assert stale == [], f"{len(stale)} runs sent during the outage ran late: {stale}"


def test_a_beat_schedule_entrys_options_are_read_back_and_what_celery_alone_takes_still_syncs() -> None:
    """A ``beat_schedule`` entry's run options are kept to read back; one the table cannot hold
    (a kombu ``Exchange``, a header JSON cannot carry) is sent as Celery takes it, not refused."""
    app = Celery("opts", broker="memory://", set_as_current=False)
    conf = {"task": "t.x", "schedule": 60.0, "options": {"priority": 3, "exchange": Exchange("ex"), "expires": 20}}
    spec = entry_spec(app, "x", conf, source=CODE)
    assert spec.options.given() == {"priority": 3, "exchange": "ex", "expires": 20.0}
    assert spec.template.expires == 20.0
    odd = entry_spec(app, "y", {**conf, "options": {"headers": {"at": datetime(2030, 1, 1)}}}, source=CODE)
    assert odd.options.given() == {} and odd.template.envelope.body
