"""``bench/periodic_scale.py`` at a tiny size, so the benchmark cannot rot: it runs end to end
(real ``delayq forward`` processes, a real Redis broker, the runtime actions of
``delayq_backends.periodic.ops``) and its figures say what they claim."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "periodic_scale.py"


def _bench_module() -> Any:
    """The bench as a module (it imports its ``lib`` package from bench/)."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("periodic_scale", BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH.parent))


@pytest.mark.alone  # a benchmark: its figures are times
def test_tiny_run_fires_every_period_and_sees_every_action() -> None:
    args = ["--entries", "3600", "--window", "16", "--actions", "2", "--warmup", "1", "--peer-entries", "100"]
    args += ["--upsert-sample", "50", "--history-sample", "10", "--history-runs", "5"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args, "--no-results"], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    # one entry a second falls due: the window's runs all landed, once each (paused ones left out)
    assert report["lateness_ms"]["n"] >= 5, report
    assert report["missing"] == 0 and report["duplicates"] == 0, report
    actions = report["actions"]
    for kind in ("schedule", "message", "run_now"):
        assert actions[kind]["effect_ms"]["n"] == 2, actions
        # the edited or manual run landed at its new period (a schedule edit), with the new message
        # (checked by the bench), or at once (run now), not an hour later
        assert actions[kind]["landed_after_return_ms"]["max"] < 5_000, actions
    # two pauses of entries due in ~1 s, and none of their runs landed (checked by the bench)
    assert actions["pause"]["n"] == 2 and report["paused"] == 2, actions
    assert report["upsert"]["count"] == 50 and report["upsert"]["rate"] > 0, report["upsert"]
    memory = report["memory"]
    assert memory["envelope_bytes"] < memory["per_entry_keys"] < 10 * memory["envelope_bytes"], memory
    # each run fired in the window left a history record (checked by the bench), which takes room,
    # and more runs take more, up to the history's bound
    assert memory["fired_once_sample"] >= 5, memory
    assert 0 < memory["history_bytes_after_1_run"] < memory["history_bytes_after_n_runs"], memory
    assert memory["envelope_growth_after_1_run"] > 0, memory
    assert memory["record_published_ms"]["n"] == 50, memory  # 10 entries x 5 runs, each call timed
    # the RESULTS.md section renders from this report (the bench writes it without --no-results)
    section = _bench_module().markdown(report, "now", "python bench/periodic_scale.py")
    assert "fire lateness (landed − period), history on" in section and "`ops.run_now`" in section, section
    peer = report["peer_redbeat"]
    if importlib.util.find_spec("redbeat") is None:  # the peer is optional: the bench says how to add it
        assert "pip install celery-redbeat" in peer["skipped"], peer
    else:
        assert peer["entries"] == 100 and peer["per_entry_used_memory"] > 0, peer
