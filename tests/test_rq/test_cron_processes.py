"""A user's ``rq cron`` config run by real processes: two ``delayq forward --rq-redis … --rq-cron
config.py`` and a real ``rq worker``, no ``rq cron``; one forwarder SIGKILLed and restarted
while an every-second interval entry and an every-2-seconds cron string (with seconds) run.
Each period runs once (counted by the runs' job ids, ``uuid5(name, period)``), none twice, none
lost, none early; and the ``delayq rq-cron sync`` command."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from delayq_backends import DelayStore
from delayq_backends.periodic.ops import get, item_id
from delayq_backends.periodic.schedules import Period, run_task_id
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for

CONFIG = """
    from rq import cron
    from delayq_backends.rq import cron as delayq_cron
    from tests.test_rq.jobs import record

    delayq_cron.register(record, "{q}", args=("tick",), interval=1, name="{q}-tick", misfire="run_all")
    delayq_cron.register(record, "{q}", args=("two",), cron="* * * * * */2", tz="UTC", name="{q}-two")
"""
#: each entry's tag (in its runs' records) and period; its name is ``<queue>-<tag>`` (RQ's job keys
#: have no prefix: run ids of entries named alike in two tests would meet)
PERIODS = {"tick": 1000, "two": 2000}


def _config(tmp_path: Path, queue: str) -> Path:
    path = tmp_path / "cron_config.py"
    path.write_text(textwrap.dedent(CONFIG.format(q=queue)))
    return path


def _forwarder(processes: Processes, config: Path, log: Path) -> subprocess.Popen[bytes]:
    args = ["forward", "--url", processes.url, "--rq-redis", processes.url, "--rq-cron", str(config)]
    args += ["--poll", "0.2", "--lease", "2", "--log-level", "info"]
    return processes.launcher.delayq(*args, env=processes.env, log=log)


def test_two_forwarders_run_each_period_of_a_cron_config_once_through_a_sigkill(
    rq_store: DelayStore, processes: Processes, prefix: str, tmp_path: Path
) -> None:
    queue = f"{prefix}-cron"
    config = _config(tmp_path, queue)
    conn = rq_store.client
    processes.worker(queue)
    forwarders = [_forwarder(processes, config, tmp_path / f"f{i}.log") for i in range(2)]
    try:
        names = {tag: f"{queue}-{tag}" for tag in PERIODS}
        wait_for(lambda: all(rq_store.get(item_id(n)) is not None for n in names.values()), 30, "the first sync")

        def fired_runs(tag: str) -> int:
            status = get(rq_store, names[tag])
            return 0 if status is None else status.runs

        def fired_past(floor: dict[str, int]) -> bool:  # each entry fired three more periods' worth
            return all(fired_runs(tag) >= floor[tag] + 3000 // every for tag, every in PERIODS.items())

        wait_for(lambda: fired_past(dict.fromkeys(PERIODS, 0)), 60, "runs before the kill")
        processes.launcher.kill(forwarders[0])  # SIGKILL, whatever it is doing
        forwarders[0] = _forwarder(processes, config, tmp_path / "f0-again.log")
        before = {tag: fired_runs(tag) for tag in PERIODS}
        wait_for(lambda: fired_past(before), 60, "runs after the kill")
        for proc in forwarders:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        fired = {tag: get(rq_store, name) for tag, name in names.items()}
        total = sum(s.runs for s in fired.values() if s is not None)
        wait_for(lambda: len(runs(conn, queue)) >= total, 30, lambda: f"{total} runs, got {len(runs(conn, queue))}")
        time.sleep(0.5)  # a run sent twice would be in by now
        recorded = runs(conn, queue)
        for tag, every in PERIODS.items():
            name, status = names[tag], fired[tag]
            assert status is not None and status.runs >= 6000 // every, status
            current = rq_store.get(item_id(name))
            assert current is not None
            slots = [Period(str(at), at) for at in range(current.ready_ms - every * 100, current.ready_ms, every)]
            by_id = {run_task_id(name, s): s for s in slots}
            mine = [r for r in recorded if r["tag"] == tag]
            ids = [r["id"] for r in mine]
            assert len(ids) == len(set(ids)), f"{name}: a period ran twice"
            periods = sorted(by_id[i].at_ms for i in ids)
            assert periods == list(range(periods[0], periods[-1] + every, every)), f"{name}: a period was lost"
            assert len(periods) == status.runs
            assert all(r["at"] * 1000 >= by_id[r["id"]].at_ms for r in mine), f"{name}: a run came early"
        again = (tmp_path / "f0-again.log").read_text()
        assert "0 added, 0 changed, 2 unchanged" in again  # the restart's sync changed nothing
    except BaseException:
        print(processes.launcher.tail())
        raise


def test_rq_cron_sync_command(rq_store: DelayStore, valkey_url: str, prefix: str, tmp_path: Path) -> None:
    config = _config(tmp_path, f"{prefix}-cron")
    store = ["--url", valkey_url, "--prefix", prefix, "--shards", str(rq_store.config.shards)]

    def sync(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "delayq_backends.cli", "rq-cron", "sync", *store, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=Path.cwd())

    first = sync(str(config), "--schedule-version", "5")
    assert first.returncode == 0, first.stderr
    assert f"added: {prefix}-cron-tick" in first.stdout and "2 added" in first.stderr
    older = sync(str(config), "--schedule-version", "4")
    assert older.returncode == 1 and "older" in older.stderr, older.stderr
    config.write_text(config.read_text().replace('-two")', '-two", misfire="skip")'))
    changed = sync(str(config), "--schedule-version", "6")
    assert changed.returncode == 0 and f"changed: {prefix}-cron-two" in changed.stdout, changed.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no such config')\n")
    failed = sync(str(broken))
    assert failed.returncode == 1 and "no such config" in failed.stderr
