"""RQ's side of batches (:mod:`delayq_backends.batches`).

    from datetime import timedelta

    from rq import Callback

    from delayq_backends.rq import Batch, Queue

    queue = Queue("default", connection=redis)
    with Batch(queue, "order-42", on_complete=Callback("app.jobs.summarize")) as batch:
        for line in lines:
            batch.add(process, line)                       # due now (enqueue)
        batch.add(remind, 42, in_=timedelta(hours=1))      # enqueue_in; at=datetime: enqueue_at
    # closed: app.jobs.summarize(summary) runs once every sub-job has finished

Each sub-job is counted into the batch before it is saved, carries the key in
``job.meta["delayq_batch"]`` and goes through the delay store, delay or not. ``on_complete``
(an ``rq.Callback``, a function or its dotted path) is saved now as a job of the queue, status
``scheduled``, id ``batch-<key>``, listed in ``rq:scheduled:<queue>`` as a mirror entry at its
open time (:mod:`.registry`: rq-dashboard's Scheduled tab shows it while the batch is open, no
RQ scheduler moves it): the completing script writes its item into the store, and a forwarder
moves it like any scheduled job (taking the mirror entry out). It runs :func:`call_on_complete`, which reads the
batch's summary from the store (as the worker's queues find it: ``DELAYQ_URL``, else the queue's
Redis) and calls the function with it: a dict ``batch``, ``total``, ``succeeded``, ``failed``,
``failed_ids`` (the first 1,000).

Workers report each sub-job's final end: run them with ``--worker-class
delayq_backends.rq.SlotWorker`` (or a ``DedupeWorker``; :class:`BatchReports` mixes into your
own). A success is reported after RQ handled it; a failure once RQ marked the job failed or
stopped (a failure with retries left is not final). A work horse killed mid-job is a failure
RQ handles in the worker (retried if it has retries left); a whole worker killed is seen dead by
the other workers' watch (:mod:`~delayq_backends.rq.watch`) two beats later (``DELAYQ_WORKER_BEAT``,
5 s), which hands its job to RQ's abandoned-job cleanup at once: retried (then its next end is
reported) or failed, and reported failed then. RQ's own cleanup (a worker's maintenance, every 10
minutes) still reports one it fails first (its exception handlers, RQ >= 2).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import RedisError
from rq import Callback, get_current_job
from rq.exceptions import AbandonedJobError
from rq.job import Job, JobStatus
from rq.utils import import_attribute

from ..batches import OpenBatch, report_end
from ..errors import BatchError, DelayqError
from ..keys import batch_item_id
from ..store import BATCH_TTL_MS, DelayStore
from ..store.batches import add_to_batch, check_batch_key, take_back
from .queue import BATCH_META, Queue, store_of_connection
from .registry import mirror_scheduled
from .watch import WorkerWatch

__all__ = ["BATCH_META", "Batch", "BatchReports", "call_on_complete"]

log = logging.getLogger("delayq.rq.batches")

#: What RQ takes as a job id (RQ 2+ refuses others).
_RQ_ID = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(on_complete: Callback | Callable[..., Any] | str) -> str:
    """The dotted path of a callback, a function or a path."""
    if isinstance(on_complete, Callback):
        return on_complete.name if isinstance(on_complete.func, str) else _dotted(on_complete.func)
    if isinstance(on_complete, str):
        return on_complete
    module, name = getattr(on_complete, "__module__", None), getattr(on_complete, "__qualname__", "")
    if not module or not name or "<" in name:
        raise BatchError(f"on_complete {on_complete!r}: pass a module-level function, its dotted path or a Callback")
    return f"{module}.{name}"


def call_on_complete(path: str, key: str) -> Any:
    """A batch's on_complete job: call ``path`` with the batch's summary (read from the store)."""
    job = get_current_job()
    if job is None:
        raise BatchError(f"batch {key!r}: call_on_complete runs as an RQ job only")
    status = store_of_connection(job.connection).batch_status(key)
    if status is None:
        raise BatchError(f"batch {key!r}: no such batch in the store (expired?): its summary is gone")
    summary = {k: v for k, v in status.as_dict().items() if k in ("total", "succeeded", "failed", "failed_ids")}
    return import_attribute(path)({"batch": key, **summary})


class Batch(OpenBatch):
    """A batch of jobs of ``queue``, and ``on_complete`` once every one has finished.

    Args:
        queue: a :class:`delayq_backends.rq.Queue` (its delay store counts the batch).
        key: the batch's key: letters, digits, ``_`` and ``-`` (RQ's job id rule: the
            on_complete job's id is ``batch-<key>``).
        on_complete: an ``rq.Callback``, a function or its dotted path, called with the summary;
            None: only the notice on ``<prefix>:batch:<key>``.
        ttl: how long the batch stays readable once completed.

    Raises:
        BatchError: a bad key, a queue that is not delayq's, or garbage in the batch's keys.
    """

    def __init__(
        self,
        queue: Queue,
        key: str,
        *,
        on_complete: Callback | Callable[..., Any] | str | None = None,
        ttl: timedelta = timedelta(days=7),
    ) -> None:
        if not isinstance(queue, Queue):
            raise BatchError(f"Batch needs a delayq_backends.rq.Queue, got {type(queue).__name__}")
        self.queue, self.key = queue, check_batch_key(key)
        if not _RQ_ID.fullmatch(batch_item_id(key)):
            raise BatchError(
                f"batch key {key!r}: use letters, digits, '_' and '-' only (RQ's rule for job ids: the "
                f"on_complete job's id is {batch_item_id(key)!r})"
            )
        self.store: DelayStore = queue.delay_store
        path = None if on_complete is None else _dotted(on_complete)
        ttl_ms = int(ttl.total_seconds() * 1000) if ttl else BATCH_TTL_MS
        # opened first: a key in use is refused before any job is saved; the batch cannot
        # complete before its job is saved, as it is not closed yet
        self.store.open_batch(key, on_complete=None if path is None else queue.envelope_bytes(), ttl_ms=ttl_ms)
        # a batch opened again (a retried open, a producer starting again) keeps its first job
        if path is not None and not queue.job_class.exists(batch_item_id(key), connection=queue.connection):
            job = queue.create_job(
                call_on_complete, args=(path, key), job_id=batch_item_id(key), status=JobStatus.SCHEDULED
            )
            with queue.connection.pipeline() as pipe:
                job.save(pipeline=pipe)
                # listed while the batch is open, as every waiting job is (rq-dashboard's Scheduled
                # tab, queue.scheduled_job_registry): a mirror entry at its open time, which no RQ
                # scheduler moves; the forwarder's move of the job takes it out (.registry)
                mirror_scheduled(pipe, queue.name, {job.id: dt.datetime.now(dt.timezone.utc).timestamp()})
                pipe.execute()

    def add(self, f: Any, *args: Any, at: datetime | None = None, in_: timedelta | None = None, **kwargs: Any) -> Job:
        """Enqueue ``f(*args, **kwargs)`` as a sub-job: now, ``at`` a time (``enqueue_at``) or
        ``in_`` a delay (``enqueue_in``); ``kwargs`` as RQ's enqueue takes them (``job_id``,
        ``retry``, ``meta``, ...). Returns the job.

        Raises:
            BatchClosedError: the batch is closed; the job was NOT saved.
        """
        job_id = kwargs.pop("job_id", None) or str(uuid.uuid4())
        kwargs["meta"] = {**(kwargs.get("meta") or {}), BATCH_META: self.key}
        when = at or dt.datetime.now(dt.timezone.utc) + (in_ or timedelta(0))
        add_to_batch(self.store, self.key, [job_id])
        try:
            return self.queue.enqueue_at(when, f, *args, job_id=job_id, **kwargs)
        except BaseException:
            take_back(self.store, self.key, job_id)
            raise


class BatchReports(WorkerWatch):
    """The reports of sub-jobs' final ends, mixed into a worker class before RQ's; with the
    watch of dead workers (:mod:`~delayq_backends.rq.watch`), whose sub-jobs are failed (or
    retried) within two beats of the death."""

    connection: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.push_exc_handler(self._abandoned)  # type: ignore[attr-defined]

    def _abandoned(self, job: Job, kind: type[BaseException], *_: Any) -> None:
        """An exception handler: RQ's cleanup found ``job``'s worker dead (AbandonedJobError),
        and fails it unless it has retries left. A handler returning None lets the next one run."""
        if issubclass(kind, AbandonedJobError) and not (job.retries_left and job.retries_left > 0):
            self._report_end(job, None, False)

    def _failed_by_sweep(self, job: Job) -> None:
        self._report_end(job, None, False)

    def handle_job_success(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().handle_job_success(job, queue, *args, **kwargs)  # type: ignore[misc]
        self._report_end(job, queue, True)
        return result

    def handle_job_failure(self, job: Job, queue: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().handle_job_failure(job, queue, *args, **kwargs)  # type: ignore[misc]
        if (job.meta or {}).get(BATCH_META) is not None:
            try:  # final once RQ marked it so: a failure with retries left is scheduled or queued again
                final = job.get_status(refresh=True) in (JobStatus.FAILED, JobStatus.STOPPED)
            except RedisError as exc:
                log.warning("batch: the status of job %s could not be read (%s); its end is not reported", job.id, exc)
                final = False
            if final:
                self._report_end(job, queue, False)
        return result

    def _report_end(self, job: Job, queue: Any, ok: bool) -> None:
        key = (job.meta or {}).get(BATCH_META)
        if key is None:
            return
        try:
            store = getattr(queue, "delay_store", None) or store_of_connection(self.connection)
        except (DelayqError, RedisError, OSError) as exc:
            log.warning("batch %r: no delay store (%s); the end of job %s was not recorded", key, exc, job.id)
            return
        report_end(store, str(key), job.id, ok)
