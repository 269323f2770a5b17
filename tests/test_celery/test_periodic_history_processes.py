"""Periodic entries' history and dead-man's switch with real processes: a ``celery worker`` on a
Redis broker, ``celery -A … delayq forward`` and ``delayq exporter``. Every-second entries run;
their history shows each run's due, publish, start, end and outcome; a failing entry keeps no
success; a stopped worker makes the "no success for N periods" alert fire and a stopped
forwarder the "missed a period" one; garbage in the history keys stops neither."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.samples import Sample

from delayq_backends import DelayStore
from delayq_backends.embedded import EmbeddedServer, free_port
from delayq_backends.periodic.history import EntryHistory, history_keys, read_history
from delayq_backends.periodic.schedules import Period, run_task_id
from tests.harness import Proc, make_store
from tests.helpers import wait_for
from tests.test_celery.conftest import broker_url_for
from tests.test_celery.harness import CeleryEnv, delayq_cli, new_env, watched
from tests.test_metrics import listening, scrape, value

APP = "tests.test_celery.history_app"
#: the N of the "no success for N periods" rule (deploy/prometheus/delayq-alerts.yml)
NO_SUCCESS_PERIODS = 3


@pytest.fixture
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    env = new_env("redis", broker_url_for("redis", request, valkey_server), valkey_server)
    env.app_module = APP
    with watched(env):
        yield env


@pytest.fixture
def store(env: CeleryEnv) -> DelayStore:
    return make_store(env.store, env.prefix, shards=4)


def forwarder(env: CeleryEnv, tmp: Path, name: str = "forwarder") -> Proc:
    args = [sys.executable, "-m", "celery", "-A", APP, "delayq", "forward", "--poll", "0.2", "--lease", "2"]
    return env.start(args, name, tmp)


def exporter(env: CeleryEnv, tmp: Path) -> int:
    """Start ``delayq exporter`` on the env's store; its port, once it serves."""
    port = free_port()
    args = [sys.executable, "-m", "delayq_backends.cli", "exporter", "--url", env.store, "--prefix", env.prefix]
    listening(env.start(args + ["--shards", "4", "--port", str(port)], "exporter", tmp), port)
    return port


def successes(found: EntryHistory) -> list[int]:
    return [r.finished_ms for r in found.runs if r.outcome == "success" and r.finished_ms is not None]


def test_each_run_shows_due_published_started_finished_and_outcome(
    env: CeleryEnv, store: DelayStore, tmp_path: Path
) -> None:
    env.start_worker(tmp_path)
    forwarder(env, tmp_path)
    history: dict[str, EntryHistory] = {}

    def ran() -> bool:
        history.update({n: read_history(store, n) for n in ("tick", "boom")})
        done = [r for r in history["tick"].runs if r.outcome and r.published_ms]
        failed = [r for r in history["boom"].runs if r.outcome == "failure" and r.published_ms]
        return len(done) >= 3 and len(failed) >= 2

    wait_for(ran, 25, lambda: f"3 tick runs ended and 2 boom runs failed: {history}")
    tick, boom = history["tick"], history["boom"]
    ticked = {r["id"] for r in env.records() if r["tag"] == "tick"}
    for run in (r for r in tick.runs if r.outcome and r.published_ms):
        assert run.run_id == run_task_id("tick", Period(str(run.due_ms), run.due_ms)) and run.kind == "scheduled"
        assert run.outcome == "success" and run.run_id in ticked
        assert run.started_ms is not None and run.finished_ms is not None and run.published_ms is not None
        assert run.due_ms <= run.published_ms and run.lateness_ms == run.published_ms - run.due_ms
        assert run.due_ms <= run.started_ms <= run.finished_ms
    dues = [r.due_ms for r in tick.runs]
    assert dues == sorted(dues, reverse=True) and all((a - b) % 1000 == 0 for a, b in zip(dues, dues[1:]))
    assert tick.last_success_ms == max(successes(tick))
    assert boom.last_success_ms is None and not successes(boom)

    shown = delayq_cli(env, "periodic", "history", "tick", "--json", "--limit", "2")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert len(data["runs"]) == 2 and data["last_success"] >= tick.last_success_ms and data["missed"] == 0
    assert data["last_success_age_ms"] >= 0
    table = env.launcher.delayq(
        "periodic", "history", "boom", "--url", env.store, "--prefix", env.prefix, "--shards", "4", capture=True
    )
    out, err = table.communicate(timeout=30)
    assert table.returncode == 0, err
    assert b"failure" in out and b"last success never" in out
    unknown = delayq_cli(env, "periodic", "history", "nope")
    assert unknown.returncode == 1 and "periodic list" in unknown.stderr


