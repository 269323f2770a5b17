"""The example app's job functions: `rq worker` imports them, the forwarder never does."""

from __future__ import annotations

import time

from rq import get_current_job


def remind(user_id: int) -> str:
    job = get_current_job()
    lateness = time.time() - float(job.meta["due"]) if job and "due" in job.meta else float("nan")
    print(f"reminder for user {user_id} ({lateness * 1000:.0f} ms after its time)", flush=True)
    return f"reminded {user_id}"


def flaky(attempt_key: str) -> str:
    """Fails twice, then succeeds: shows Retry(interval=...) going through the delay store."""
    job = get_current_job()
    assert job is not None
    tries = job.connection.incr(attempt_key)
    if tries < 3:
        raise RuntimeError(f"failing on purpose, try {tries}")
    print(f"flaky succeeded on try {tries}", flush=True)
    return "ok"


def heartbeat() -> None:
    print(f"heartbeat at {time.strftime('%H:%M:%S')}", flush=True)
