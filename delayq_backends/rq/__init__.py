"""RQ adapter: scheduled RQ jobs wait in the delay store; forwarders move them into their queues.

- :class:`Queue`: ``rq.Queue`` whose ``schedule_job`` (``enqueue_at``, ``enqueue_in``, retries and
  repeats with an interval) stores the job id in the delay store. Workers run with
  ``rq worker --queue-class delayq_backends.rq.Queue``.
- :class:`DedupeWorker`: ``rq worker --worker-class delayq_backends.rq.DedupeWorker`` drops a
  second delivery of a job run that already started (worker-side dedupe).
- :class:`SlotWorker`: ``rq worker --worker-class delayq_backends.rq.SlotWorker`` holds the
  concurrency slots of its jobs (``Queue.enqueue(..., delayq_slot=...)``) while they run.
- :class:`TracedJobs`: runs each job in its producer's OpenTelemetry trace (the slot and dedupe
  workers have it; docs/tracing.md).
- :class:`Batch`: sub-jobs of one request and one ``on_complete`` once all have finished (the
  slot and dedupe workers report their ends; :class:`BatchReports` mixes into your own).
- :class:`Scheduler`: rq-scheduler's ``Scheduler`` API, with no daemon.
- :class:`RQTarget`: the forwarder's ``"rq"`` target (``delayq forward --rq-redis URL``).
- :mod:`.cron`: a user's ``rq cron`` config (``rq.cron.register`` calls) as periodic entries the
  forwarders fire (``delayq forward --rq-cron CONFIG``); :class:`RQPeriodicTarget` fires them,
  each run a new job written by :class:`RQRunTarget` (:mod:`.entries`).
- :func:`migrate`: move jobs from ``rq:scheduled:*`` and rq-scheduler into the store
  (``delayq rq-migrate``).
- :func:`upgrade`: put the schedule of Scheduler jobs stored by delayq_backends 0.1 into their
  envelopes (``delayq rq-upgrade``).
"""

from ..errors import MissingExtraError

try:
    import rq  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(f"delayq_backends.rq needs RQ ({exc})", "rq") from exc

from .adopt import RegistryAdopter
from .allowlist import ClassAllowlist
from .batches import Batch, BatchReports
from .dedupe import DedupeSimpleWorker, DedupeWorker
from .entries import RQPeriodicTarget, RQRunTarget
from .migrate import MigrationReport, adopt, migrate
from .periodic import InvalidScheduleError
from .queue import Queue, ScheduledJobRegistry
from .scheduler import JobNotScheduledError, NoSchedulerKeyError, NoSchedulerProcessError, Scheduler
from .slots import SlotSimpleWorker, SlotWorker, throttle
from .target import RQTarget
from .tracing import TracedJobs
from .upgrade import UpgradeReport, upgrade

__all__ = [
    "Batch",
    "BatchReports",
    "ClassAllowlist",
    "DedupeSimpleWorker",
    "DedupeWorker",
    "InvalidScheduleError",
    "JobNotScheduledError",
    "MigrationReport",
    "NoSchedulerKeyError",
    "NoSchedulerProcessError",
    "Queue",
    "RQPeriodicTarget",
    "RQRunTarget",
    "RQTarget",
    "RegistryAdopter",
    "ScheduledJobRegistry",
    "Scheduler",
    "SlotSimpleWorker",
    "SlotWorker",
    "TracedJobs",
    "UpgradeReport",
    "adopt",
    "migrate",
    "throttle",
    "upgrade",
]
