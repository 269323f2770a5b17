"""Test-only: a forwarder that SIGKILLs itself right after its broker accepted a batch, before
the ack. ``python -m tests.test_celery.crash_forwarder STORE_URL PREFIX BROKER_URL``.

It runs the real :class:`Forwarder` step with a short lease (2 s), so the next forwarder
claims the same items soon after and publishes them a second time: the duplicate a crash
between publish and ack makes.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence

from delayq_backends.celery.target import CeleryTarget
from delayq_backends.forwarder import Forwarder
from delayq_backends.store import DelayStore
from delayq_backends.targets import Delivery, PublishReport

LEASE_SECONDS = 2.0


class CrashAfterPublish(CeleryTarget):
    """Publishes the batch (the broker confirms it), then dies before the forwarder acks."""

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        report = super().publish_many(deliveries)
        if report.published:
            os.kill(os.getpid(), signal.SIGKILL)
        return report


def main(store_url: str, prefix: str, broker_url: str) -> None:
    store = DelayStore.from_url(store_url, prefix=prefix, shards=4, lease_seconds=LEASE_SECONDS)
    forward_until_killed(Forwarder(store, [CrashAfterPublish.from_url(broker_url)]))


def forward_until_killed(forwarder: Forwarder) -> None:
    """Run ``forwarder`` until its target kills the process; exit 1 if nothing came due in 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        forwarder.run_once()
        time.sleep(0.05)
    sys.exit("nothing came due within 60 s")


if __name__ == "__main__":
    main(*sys.argv[1:4])
