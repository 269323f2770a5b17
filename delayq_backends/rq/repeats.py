"""Periodic and cron RQ jobs as the move handles them: a Scheduler job's schedule, its next run
re-armed under the same id, and its overlap policy (see :mod:`delayq_backends.overlap_policy`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..envelope import Envelope
from ..keys import MAX_RANK, RANK_SPAN
from ..models import DeliveryFailure
from ..overlap_policy import ALLOW, BUFFER_ONE, RUN_RECHECK_MS, SKIP, Fire, OverlapAsk, fire_runs, overlap_slot
from ..store import DelayStore
from ..store.lease import Lease
from ..targets import Delivery, PublishReport, Skipped
from .jobs import (
    AT_FRONT_RANK,
    KIND,
    OVERLAP_FIELD,
    SCHEDULE_KEY,
    SKIPPED_FIELD,
    UPGRADE_COMMAND,
    MoveBatch,
    job_id_of,
    schedule_of,
)
from .periodic import advance, due_between

__all__ = ["apply_overlap", "give_back", "is_periodic", "plan_next", "read_schedule", "rearm"]

log = logging.getLogger("delayq.rq")


def apply_overlap(batch: MoveBatch, lease: Lease, report: PublishReport) -> MoveBatch:
    """Apply the overlap policies of periodic jobs (one slot call per job, before the move):
    a run whose previous one holds the job's slot is skipped (its next period scheduled, the
    skip counted in its envelope) or, under ``buffer_one``, waits in the slot's line (the
    item asks again soon, neither moved nor re-armed: the periods meanwhile are passed over
    and counted when it moves). The batch of the jobs that move."""
    asks: dict[str, OverlapAsk] = {}
    for job_id, d in batch.deliveries.items():
        policy = _policy(d)
        if policy != ALLOW:
            asks[job_id] = OverlapAsk(policy, job_id, MAX_RANK * RANK_SPAN + d.ready_ms)
    if not asks:
        return batch
    store = lease.store if isinstance(lease.store, DelayStore) else None
    outcomes = fire_runs(store, asks) if store is not None else {}
    now = batch.now_ms
    moving: dict[str, Delivery] = {}
    for job_id, d in batch.deliveries.items():
        outcome = outcomes.get(job_id, Fire.RUN)
        if isinstance(outcome, Exception) or (job_id in asks and store is None):
            why = f"its overlap policy could not be applied ({outcome if store else 'no slot role on this store'})"
            report.failed.append(DeliveryFailure(d.id, why, waits=True))
        elif outcome is Fire.WAIT:
            report.later.append((d.id, now + RUN_RECHECK_MS))
        elif outcome is Fire.SKIP:
            _skip(d, lease, now)
            report.published.append(d.id)
            report.skipped.append(Skipped(d.id, job_id_of(d), 1))
        else:
            if job_id in asks:
                batch.granted[job_id] = _passed_over(d, now)
            moving[job_id] = d
    left = MoveBatch(batch.keys, moving, batch.now_ms)
    left.granted = batch.granted
    return left


def _skip(d: Delivery, lease: Lease, now: int) -> None:
    """Schedule the period after a skipped one, the skip counted (not a run: ``repeat`` is
    not counted down)."""
    schedule = _schedule_of(d)
    skipped = _skipped(schedule) + 1
    following = advance({k: v for k, v in schedule.items() if k != "repeat"}, now=max(now, d.ready_ms) / 1000)
    log.info("periodic job %s: period skipped, its last run still running (skipped %d so far)", d.id, skipped)
    if following is not None:
        meta = {**d.envelope.meta, SCHEDULE_KEY: {**schedule, SKIPPED_FIELD: skipped}}
        lease.schedule(d.id, following, Envelope(KIND, d.envelope.destination, meta=meta))


def read_schedule(batch: MoveBatch, job_id: str, old_meta: Mapping[str, bytes | None]) -> dict[str, Any] | None:
    """A Scheduler job's schedule: from its envelope, or (scheduled by delayq 0.1) from a JSON
    ``job.meta``, upgraded as it moves (the re-armed run carries it). A pickled ``meta`` is
    never loaded: ValueError names the operator's command that upgrades it."""
    if not batch.from_scheduler(job_id):
        return None
    meta = batch.deliveries[job_id].envelope.meta
    if SCHEDULE_KEY in meta:
        schedule = meta[SCHEDULE_KEY]
        if not isinstance(schedule, dict):
            raise ValueError(f"its envelope's schedule is {schedule!r}, not an object")
        return dict(schedule)
    raw = old_meta.get(job_id)
    if not raw:
        return {}
    try:
        loaded = json.loads(raw)
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict):
        raise ValueError(
            "it was scheduled by delayq_backends 0.1's rq.Scheduler, whose envelope does not carry the "
            "repeat/cron schedule, and its job.meta is not JSON (the forwarder never unpickles job data): "
            f"on a machine trusted to run the jobs, run `{UPGRADE_COMMAND} --url <store> --prefix <prefix> "
            "--rq-redis <RQ's Redis>` (it upgrades every such job, these dead letters included), then "
            f"`delayq dlq requeue {job_id}`"
        )
    return schedule_of(loaded)


