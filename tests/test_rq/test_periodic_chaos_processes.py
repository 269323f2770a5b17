"""Edits under fire for RQ entries (issue 25's second goal), with real processes: two ``delayq
forward --rq-redis`` and a real ``rq worker``; one forwarder SIGKILLed and restarted every few
seconds while runtime entries (``rq.cron.entry(...).spec(source="runtime")`` and
``ops.upsert``) are flipped between 1 s and 2 s, paused and resumed, run now and given new
arguments (the scenario of :class:`tests.harness.periodic_chaos.Scenario`).

The allowance is Celery's (tests/test_celery/test_periodic_chaos_processes.py): every period of
every schedule in force of the ``run_all`` entries ran once; the ``run_once`` entry lost at most
``ceil(lease / period) = 2`` periods a kill; nothing went out while paused; each run now ran
once; no period of a replaced schedule ran after its update returned; no run carried older
arguments. And no run ran twice at all: a period sent again writes a job whose hash exists, which
``rq_run.lua`` does not push again.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from delayq_backends import DelayStore
from delayq_backends.periodic import ops
from delayq_backends.periodic.ops import EntrySpec
from delayq_backends.periodic.schedules import Misfire
from delayq_backends.rq.cron import entry
from tests.harness import Proc
from tests.harness.periodic_chaos import ENTRIES, Chaos, RunRecord, Scenario, next_slot_ms, unique_runs
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"
#: the forwarders' store lease (s)
LEASE_S = 2


def test_rq_entries_edited_paused_and_run_now_while_a_forwarder_is_killed_again_and_again(
    rq_store: DelayStore, processes: Processes, prefix: str, tmp_path: Path
) -> None:
    queue, conn = f"{prefix}-chaos", rq_store.client

    def spec(name: str, every: float, tag: str) -> EntrySpec:
        policy = ENTRIES[name.removeprefix(f"{prefix}-")][1]
        made = entry(name, RECORD, queue, interval=every, misfire=Misfire(policy), args=(tag,))
        return made.spec(source="runtime")

    def forwarder(name: str) -> Proc:
        args = ["forward", "--url", processes.url, "--rq-redis", processes.url, "--poll", "0.2"]
        args += ["--lease", str(LEASE_S), "--log-level", "info"]
        return processes.launcher.delayq(*args, env=processes.env, log=tmp_path / f"{name}.log")

    def recorded() -> list[RunRecord]:
        return [
            RunRecord.parse(r["id"], r["periodic"], int(r["at"] * 1000), r["tag"], int(r["sent"] * 1000))
            for r in runs(conn, queue)  # type: ignore[arg-type]
            if "periodic" in r
        ]

    processes.worker(queue)
    aims = [f"{prefix}-{name}" for name in ("flip", "once", "args", "flip", "pauser")]
    chaos = Chaos(forwarder, processes.launcher.kill, rq_store, tmp_path.joinpath, aims)
    try:
        scenario = Scenario(chaos, rq_store, spec, label=f"{prefix}-")
        steps = scenario.steps()
        seed = int(os.environ.get("DQT_CHAOS_SEED", "0")) or int.from_bytes(os.urandom(4), "big")
        print(f"chaos seed {seed} (DQT_CHAOS_SEED reruns it)")
        chaos.run(16, steps, step_s=0.6, kill_s=3.0, seed=seed)
        scenario.finish()
        wait_for(lambda: all(s.state == "scheduled" for s in ops.statuses(rq_store)), 10, "every entry rearmed")
        for proc in chaos.forwarders:
            proc.terminate()
            proc.wait(timeout=30)
        final = {s.name: s for s in ops.statuses(rq_store)}
        ends = {name: next_slot_ms(rq_store, name) for name in final}
        once = scenario.name("once")
        expected = sum(s.runs for s in final.values()) + len(chaos.of(once, "run_now"))
        wait_for(lambda: len(recorded()) >= expected, 30, lambda: f"{expected} runs, got {len(recorded())}")
        time.sleep(1.0)  # a run sent by a firing whose rearm a kill stopped is in by now
        done, repeated = unique_runs(recorded())
        assert repeated == {} and len(done) >= expected, (repeated, len(done), expected)
        missing = scenario.check(done, ends, {once: chaos.kills * math.ceil(LEASE_S / 1.0)})
        print(f"{chaos.summary()}, {len(done)} runs; once: {len(missing[once])} periods lost")
        assert chaos.kills >= 4
    except BaseException:
        print(processes.launcher.tail())
        raise
