"""Edits under fire (issue 25's second goal), with real processes: two ``celery -A … delayq
forward`` and a ``celery worker``; one forwarder SIGKILLed and restarted every few seconds while
the test, through ``delayq_backends.periodic.ops``, flips an entry's schedule between 1 s and
2 s, pauses and resumes another, runs a third now and changes a fourth's arguments. Each kill
comes as a forwarder claims an entry (half the time the killed one: mid-firing), and ``flip`` or
``args``, when aimed at, is edited at once, while the dead holder's lease runs. Every run the
worker executed is recorded with its ``delayq_periodic`` mark (entry, period, kind).

The allowance, from docs/celery-periodic.md "The guarantee, as tested":

- ``run_all`` entries (``tick`` from ``beat_schedule``, ``flip``, ``pauser``, ``args``): every
  period of every schedule in force runs, exactly once, whatever the kills (the schedule is
  exactly-once; a killed holder's periods run when its lease runs out);
- ``once`` (``run_once``): a forwarder killed after claiming it but before firing it holds it
  for the store's lease (``--lease 2``), and the periods due meanwhile collapse into one run: at
  most ``ceil(2 s / 1 s) = 2`` periods lost per kill;
- ``skip`` (overlap ``skip``): a period skipped while the previous run still held the entry's
  slot is counted, so the periods lost are at most the entry's ``skipped`` count (plus, as
  ``once``, 1 a kill: its lease is the store's);
- a period sent twice (a kill between the broker's confirm and the rearm) runs twice with one
  task id: at most one such period per kill.

And: nothing of ``pauser`` went out while it was paused; each run now ran once; no period of a
schedule ran once the update replacing it had returned; no run carried arguments older than
the last change that returned before its period.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq_backends import DelayStore
from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.periodic import entry_spec
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.periodic import ops
from delayq_backends.periodic.ops import EntrySpec, item_id
from tests.harness.periodic_chaos import (
    ENTRIES,
    Chaos,
    Epoch,
    RunRecord,
    Scenario,
    check_periods,
    next_slot_ms,
    unique_runs,
)
from tests.helpers import wait_for
from tests.test_celery.conftest import broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, watched

APP = "tests.test_celery.periodic_app"  # its beat_schedule: ``tick``, every DQT_EVERY s, run_all
#: the forwarders' store lease (s): how long a forwarder killed before firing an entry holds it
LEASE_S = 2
#: misfire policies of the runtime entries (``skip`` has overlap policy skip, every 2 s)
POLICIES = {**{name: policy for name, (_, policy) in ENTRIES.items()}, "skip": "run_all"}


@pytest.fixture
def env(
    request: pytest.FixtureRequest, valkey_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CeleryEnv]:
    kind = getattr(request, "param", "redis")
    monkeypatch.setenv("DQT_EVERY", "1")
    env = new_env(kind, broker_url_for(kind, request, valkey_server), valkey_server)
    env.app_module = APP
    with watched(env):
        yield env


def _records(env: CeleryEnv) -> list[RunRecord]:
    return [
        RunRecord.parse(r["id"], r["periodic"], r["started_ms"], r["args"][0]) for r in env.records() if r["periodic"]
    ]


def _edits_under_fire(env: CeleryEnv, tmp: Path, seconds: float) -> None:
    app = env.app()
    store = store_for(app)

    def spec(name: str, every: float, tag: str) -> EntrySpec:
        options = {"delayq_misfire": POLICIES[name], "delayq_overlap": "skip" if name == "skip" else "allow"}
        return entry_spec(app, name, {"task": "dqt.record", "schedule": every, "args": [tag], "options": options})

    try:
        env.start_worker(tmp)
        args = [sys.executable, "-m", "celery", "-A", APP, "delayq", "forward", "--poll", "0.2"]
        args += ["--lease", str(LEASE_S), "--log-every", "5"]
        aims = ["flip", "once", "args", "flip", "tick", "skip", "flip", "pauser"]
        chaos = Chaos(lambda name: env.start(args, name, tmp), env.launcher.kill, store, tmp.joinpath, aims)
        wait_for(lambda: store.get(item_id("tick")) is not None, 30, "the first sync")
        scenario = Scenario(chaos, store, spec)
        steps = scenario.steps()
        scenario.upsert("skip", 2.0)
        seed = int(os.environ.get("DQT_CHAOS_SEED", "0")) or int.from_bytes(os.urandom(4), "big")
        print(f"chaos seed {seed} (DQT_CHAOS_SEED reruns it)")
        chaos.run(seconds, steps, step_s=0.6, kill_s=3.0, seed=seed)
        scenario.finish()
        wait_for(lambda: all(s.state == "scheduled" for s in ops.statuses(store)), 10, "every entry fired and rearmed")
        for proc in chaos.forwarders:
            proc.terminate()
            proc.wait(timeout=30)
        _check(env, store, scenario)
    finally:
        forget_store(app)


def _check(env: CeleryEnv, store: DelayStore, scenario: Scenario) -> None:
    chaos = scenario.chaos
    final = {s.name: s for s in ops.statuses(store)}
    ends = {name: next_slot_ms(store, name) for name in final}
    expected = sum(s.runs for s in final.values()) + len(chaos.of("once", "run_now"))
    wait_for(lambda: len({r.id for r in _records(env)}) >= expected, 30, lambda: f"{expected} runs in the sink")
    time.sleep(1.0)  # a run sent twice, or sent by a firing whose rearm a kill stopped, is in by now
    runs, repeated = unique_runs(_records(env))
    # more than counted: a run sent by a firing killed before its rearm (the checks below place it)
    assert len(runs) >= expected, f"{len(runs)} distinct runs, the entries count {expected}"
    assert len(repeated) <= chaos.kills and all(n == 2 for n in repeated.values()), repeated
    tick = sorted(r.due_ms for r in runs if r.entry == "tick")
    check_periods("tick", runs, [Epoch(1000, tick[0], 0, 0)], ends["tick"])
    allowed = {"once": chaos.kills * math.ceil(LEASE_S / 1.0), "skip": final["skip"].skipped + chaos.kills}
    missing = scenario.check(runs, ends, allowed)
    print(
        f"{chaos.summary()}, {len(runs)} runs, sent twice: {len(repeated)}; "
        f"once: {len(missing['once'])} periods collapsed; skip: {len(missing['skip'])} not run, "
        f"{final['skip'].skipped} counted skipped"
    )
    assert chaos.kills >= 5


def test_entries_edited_paused_and_run_now_while_a_forwarder_is_killed_again_and_again(
    env: CeleryEnv, tmp_path: Path
) -> None:
    _edits_under_fire(env, tmp_path, 22)


@pytest.mark.slow
@pytest.mark.parametrize("env", ["redis", "rabbitmq"], indirect=True)
def test_edits_under_fire_soak(env: CeleryEnv, tmp_path: Path) -> None:
    """The same for 90 s, on each broker."""
    _edits_under_fire(env, tmp_path, 90)
