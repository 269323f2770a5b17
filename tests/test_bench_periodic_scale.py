"""``bench/periodic_scale.py`` at a tiny size, so the benchmark cannot rot: it runs end to end
(real ``delayq forward`` processes, a real Redis broker) and its figures say what they claim."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "periodic_scale.py"


def test_tiny_run_fires_every_period_and_sees_every_edit() -> None:
    args = ["--entries", "3600", "--window", "8", "--edits", "2", "--warmup", "1", "--peer-entries", "100"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args, "--no-results"], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    # one entry a second falls due: the window's runs all landed, once each
    assert report["lateness_ms"]["n"] >= 5, report
    assert report["missing"] == 0 and report["duplicates"] == 0, report
    for kind in ("schedule", "message"):
        edits = report["edits"][kind]
        assert edits["effect_ms"]["n"] == 2, edits
        # the edited run landed at its new period (a schedule edit), with the new message (checked
        # by the bench), not an hour later
        assert edits["landed_after_return_ms"]["max"] < 5_000, edits
    memory = report["memory"]
    assert memory["envelope_bytes"] < memory["per_entry_keys"] < 10 * memory["envelope_bytes"], memory
    peer = report["peer_redbeat"]
    if importlib.util.find_spec("redbeat") is None:  # the peer is optional: the bench says how to add it
        assert "pip install celery-redbeat" in peer["skipped"], peer
    else:
        assert peer["entries"] == 100 and peer["per_entry_used_memory"] > 0, peer
