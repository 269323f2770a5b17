"""The entries of ``overlap_app``, importable without an app (the test reads them too): one per
overlap policy, each every 2 s running ``dqt.hold`` (tag = the policy) for longer than that:
5 s under ``skip`` and ``buffer_one``, 3 s under ``allow`` (two at once: the worker has 4)."""

from typing import Any

EVERY = 2.0
HOLDS = {"skip": 5.0, "buffer_one": 5.0, "allow": 3.0}


def beat_schedule() -> dict[str, Any]:
    return {
        f"hold-{policy}": {
            "task": "dqt.hold",
            "schedule": EVERY,
            "args": [policy, seconds],
            "options": {"delayq_overlap": policy},
        }
        for policy, seconds in HOLDS.items()
    }
