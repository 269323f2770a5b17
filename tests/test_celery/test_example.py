"""examples/celery_app runs as its README says: schedule, revoke, reschedule (real servers)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "celery_app"


def test_schedule_script_stores_revokes_and_moves(valkey_server: EmbeddedServer) -> None:
    base = valkey_server.url.rsplit("/", 1)[0]
    prefix = f"ex{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CELERY_BROKER_URL": f"{base}/1", "DELAYQ_URL": f"{base}/0", "DELAYQ_PREFIX": prefix}
    done = subprocess.run(
        [sys.executable, "schedule.py"], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert "not scheduled" in lines["cancelled"]
    assert "due" in lines["soon"] and "due" in lines["moved"]
    store = DelayStore(connect(f"{base}/0"), Config(prefix=prefix))
    assert sum(s.scheduled for s in store.stats()) == 2
    moved = store.get(lines["moved"].split()[1])
    soon = store.get(lines["soon"].split()[1])
    assert moved is not None and soon is not None
    assert 9_000 < moved.ready_ms - soon.ready_ms < 11_000, "moved from tomorrow to 20 s, soon is at 10 s"
