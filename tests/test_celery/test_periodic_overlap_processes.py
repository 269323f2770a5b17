"""Overlap policies with real processes, on both brokers (RabbitMQ marked slow): ``celery -A … delayq forward`` (with
its metrics endpoint) and a 4-thread ``celery worker`` running three entries every 2 s whose
task takes longer than that (``overlap_app``). By the start and end times the tasks record:
under ``skip`` and ``buffer_one`` no two runs of an entry overlap, and each period either ran
or was counted skipped; under ``allow`` they overlap (what the other two would do unchecked)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq_backends.celery import forget_store, store_for
from delayq_backends.embedded import EmbeddedServer, free_port
from delayq_backends.periodic.ops import EntryStatus, statuses
from delayq_backends.periodic.schedules import Period, run_task_id
from tests.helpers import max_overlap, wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, watched
from tests.test_celery.overlap_entries import EVERY, HOLDS
from tests.test_metrics import scrape, value

EVERY_MS = int(EVERY * 1000)
#: how long the entries fire before the snapshot the assertions are made on
FIRING_S = 13


#: RabbitMQ in the slow run: each broker costs ~25 s, and the policies live in the forwarder and the
#: worker, not the broker (the default run keeps the Redis broker)
PARAMS = [pytest.param(b, marks=pytest.mark.slow) if b == "rabbitmq" else b for b in BROKERS]


@pytest.fixture(params=PARAMS)
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path) -> Iterator[CeleryEnv]:
    kind = request.param
    env = new_env(kind, broker_url_for(kind, request, valkey_server), valkey_server)
    env.app_module = "tests.test_celery.overlap_app"
    with watched(env):
        env.start_worker(tmp_path)
        yield env


def _snapshot(store: Any) -> dict[str, EntryStatus]:
    """Every entry, read while none is being fired (its count and next period agree)."""
    found: dict[str, EntryStatus] = {}

    def settled() -> bool:
        found.clear()
        found.update((s.name, s) for s in statuses(store))
        return len(found) == len(HOLDS) and all(s.state == "scheduled" for s in found.values())

    wait_for(settled, 10, lambda: f"entries at rest: {found}", interval=0.05)
    return found


def _runs(env: CeleryEnv, policy: str, status: EntryStatus) -> tuple[list[int], list[dict[str, Any]]]:
    """The entry's periods up to the snapshot, and the runs of them the tasks recorded (by start)."""
    assert status.next_run_ms is not None
    periods = {
        run_task_id(status.name, Period(str(at), at)): at
        for at in range(status.next_run_ms - EVERY_MS * 60, status.next_run_ms, EVERY_MS)
    }
    runs = sorted((r for r in env.records() if r["tag"] == policy and r["id"] in periods), key=lambda r: r["began_ms"])
    assert runs, f"no run of {policy}"
    first = periods[runs[0]["id"]]
    return list(range(first, status.next_run_ms, EVERY_MS)), runs


def test_skip_and_buffer_one_never_overlap_and_count_what_they_skip(env: CeleryEnv, tmp_path: Path) -> None:
    app = env.app()
    try:
        port = free_port()
        args = ["--poll", "0.2", "--log-every", "5", "--metrics-port", str(port)]
        command = [sys.executable, "-m", "celery", "-A", env.app_module, "delayq", "forward"]
        env.start([*command, *args], "forwarder", tmp_path)
        store = store_for(app)
        wait_for(lambda: len(statuses(store)) == len(HOLDS), 30, "the sync at the forwarder's start")
        time.sleep(FIRING_S)
        snap = _snapshot(store)
        want = {policy: snap[f"hold-{policy}"].runs for policy in HOLDS}
        have = lambda p: sum(1 for r in env.records() if r["tag"] == p)  # noqa: E731
        wait_for(lambda: all(have(p) >= n for p, n in want.items()), 30, lambda: f"runs {want}")

        for policy in HOLDS:  # what was measured (shown with -s)
            status = snap[f"hold-{policy}"]
            seen, ran = _runs(env, policy, status)
            print(f"{env.kind} {policy}: {len(seen)} periods, {len(ran)} runs, {status.skipped} skipped")
        periods, runs = _runs(env, "skip", snap["hold-skip"])
        spans = [(r["began_ms"], r["ended_ms"]) for r in runs]
        assert max_overlap(spans) == 1
        assert all(b[0] - a[0] >= 5000 for a, b in zip(spans, spans[1:])), spans
        skipped = snap["hold-skip"].skipped
        assert len(runs) >= 2 and skipped >= 2 * (len(runs) - 1), (len(runs), skipped)
        assert len(runs) + skipped == len(periods)  # each period ran or was counted skipped

        periods, runs = _runs(env, "buffer_one", snap["hold-buffer_one"])
        spans = [(r["began_ms"], r["ended_ms"]) for r in runs]
        assert max_overlap(spans) == 1 and len(runs) >= 2
        gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        assert all(gap < 1500 for gap in gaps), gaps  # the one waiting starts right after the run ends
        skipped = snap["hold-buffer_one"].skipped
        assert skipped >= 1 and len(runs) + skipped == len(periods), (len(runs), skipped, len(periods))

        periods, runs = _runs(env, "allow", snap["hold-allow"])
        assert max_overlap([(r["began_ms"], r["ended_ms"]) for r in runs]) >= 2
        assert snap["hold-allow"].skipped == 0 and len(runs) == len(periods)

        samples = scrape(port) or []
        counted = value(samples, "delayq_periodic_skipped_total", entry="hold-skip")
        assert counted is not None and counted >= snap["hold-skip"].skipped
        assert value(samples, "delayq_periodic_skipped_total", entry="hold-allow") is None
    finally:
        forget_store(app)