def plan_next(batch: MoveBatch, job_id: str, schedule: dict[str, Any], now: int) -> None:
    """The next run of a periodic or cron job, with its schedule counted down in the envelope."""
    delivery = batch.deliveries[job_id]
    waited = batch.granted.get(job_id, 0)
    if waited:
        schedule[SKIPPED_FIELD] = _skipped(schedule) + waited
    following = advance(schedule, now=max(now, delivery.ready_ms) / 1000)
    if following is not None:
        meta = {**delivery.envelope.meta, SCHEDULE_KEY: schedule}
        batch.following[job_id] = (following, Envelope(KIND, delivery.envelope.destination, meta=meta))
    elif schedule.get("cron_string") and schedule.get("repeat") != 0:
        log.warning(
            "cron job %s: %r has no later match; this is its last run and its schedule ends",
            job_id,
            schedule["cron_string"],
        )


def rearm(batch: MoveBatch, ids: list[str], pipe: Any, lease: Lease | None) -> None:
    """Schedule the next run of periodic and cron jobs under the same id.

    Re-scheduling drops the lease, so the forwarder's ack (in this transaction or after it)
    cannot delete the next run; one forwarder moves each run, so there is no double run.
    """
    for job_id in ids:
        if job_id not in batch.following:
            continue
        following, envelope = batch.following[job_id]
        rank = AT_FRONT_RANK if batch.jobs[job_id].at_front else 0
        if lease is None:
            log.warning("periodic job %s moved without a lease: its next run is not scheduled", job_id)
        else:
            lease.schedule(job_id, following, envelope, rank=rank, pipeline=pipe)


def give_back(lease: Lease, job_ids: Sequence[str]) -> None:
    """The slots taken for runs that did not move go back (else held for their start hold, and
    the periods meanwhile skipped)."""
    if not job_ids or not isinstance(lease.store, DelayStore):
        return
    try:
        lease.store.give_back_slots({overlap_slot(j).key: [j] for j in job_ids})
    except Exception as exc:  # the holds lapse by themselves
        log.warning("periodic jobs %s: could not give back their slots (%s)", job_ids, exc)


def _passed_over(delivery: Delivery, now: int) -> int:
    """The periods of a periodic job that fell due while its run waited (0 if its schedule
    cannot be read: the move reports that)."""
    try:
        return due_between(_schedule_of(delivery), delivery.ready_ms / 1000, now / 1000)
    except (ValueError, TypeError, OverflowError):
        return 0


def _skipped(schedule: Mapping[str, Any]) -> int:
    """The periods a job's overlap policy skipped so far; a count that is none (a hand write)
    starts again from 0."""
    value = schedule.get(SKIPPED_FIELD)
    return value if type(value) is int and value >= 0 else 0


def _schedule_of(delivery: Delivery) -> dict[str, Any]:
    """A Scheduler job's schedule from its envelope (``{}`` when it has none)."""
    schedule = delivery.envelope.meta.get(SCHEDULE_KEY)
    return dict(schedule) if isinstance(schedule, dict) else {}


def _policy(delivery: Delivery) -> str:
    """A periodic job's overlap policy (``allow`` for any other item, or a value no release wrote)."""
    policy = _schedule_of(delivery).get(OVERLAP_FIELD, ALLOW)
    return policy if policy in (SKIP, BUFFER_ONE) and is_periodic(delivery) else ALLOW


def is_periodic(delivery: Delivery) -> bool:
    """Whether ``delivery`` is a Scheduler job with a next run (an interval or a cron string)."""
    schedule = delivery.envelope.meta.get(SCHEDULE_KEY)
    return isinstance(schedule, dict) and bool(schedule.get("interval") or schedule.get("cron_string"))
