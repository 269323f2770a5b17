"""conftest.py for RQ's own test suite, run against delayq_backends.rq (see run.py).

Copied into RQ's unpacked source distribution by run.py. It

- points every connection to localhost:6379 at an embedded Valkey started here: RQ's tests
  FLUSHDB their databases, which must never happen to a Redis someone else uses;
- unless ``DELAYQ_UPSTREAM_SWAP=0`` (RQ as it ships, for the reference count), swaps the import:
  ``rq.Queue`` is ``delayq_backends.rq.Queue`` and ``rq.registry.ScheduledJobRegistry`` is
  ``delayq_backends.rq.ScheduledJobRegistry``, workers use that queue class (as with
  ``rq worker --queue-class delayq_backends.rq.Queue``), and RQ's scheduler step
  (``RQScheduler.enqueue_scheduled_jobs``, also what ``Worker(with_scheduler=True)`` runs) does
  what ``delayq forward --rq-redis`` does instead: adopt stray registry entries of the queues
  it holds locks for, then forward what is due;
- skips, with the reason, the tests that read RQ's private keys (scores in
  ``rq:scheduled:<queue>``), which a delay store by design does not write.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import pytest
import redis.connection

from delayq_backends.embedded import EmbeddedServer

_server = EmbeddedServer().start()
atexit.register(_server.stop)
_connection_init = redis.connection.Connection.__init__


def _to_embedded(self: Any, host: str = "localhost", port: int = 6379, *args: Any, **kwargs: Any) -> None:
    if int(port) == 6379 and host in ("localhost", "127.0.0.1"):
        host, port = "127.0.0.1", _server.port
    _connection_init(self, host, port, *args, **kwargs)


redis.connection.Connection.__init__ = _to_embedded  # type: ignore[method-assign]

SWAP = os.environ.get("DELAYQ_UPSTREAM_SWAP", "1") != "0"

#: RQ tests that read or write the registry's scores directly (RQ's private layout).
PRIVATE_KEYS = {
    "test_scheduler.py::TestScheduledJobRegistry::test_schedule": "reads the score of rq:scheduled:<queue>, "
    "which holds mirror entries (time + 10^11 s) so that no RQ scheduler moves a job early",
}

if SWAP:
    import rq
    import rq.queue
    import rq.registry
    import rq.scheduler
    import rq.worker

    from delayq_backends import rq as delayq_rq
    from delayq_backends.forwarder import Forwarder
    from delayq_backends.rq.queue import store_of_connection

    rq.Queue = rq.queue.Queue = delayq_rq.Queue  # type: ignore[misc]
    rq.registry.ScheduledJobRegistry = delayq_rq.ScheduledJobRegistry  # type: ignore[misc]
    rq.worker.BaseWorker.queue_class = delayq_rq.Queue  # as `rq worker --queue-class delayq_backends.rq.Queue`

    def _forward_instead(self: Any) -> None:
        """What `delayq forward --rq-redis` does, for the queues this scheduler holds locks for."""
        self._status = self.Status.WORKING
        if not self._acquired_locks:
            return
        store = store_of_connection(self.connection)
        delayq_rq.adopt(self.connection, store, sorted(self._acquired_locks))
        forwarder = Forwarder(store, [delayq_rq.RQTarget(self.connection)])
        for _ in range(10):
            if forwarder.run_once() == 0:
                break

    rq.scheduler.RQScheduler.enqueue_scheduled_jobs = _forward_instead  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not SWAP:
        return
    for item in items:
        reason = next((why for test, why in PRIVATE_KEYS.items() if item.nodeid.endswith(test)), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"private key: {reason}"))