def no_success_alert(samples: list[Sample], prefix: str, entry: str) -> bool:
    """DelayqPeriodicNoSuccess for one entry: overdue > N * period, and enabled."""
    key = {"prefix": prefix, "entry": entry}
    overdue, period = (
        value(samples, "delayq_periodic_overdue_seconds", **key),
        value(samples, "delayq_periodic_period_seconds", **key),
    )
    enabled = value(samples, "delayq_periodic_enabled", **key) == 1
    return overdue is not None and period is not None and enabled and overdue > NO_SUCCESS_PERIODS * period


def test_a_stopped_worker_fires_no_success_and_a_stopped_forwarder_missed_a_period(
    env: CeleryEnv, store: DelayStore, tmp_path: Path
) -> None:
    worker = env.start_worker(tmp_path)
    fwd = forwarder(env, tmp_path)
    port = exporter(env, tmp_path)
    tick = {"prefix": env.prefix, "entry": "tick"}
    samples: list[Sample] = []

    def scraped(check: Callable[[list[Sample]], object]) -> bool:
        samples[:] = scrape(port) or []
        return bool(check(samples))

    wait_for(
        lambda: scraped(lambda s: value(s, "delayq_periodic_last_success_timestamp_seconds", **tick)), 20, "a success"
    )
    assert value(samples, "delayq_periodic_period_seconds", **tick) == 1.0
    assert not no_success_alert(samples, env.prefix, "tick")

    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)
    last = read_history(store, "tick").last_success_ms
    wait_for(lambda: scraped(lambda s: no_success_alert(s, env.prefix, "tick")), 15, lambda: f"the alert: {samples}")
    assert value(samples, "delayq_periodic_last_success_timestamp_seconds", **tick) == (last or 0) / 1000
    assert (value(samples, "delayq_periodic_next_run_timestamp_seconds", **tick) or 0) > (last or 0) / 1000

    missed_before = value(samples, "delayq_periodic_missed_total", **tick) or 0
    fwd.send_signal(signal.SIGTERM)
    fwd.wait(timeout=30)
    stopped = store.server_time_ms()
    wait_for(lambda: store.server_time_ms() > stopped + 2500, 5, "two periods to pass with no forwarder")
    forwarder(env, tmp_path, "forwarder-again")
    # DelayqPeriodicMissedPeriod: increase(delayq_periodic_missed_total[15m]) > 0
    missed = lambda s: (value(s, "delayq_periodic_missed_total", **tick) or 0) > missed_before  # noqa: E731
    wait_for(lambda: scraped(missed), 15, lambda: f"a missed period counted: {samples}")


def test_garbage_in_history_keys_never_stops_a_firing_or_a_worker(
    env: CeleryEnv, store: DelayStore, tmp_path: Path
) -> None:
    """Hand writes in both history keys (another type, records and counters that are no data)
    before and while the entries run: every run still goes and the history mends itself."""
    c = store.client
    (tick_hist, tick_runs), (boom_hist, boom_runs) = history_keys(store, "tick"), history_keys(store, "boom")
    c.set(tick_hist, "hand write")
    c.rpush(tick_runs, "a", "list")
    c.hset(boom_hist, mapping={"missed": "many", "late": "-", "last_success": "yesterday", "run:x": "{no json"})
    c.zadd(boom_runs, {"x": 1})
    env.start_worker(tmp_path)
    fwd = forwarder(env, tmp_path)

    def ticks() -> int:
        return sum(1 for r in env.records() if r["tag"] == "tick")

    wait_for(lambda: successes(read_history(store, "tick")), 20, "a tick success in the mended history")
    boom = read_history(store, "boom")
    assert boom.last_success_ms is None and [r.run_id for r in boom.runs if r.run_id == "x"] == []
    seen, written = ticks(), store.server_time_ms()
    c.delete(tick_runs)
    c.set(tick_runs, "again")  # while running

    def mended() -> bool:
        return ticks() >= seen + 2 and any(t > written for t in successes(read_history(store, "tick")))

    wait_for(mended, 15, "runs to go on and be recorded again")
    assert fwd.poll() is None
