"""Entries as data with real processes: a ``celery -A … delayq forward`` and a ``celery worker``
already running, on each broker; an entry added, updated, paused, resumed, run now and removed
at runtime (through ``celery -A … delayq periodic`` and the Python API), each change effective
with no restart, within a second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from delayq_backends import DelayStore, Envelope
from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.periodic import entry_spec
from delayq_backends.embedded import EmbeddedServer, free_port
from delayq_backends.periodic import ops
from delayq_backends.periodic.firing import MANUAL
from delayq_backends.periodic.history import EntryHistory, RunRecord, read_history
from delayq_backends.periodic.schedules import Period, run_task_id
from delayq_backends.timeutil import now_ms
from tests.harness import Launcher
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, delayq_cli, new_env, running
from tests.test_metrics import listening, scrape

#: how late a run may start after its time: the forwarder is woken by the edit, the worker is idle
LATE_MS = 1000


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path) -> Iterator[CeleryEnv]:
    env = new_env(request.param, broker_url_for(request.param, request, valkey_server), valkey_server)
    with running(env, tmp_path, via_celery=True):  # worker_app: an empty beat_schedule, kept empty
        yield env


def _runs(env: CeleryEnv, tag: str) -> list[dict[str, Any]]:
    return [r for r in env.records() if r["tag"] == tag]


def _ids(env: CeleryEnv, tag: str) -> list[str]:
    return [r["id"] for r in _runs(env, tag)]


def _manual_runs(store: DelayStore) -> list[str]:
    return [run.run_id for run in read_history(store, "e").runs if run.kind == MANUAL]


def _update(app: Celery, every: float, tag: str) -> str:
    conf = {"task": "dqt.record", "schedule": every, "args": [tag], "options": {"delayq_misfire": "run_once"}}
    return ops.upsert(store_for(app), entry_spec(app, "e", conf))


def test_an_entry_added_at_runtime_is_edited_paused_resumed_run_and_removed(env: CeleryEnv) -> None:
    app = env.app()
    store = store_for(app)
    try:
        added = delayq_cli(env, "periodic", "add", "e", "--task", "dqt.record", "--every", "2", "--args", '["e"]')
        assert added.returncode == 0 and "added: e" in added.stdout, added.stderr
        first = ops.get(store, "e")
        assert first is not None and first.next_run_ms is not None and first.source == "runtime"
        due = first.next_run_ms
        wait_for(lambda: _runs(env, "e"), 10, "the added entry's first run")
        [run] = _runs(env, "e")[:1]
        assert run["id"] == run_task_id("e", Period(str(due), due))
        assert due <= run["started_ms"] <= due + LATE_MS, "fired at its time, no restart"

        # update: every 1 s, other args; its next run follows the new schedule at once
        edited = now_ms()
        assert _update(app, 1.0, "e1") == "changed"
        status, after = ops.get(store, "e"), now_ms()
        assert status is not None and status.next_run_ms is not None
        assert edited + 1000 <= status.next_run_ms <= after + 1000, "the next run follows the new schedule"
        wait_for(lambda: _runs(env, "e1"), 10, "a run of the new definition")
        assert _runs(env, "e1")[0]["started_ms"] <= after + 1000 + LATE_MS

        # pause: no run over three periods
        ops.pause(store, "e")
        paused = now_ms()
        time.sleep(3.0)  # three periods of the entry: what must not happen has had its chance
        assert [r for r in _runs(env, "e1") if r["started_ms"] > paused + LATE_MS] == []

        # resume: the periods missed while paused run once (run_once), at once
        resumed = now_ms()
        before = len(_runs(env, "e1"))
        ops.resume(store, "e")
        wait_for(lambda: len(_runs(env, "e1")) > before, 5, "the run after resume")
        assert _runs(env, "e1")[before]["started_ms"] <= resumed + LATE_MS

        # run now: one extra run; the schedule (now hourly) stays as it is
        assert _update(app, 3600.0, "e1") == "changed"
        hourly = ops.get(store, "e")
        assert hourly is not None and hourly.next_run_ms is not None
        asked = delayq_cli(env, "periodic", "run", "e")
        assert asked.returncode == 0, asked.stderr
        # the manual run by its id (a run of the 1 s schedule sent just before the update may land
        # meanwhile, so a count of runs would race it)
        wait_for(lambda: _manual_runs(store) != [], 10, "the manual run published")
        (manual,) = _manual_runs(store)
        wait_for(lambda: manual in _ids(env, "e1"), 10, "the manual run")
        time.sleep(0.5)
        assert _ids(env, "e1").count(manual) == 1 and _manual_runs(store) == [manual]
        assert ops.get(store, "e").next_run_ms == hourly.next_run_ms  # type: ignore[union-attr]

        # remove: gone from the store and the listing
        removed = delayq_cli(env, "periodic", "remove", "e")
        assert "removed: e" in removed.stdout, removed.stderr
        assert ops.get(store, "e") is None and ops.statuses(store) == []
    finally:
        forget_store(app)


def test_a_planned_pause_is_no_missed_period_and_its_resume_run_is_not_late(
    env: CeleryEnv, procs: Launcher, tmp_path: Path
) -> None:
    """Paused for three periods and resumed: the run the resume sends (run_once: the latest
    paused period's) is late only from the resume, and no paused period counts as missed, in
    the entry's history, its status and the exporter's ``delayq_periodic_missed_total`` that the
    shipped "missed a period" alert watches (it counted every paused period). What the runs
    since the resume owe is computed from their own records, so a run a loaded machine sent late
    counts as it should and nothing else does."""
    app = env.app()
    store = store_for(app)
    try:
        added = delayq_cli(env, "periodic", "add", "p", "--task", "dqt.record", "--every", "1", "--args", '["p"]')
        assert added.returncode == 0, added.stderr
        wait_for(lambda: _runs(env, "p"), 10, "the entry's first run")
        ops.pause(store, "p")
        time.sleep(3.5)  # three periods and more come due while paused
        before, asked = read_history(store, "p"), store.clock()
        ops.resume(store, "p")
        item = store.get(ops.item_id("p"))
        assert item is not None
        # the resume's time as the entry keeps it (a release before 0.4.0 kept none: when it was asked)
        resumed: int = Envelope.decode(item.envelope).meta["periodic"].get("resumed") or asked
        kept = {r.run_id for r in before.runs}

        def since() -> tuple[EntryHistory, list[RunRecord]]:
            history = read_history(store, "p")
            return history, sorted((r for r in history.runs if r.run_id not in kept), key=lambda r: r.due_ms)

        wait_for(lambda: any(r.published_ms for r in since()[1]), 10, "the resume's run published")
        ops.pause(store, "p")  # the counters stay as they are while the exporter is read
        port = free_port()
        args = ["--url", env.store, "--prefix", env.prefix, "--shards", str(store.config.shards), "--port", str(port)]
        listening(procs.delayq("exporter", *args), port)

        def served() -> tuple[float, float]:
            samples = {(s.name, s.labels.get("entry")): s.value for s in scrape(port) or []}
            return samples[("delayq_periodic_missed_total", "p")], samples[("delayq_periodic_late_total", "p")]

        wait_for(lambda: served() == (since()[0].missed, since()[0].late), 10, "the exporter serving the history")
        history, runs = since()
        # what they owe: late from the resume for a paused period's run; missed, the periods on
        # its 1 s grid from the resume on that no run went out for (none on a quiet machine)
        late = sum(r.published_ms - max(r.due_ms, resumed) > LATE_MS for r in runs if r.published_ms is not None)
        first = runs[0].due_ms + -((runs[0].due_ms - resumed) // 1000) * 1000  # the first period from the resume on
        after = [r for r in runs if r.due_ms >= resumed]
        unrun = (after[-1].due_ms - first) // 1000 + 1 - len(after) if after else 0
        assert (history.late - before.late, history.missed - before.missed) == (late, unrun), (resumed, runs)
        assert served() == (history.missed, history.late)
    finally:
        forget_store(app)
