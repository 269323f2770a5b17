"""Periodic entries with real processes: two ``celery -A … delayq forward`` and a worker, no
``celery beat``; forwarders SIGKILLed and restarted while an every-2-seconds entry runs. Each
period runs once, none twice, none early, none lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.periodic import sync
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.keys import periodic_key
from delayq_backends.periodic.ops import item_id, statuses
from delayq_backends.periodic.schedules import Period, run_task_id
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, delayq_cli, delete_queue, new_env

EVERY_MS = 2000
APP = "tests.test_celery.periodic_app"


@pytest.fixture(params=BROKERS)
def env(
    request: pytest.FixtureRequest, valkey_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CeleryEnv]:
    monkeypatch.setenv("DQT_EVERY", str(EVERY_MS / 1000))
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    env.app_module = APP
    try:
        yield env
    finally:
        env.stop()
        delete_queue(env)


def _forwarder(env: CeleryEnv, tmp: Path, name: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "celery", "-A", APP, "delayq", "forward"]
    return env.start(args + ["--poll", "0.2", "--lease", "2", "--log-every", "5"], name, tmp)


@pytest.mark.alone  # SIGKILLs timed against periods
def test_two_forwarders_fire_each_period_once_through_sigkills(env: CeleryEnv, tmp_path: Path) -> None:
    app = env.app()
    try:
        env.start_worker(tmp_path)
        forwarders = [_forwarder(env, tmp_path, "forwarder-a"), _forwarder(env, tmp_path, "forwarder-b")]
        store = store_for(app)
        wait_for(lambda: store.get(item_id("tick")) is not None, 30, "the first sync")
        started = time.monotonic()
        for i, at in enumerate((5.0, 10.3)):  # SIGKILL one, then the other, each restarted at once
            time.sleep(max(0.0, started + at - time.monotonic()))
            victim = forwarders[i]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            forwarders[i] = _forwarder(env, tmp_path, f"forwarder-{'ab'[i]}-again")
        time.sleep(max(0.0, started + 16 - time.monotonic()))
        for proc in forwarders:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        [status] = statuses(store)
        assert status.runs >= 6, status  # 16 s at 2 s, minus at most two lease expiries of 2 s
        current = store.get(item_id("tick"))
        assert current is not None
        slots = [Period(str(at), at) for at in range(current.ready_ms - EVERY_MS * 200, current.ready_ms, EVERY_MS)]
        by_id = {run_task_id("tick", s): s for s in slots}

        def ticks() -> list[dict[str, object]]:
            return [r for r in env.records() if r["tag"] == "tick"]

        wait_for(lambda: len(ticks()) >= status.runs, 60, lambda: f"{status.runs} runs, got {len(ticks())}")
        runs = ticks()
        ids = [str(r["id"]) for r in runs]
        assert len(ids) == len(set(ids)), "a period ran twice"
        periods = sorted(by_id[i].at_ms for i in ids)
        # every period from the first to the last ran: none skipped by the kills
        assert periods == list(range(periods[0], periods[-1] + EVERY_MS, EVERY_MS))
        assert len(periods) == status.runs
        assert all(int(r["started_ms"]) >= by_id[str(r["id"])].at_ms for r in runs)  # type: ignore[call-overload]
        restarted = (tmp_path / "forwarder-a-again.log").read_text()
        assert "0 added, 0 changed, 1 unchanged" in restarted  # the restart's sync changed nothing
    except BaseException:
        print(env.tail())
        raise
    finally:
        forget_store(app)


def test_periodic_commands(valkey_server: EmbeddedServer, tmp_path: Path) -> None:
    """`celery -A proj delayq periodic sync|list|remove` and `delayq periodic list`."""
    env = new_env("redis", broker_url_for("redis", None, valkey_server), valkey_server)  # type: ignore[arg-type]
    env.app_module = APP

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        return delayq_cli(env, "periodic", *args)

    synced = celery("sync")
    assert synced.returncode == 0, synced.stderr
    assert "added: tick" in synced.stdout and "1 added" in synced.stderr
    assert "1 unchanged" in celery("sync").stderr
    listed = json.loads(celery("list", "--json").stdout)
    assert [(e["name"], e["task"], e["schedule"], e["state"]) for e in listed] == [
        ("tick", "dqt.record", "every 2s", "scheduled")
    ]
    plain = [sys.executable, "-m", "delayq_backends.cli", "periodic", "list", "--url", env.store]
    plain += ["--prefix", env.prefix, "--shards", "4"]
    table = subprocess.run(plain, env=env.env, capture_output=True, text=True, timeout=60, check=False)
    assert table.returncode == 0 and "tick" in table.stdout and "run_all" in table.stdout, table.stderr
    refused = celery("remove", "tick")
    assert refused.returncode == 1 and "--force" in refused.stderr, refused.stderr  # a sync adds it back
    assert "removed: tick" in celery("remove", "tick", "--force").stdout
    assert json.loads(celery("list", "--json").stdout) == []


def test_plain_delayq_forward_fires_periodic_entries(valkey_server: EmbeddedServer, tmp_path: Path) -> None:
    """`delayq forward --celery-broker` (no app loaded) fires entries a sync stored."""
    env = new_env("redis", broker_url_for("redis", None, valkey_server), valkey_server)  # type: ignore[arg-type]
    env.app_module = APP
    synced = delayq_cli(env, "periodic", "sync")
    assert synced.returncode == 0, synced.stderr
    broker = redis.Redis.from_url(env.broker)
    try:
        env.start_forwarder(tmp_path)  # `delayq forward --celery-broker …`
        wait_for(lambda: broker.llen(env.queue) >= 2, 30, "two runs of the entry in the broker's queue")
    except BaseException:
        print(env.tail())
        raise
    finally:
        env.stop()


def test_a_garbage_registry_field_is_named_and_skipped_by_sync_and_list(
    valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    """A non-UTF-8 registry field (a hand write) no longer breaks `periodic list` nor the sync a
    forwarder runs at start: it is named with the HDEL that removes it, and an entry removed from
    beat_schedule is still removed."""
    env = new_env("redis", broker_url_for("redis", None, valkey_server), valkey_server)  # type: ignore[arg-type]
    env.app_module = APP
    app = env.app()
    try:
        stale = Celery("stale", broker="memory://", set_as_current=False)
        stale.conf.beat_schedule = {"gone": {"task": "dqt.record", "schedule": 3600}}
        store = store_for(app)
        assert sync(stale, store).added == ["gone"]
        registry = periodic_key(env.prefix)
        store.client.hset(registry, b"\xff\xfebad", b"x")
        synced = delayq_cli(env, "periodic", "sync")  # exits 1: something is left to fix
        assert synced.returncode == 1 and "1 added" in synced.stderr, synced.stderr
        assert "removed: gone" in synced.stdout and store.get(item_id("gone")) is None
        assert f'redis-cli HDEL {registry} "\\xff\\xfebad"' in synced.stderr
        listed = delayq_cli(env, "periodic", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        entries = {e["name"]: e["state"] for e in json.loads(listed.stdout)}
        assert entries["tick"] == "scheduled" and "HDEL" in entries['"\\xff\\xfebad"']
        assert len(entries) == 2
    finally:
        forget_store(app)


def test_a_forwarder_killed_while_firing_costs_the_entry_one_short_lease(
    env: CeleryEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: with the default 30 s lease, a forwarder SIGKILLed while firing an entry held it
    for 30 s, and ``run_once`` then collapsed the periods due meanwhile into one run. The entry's
    lease is half its period now (4 s of 8 s): the next forwarder fires it again before its next
    period, and no period is lost."""
    every_ms = 8000
    monkeypatch.setenv("DQT_EVERY", str(every_ms / 1000))
    monkeypatch.setenv("DQT_MISFIRE", "run_once")
    app = env.app()
    try:
        env.start_worker(tmp_path)
        store = store_for(app)
        crash = env.start([sys.executable, "-m", "tests.test_celery.crash_periodic_forwarder"], "crashing", tmp_path)
        assert crash.wait(timeout=60) == -signal.SIGKILL, "it fires the entry (and dies)"
        forwarder = env.start(
            [sys.executable, "-m", "celery", "-A", APP, "delayq", "forward", "--poll", "0.2"], "f", tmp_path
        )
        wait_for(lambda: statuses(store)[0].runs >= 2, 25, lambda: f"two runs after the kill: {statuses(store)}")
        forwarder.send_signal(signal.SIGTERM)
        forwarder.wait(timeout=30)
        [status] = statuses(store)
        current = store.get(item_id("tick"))
        assert current is not None
        slots = [Period(str(at), at) for at in range(current.ready_ms - every_ms * 20, current.ready_ms, every_ms)]
        by_id = {run_task_id("tick", s): s.at_ms for s in slots}
        wait_for(lambda: len({r["id"] for r in env.records() if r["tag"] == "tick"}) >= status.runs, 30, "the runs")
        periods = sorted({by_id[str(r["id"])] for r in env.records() if r["tag"] == "tick"})
        # the killed forwarder's period, then each one: none collapsed while its lease ran out
        assert periods == list(range(periods[0], periods[-1] + every_ms, every_ms)) and len(periods) >= 2, periods
    except BaseException:
        print(env.tail())
        raise
    finally:
        forget_store(app)
