"""Test-only: a forwarder with the store's default lease (30 s) that SIGKILLs itself right after
its broker accepted a periodic entry's run, before the rearm that schedules the next one.
``python -m tests.test_celery.crash_periodic_forwarder`` (``celery -A tests.test_celery.periodic_app``'s
``DQT_*`` settings)."""

from __future__ import annotations

import os
import signal
from typing import Any

from delayq_backends.celery import CeleryTarget, store_for
from delayq_backends.celery.periodic import PeriodicTarget, sync
from delayq_backends.forwarder import Forwarder
from tests.test_celery.crash_forwarder import forward_until_killed
from tests.test_celery.periodic_app import app


class CrashAfterFiring(PeriodicTarget):
    """Fires the entry (the broker confirms its run), then dies before the rearm."""

    @staticmethod
    def _rearm(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    store = store_for(app)
    sync(app, store)
    target = CeleryTarget.from_app(app)
    forward_until_killed(Forwarder(store, [target, CrashAfterFiring(target)]))


if __name__ == "__main__":
    main()
