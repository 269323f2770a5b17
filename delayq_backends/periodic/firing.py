"""Firing periodic entries, for every entry kind: decode → plan → overlap → publish runs → rearm.

A periodic entry is one store item due at its next period. A forwarder claims it like any item;
:class:`FiringTarget` plans the firing from the entry's :class:`~.state.PeriodicState` (misfire
policy, enabled flag, start/end, maximum runs, jitter, pending manual runs and backfills),
publishes the runs through the kind's inner target, then acks the item and schedules its next
period **in one script call** (:meth:`Lease.rearm`), only while the claim's lease is still ours.
So each period's next run is written exactly once, with no lock and no leader, and a pending
action is applied exactly once: it is cleared by the same rearm.

What differs between kinds (a Celery task message, an RQ job) is the :class:`RunMaker`: it reads
the entry's stored template and makes one run's :class:`Delivery` for the inner target. Nothing
here imports Celery or RQ.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..envelope import Envelope, with_slot
from ..errors import DelayqError
from ..keys import MAX_RANK, RANK_SPAN
from ..models import DeliveryFailure, RearmOutcome, ScheduleItem
from ..overlap_policy import ALLOW, Fire, OverlapAsk, fire_runs, overlap_slot
from ..store import DelayStore, slot_member
from ..store.lease import Lease
from ..targets import Delivery, PublishReport, Skipped, Target
from ..timeutil import from_ms
from .history import Fired, RunMark, SentRun, report_fired
from .schedules import END, MAX_BACKFILL, Plan, Slot, describe_time, run_task_id
from .state import PeriodicState, jitter_offset, state_of, with_state

__all__ = [
    "BACKFILL",
    "MANUAL",
    "MIN_ENTRY_LEASE_MS",
    "SCHEDULED",
    "EntryWaits",
    "FiringTarget",
    "Run",
    "RunMaker",
    "entry_lease_ms",
    "plan_entry",
]

log = logging.getLogger("delayq.periodic")

#: what made a run: its period came due, ``run now``, a backfill
SCHEDULED, MANUAL, BACKFILL = "scheduled", "manual", "backfill"

#: the shortest lease an entry is fired under: a broker's publish confirm must fit in it
MIN_ENTRY_LEASE_MS = 1000


class EntryWaits(DelayqError):
    """A run maker cannot make an entry's runs now, or not in this forwarder (arguments evaluated
    per run, with no app here to evaluate them; an evaluation that failed): the firing waits,
    tried again with back-off and no attempt counted, never a dead letter and never sent as it is.
    The message says why and the fix; the forwarder logs it at each try."""


@dataclass(frozen=True)
class Run:
    """One run of an entry: its period (for a manual run, the request time) and what made it."""

    slot: Slot
    kind: str = SCHEDULED

    def task_id(self, name: str) -> str:
        """The run's id: ``uuid5(name, period key)``; ``manual:<request ms>`` and
        ``backfill:<period key>`` for the others, so a backfilled period never takes the id of
        its scheduled run (which may have been sent)."""
        if self.kind == SCHEDULED:
            return run_task_id(name, self.slot)
        return run_task_id(name, Slot(f"{self.kind}:{self.slot.key}", self.slot.at_ms))


class RunMaker(Protocol):
    """What firing needs from one entry kind."""

    #: the ``Envelope.target`` of this kind's entries (``celery-periodic``, ``rq-periodic``)
    kind: str

    @property
    def slot_run(self) -> int | None:
        """The run the kind's workers name in a slot member (:func:`~delayq_backends.store.slot_member`):
        0 for Celery (``retries``), None for RQ (its SlotWorker names the job id alone)."""

    def template(self, envelope: Envelope) -> Any:
        """The entry's stored run template (a Celery message, an RQ job); EnvelopeError if none."""

    def run(self, entry: Delivery, template: Any, state: PeriodicState, run: Run, now_ms: int) -> Delivery:
        """The delivery, for the inner target, of ``run`` of ``entry``; its id must be
        ``<entry item id>#<run.task_id(state.name)>``."""


@dataclass(frozen=True)
class EntryPlan:
    """One firing of an entry: its scheduled periods (a misfire :class:`Plan`, its ``next`` the
    period to rearm at) and the manual and backfill runs it sends besides."""

    plan: Plan
    extra: list[Run]


def plan_entry(state: PeriodicState, now_ms: int) -> EntryPlan:
    """What firing ``state``'s entry at ``now_ms`` sends: pending manual runs and backfills
    (paused or not: asked for by hand), and, for an enabled, unfinished entry, its due periods
    under its misfire policy, none before its start or after its end, at most up to its
    maximum runs; past its end or maximum runs its next period is :data:`~.schedules.END`."""
    extra = [Run(Slot(str(ms), ms), MANUAL) for ms in state.run_now]
    for start, end in state.backfill:
        extra += [Run(s, BACKFILL) for s in state.schedule.between(state.slot, start, end, MAX_BACKFILL)]
    late = now_ms - jitter_offset(state.name, state.slot, state.jitter_ms)  # lateness counts from its jittered time
    if not state.enabled or state.finished or (state.pending and late < state.slot.at_ms):
        return EntryPlan(Plan([], 0, state.slot), extra)  # (due for its pending actions, not its period)
    plan = state.misfire.plan(state.schedule, state.slot, late)
    missed = plan.missed - _paused_periods(state, plan, late)
    runs = [s for s in plan.runs if (state.start_ms is None or s.at_ms >= state.start_ms)]
    runs = [s for s in runs if state.end_ms is None or s.at_ms <= state.end_ms]
    if state.max_runs is not None:
        runs = runs[: max(0, state.max_runs - state.runs)]
    nxt = plan.next
    if (state.end_ms is not None and nxt.at_ms > state.end_ms) or (
        state.max_runs is not None and state.runs + len(runs) >= state.max_runs
    ):
        nxt = END
    return EntryPlan(Plan(runs, missed, nxt), extra)


def _paused_periods(state: PeriodicState, plan: Plan, now_ms: int) -> int:
    """How many of ``plan``'s missed periods came due while the entry was paused: not missed
    (a planned pause is no outage). The missed periods are the due ones before its runs (a
    misfire policy sends the latest)."""
    window = state.pause_window()
    if window is None or not plan.missed:
        return 0
    last = plan.runs[0].at_ms - 1 if plan.runs else max(now_ms, state.slot.at_ms)
    paused = state.schedule.count(state.slot, window[0], min(last, window[1] - 1))
    return min(paused, plan.missed)


def _sent(state: PeriodicState, run: Run) -> SentRun:
    """``run`` of ``state``'s entry as its history records it. It counts as late from its
    period's due time, or for a period that came due while the entry was paused, from the
    resume (the run went out as soon as it could)."""
    window = state.pause_window()
    paused = window is not None and run.kind == SCHEDULED and window[0] <= run.slot.at_ms < window[1]
    late_from = window[1] if window is not None and paused else None
    return SentRun(RunMark(state.name, run.slot.at_ms, run.kind), run.task_id(state.name), late_from)


def entry_lease_ms(state: PeriodicState, lease_ms: int) -> int:
    """How long a forwarder firing ``state``'s entry holds it: half its period (at least
    :data:`MIN_ENTRY_LEASE_MS`), at most the store's lease. A forwarder killed while firing it
    delays the entry by that much: under ``run_once`` a lease longer than the period would
    collapse the periods it covers into one run."""
    nxt = state.schedule.following(state.slot) if not state.finished else END
    if nxt == END:
        return lease_ms
    return min(lease_ms, max(MIN_ENTRY_LEASE_MS, (nxt.at_ms - state.slot.at_ms) // 2))


@dataclass
class _Firing:
    """One entry being fired: its item, template, state and plan, the scheduled run deliveries
    and the manual/backfill ones (``extra``, never held back by the overlap policy), the periods
    its overlap policy skipped, and whether it took its slot for them."""

    d: Delivery
    template: Any
    state: PeriodicState
    plan: Plan
    runs: list[Delivery]
    extra: list[Delivery] = field(default_factory=list)
    skipped: int = 0
    taken: bool = False
    #: the :class:`Run` each delivery (by id) was made for: its period and what made it
    made: dict[str, Run] = field(default_factory=dict)
    #: its state from its next period on, once its runs were all published
    following: PeriodicState | None = None

    @property
    def deliveries(self) -> list[Delivery]:
        return self.runs + self.extra


def _task_id(run: Delivery) -> str:
    """The task id of a run delivery (``<item>#<task id>``)."""
    return run.id.rpartition("#")[2]


def _member(run: Delivery, slot_run: int | None = 0) -> str:
    """A run's member in its entry's slot: as the worker names it (task id, and its run where
    the kind's workers name one: Celery's ``retries`` 0; RQ's SlotWorker names none)."""
    return slot_member(_task_id(run), slot_run)


def _order(state: PeriodicState, run: Delivery) -> int:
    """A run's order in its slot's line, as the forwarder's slot hook orders slotted items."""
    return (MAX_RANK - state.rank) * RANK_SPAN + run.ready_ms


def _give_back_slot(store: DelayStore | None, f: _Firing, slot_run: int | None = 0) -> None:
    """The slot taken for a run that was not published goes back (else it is held until its
    start hold lapses, and the periods meanwhile are skipped)."""
    if not f.taken or store is None:
        return
    key = overlap_slot(f.state.name).key
    try:
        store.give_back_slots({key: [_member(f.runs[0], slot_run)]})
    except Exception as exc:  # its hold lapses by itself
        log.warning("periodic entry %r: could not give back its slot (%s)", f.state.name, exc)


def _next_item(lease: Lease, d: Delivery, following: PeriodicState, rank: int) -> ScheduleItem | Exception:
    """Entry ``d``'s item at its next period (its state ``following``), checked; or why it cannot be stored."""
    try:
        return lease.store.check_item(d.id, from_ms(following.ready_ms()), with_state(d.envelope, following), rank)
    except Exception as exc:
        return exc


class FiringTarget:
    """Fires one kind's periodic items: publishes each firing's runs through ``inner``, then acks
    the item and schedules its next period in one step under the claim's lease.

    Args:
        maker: the kind's run maker (its ``kind`` is this target's).
        inner: the target that publishes the runs.
    """

    def __init__(self, maker: RunMaker, inner: Target) -> None:
        self.maker = maker
        self.kind = maker.kind
        self._slot_run = maker.slot_run
        self.inner = inner

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        """Without a lease the next run could not be scheduled safely: nothing is sent."""
        why = "a periodic entry is fired only under a claim's lease (Forwarder calls publish_claimed)"
        return PublishReport(failed=[DeliveryFailure(d.id, why) for d in deliveries])

    def _prepare(self, d: Delivery, now: int) -> _Firing:
        """Decode and plan one entry, and make its run deliveries."""
        template = self.maker.template(d.envelope)
        state = state_of(d.envelope)
        planned = plan_entry(state, now)
        f = _Firing(d, template, state, planned.plan, [], [])
        for run in [Run(slot) for slot in planned.plan.runs] + planned.extra:
            delivery = self.maker.run(d, template, state, run, now)
            (f.runs if run.kind == SCHEDULED else f.extra).append(delivery)
            f.made[delivery.id] = run
        return f

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        report = PublishReport()
        now = lease.now_ms()  # the store's clock, as its forwarder's: the misfire policy's "now"
        fired: list[_Firing] = []
        shorter: dict[int, list[str]] = {}
        for d in deliveries:
            try:  # one entry that cannot be decoded, planned or encoded fails alone
                f = self._prepare(d, now)
                fit = entry_lease_ms(f.state, lease.store.config.lease_ms)
            except EntryWaits as exc:
                report.failed.append(DeliveryFailure(d.id, f"periodic entry not fired: {exc}", waits=True))
                continue
            except Exception as exc:
                why = f"cannot fire this periodic entry: {type(exc).__name__}: {exc}"
                report.failed.append(DeliveryFailure(d.id, why, permanent=True))
                continue
            fired.append(f)
            if fit < lease.store.config.lease_ms:
                shorter.setdefault(fit, []).append(d.id)
        for fit, ids in shorter.items():  # before the publish: a kill from here on costs one short lease
            lease.extend(ids, lease_ms=fit)
        store = lease.store if isinstance(lease.store, DelayStore) else None
        fired = self._overlap(fired, store, report)
        runs = [run for f in fired for run in f.deliveries]
        sent = self.inner.publish_many(runs) if runs else PublishReport()
        report.broker_error = sent.broker_error
        published, unsent = set(sent.published), set(sent.unsent)
        failed = {f.id: f for f in sent.failed}
        done = [f for f in fired if all(run.id in published for run in f.deliveries)]
        self._rearm(lease, done, now, report)
        for f in fired:
            ids = [run.id for run in f.deliveries]
            if f.following is not None:
                report.published.append(f.d.id)
                report.acked.append(f.d.id)
                continue
            _give_back_slot(store, f, self._slot_run)
            if any(i in unsent for i in ids):  # given back: its runs go again, all of them
                report.unsent.append(f.d.id)
            else:
                # the broker refused a run: the entry waits (no attempt counted), never a dead letter
                errors = [failed[i] for i in ids if i in failed] or [DeliveryFailure(f.d.id, "not published")]
                error, permanent = "; ".join(e.error for e in errors), all(e.permanent for e in errors)
                report.failed.append(DeliveryFailure(f.d.id, error, permanent=permanent, waits=not permanent))
        return report

    def _overlap(self, fired: list[_Firing], store: DelayStore | None, report: PublishReport) -> list[_Firing]:
        """Apply the overlap policies: an entry with one fires only its latest due period (the
        earlier ones would overlap it: skipped), which runs if its slot is free, waits in the
        slot's line (buffer_one: scheduled as a slotted task, due now) or is skipped. An entry
        whose slot cannot be asked waits, as when its broker refuses (the limit is what the
        policy protects). Manual and backfill runs are sent as asked."""
        asks: dict[str, OverlapAsk] = {}
        for f in fired:
            if f.state.overlap != ALLOW and f.runs:
                f.skipped, f.runs = len(f.runs) - 1, f.runs[-1:]
                f.plan = replace(f.plan, runs=f.plan.runs[-1:])
                member = _member(f.runs[0], self._slot_run)
                asks[f.state.name] = OverlapAsk(f.state.overlap, member, _order(f.state, f.runs[0]))
        if not asks:
            return fired
        if store is None:  # a forwarder role's store alone (no slots): the limit is what counts
            outcomes: Mapping[str, Fire | Exception] = {n: DelayqError("no slot role on this store") for n in asks}
        else:
            outcomes = fire_runs(store, asks)
        kept: list[_Firing] = []
        for f in fired:
            outcome = outcomes.get(f.state.name, Fire.RUN)
            try:
                if isinstance(outcome, Exception):
                    raise outcome
                if outcome is Fire.WAIT and store is not None:  # its own item from now on: in the line
                    run = f.runs[0]
                    envelope = with_slot(run.envelope, overlap_slot(f.state.name), f.state.rank)
                    store.schedule(_task_id(run), from_ms(run.ready_ms), envelope, mode="keep", rank=f.state.rank)
                    f.runs = []
                elif outcome is Fire.SKIP:
                    f.skipped += 1
                    f.runs, f.plan = [], replace(f.plan, runs=[])
            except Exception as exc:
                why = f"its overlap policy could not be applied ({type(exc).__name__}: {exc})"
                report.failed.append(DeliveryFailure(f.d.id, why, waits=True))
                continue
            f.taken = outcome is Fire.RUN and f.state.name in asks
            kept.append(f)
        return kept

    def _rearm(self, lease: Lease, fired: list[_Firing], now: int, report: PublishReport) -> None:
        """Ack the fired entries and schedule their next periods (clearing their pending
        actions), one script call each under our lease, all in one round trip; then
        :meth:`_after_rearm` for those rearmed.

        One round trip for the claim, not one per entry (and one more per run for its history):
        on a busy machine each was a wait for the CPU, so a pass of many entries ran long and
        the entries falling due meanwhile waited for it."""
        items = []
        for f in fired:
            f.following = following = f.state.fired(f.plan, now, f.skipped)
            items.append(_next_item(lease, f.d, following, f.state.rank))
        checked = [item for item in items if not isinstance(item, Exception)]
        answered: Sequence[RearmOutcome | Exception]
        try:
            answered = lease.rearm_many(checked) if checked else []
        except Exception as exc:  # the store away: no entry was rearmed
            answered = [exc] * len(checked)
        replies = iter(answered)
        rearmed: list[_Firing] = []
        for f, item in zip(fired, items):
            outcome = item if isinstance(item, Exception) else next(replies)
            if isinstance(outcome, Exception):  # the run went out; the item stays leased and fires again later
                log.error(
                    "periodic entry %r: sent, but its next run could not be scheduled (%s: %s); it is fired again "
                    "when its lease runs out",
                    f.state.name,
                    type(outcome).__name__,
                    outcome,
                )
            elif outcome is RearmOutcome.HELD:
                log.warning("periodic entry %r: our lease ran out while firing it; another forwarder has it",
                            f.state.name)  # fmt: skip
            elif outcome is RearmOutcome.NOT_FOUND:
                log.info("periodic entry %r was removed while being fired", f.state.name)
            else:
                rearmed.append(f)
        self._after_rearm(rearmed, lease, report)

    def _after_rearm(self, rearmed: list[_Firing], lease: Lease, report: PublishReport) -> None:
        """Entries fired and rearmed (their runs sent, their next periods stored): record their
        runs and missed periods in their history (one round trip), report what their policies
        dropped. The one place a firing is known complete."""
        fired = []
        for f in rearmed:
            made = [f.made[d.id] for d in (*f.runs, *f.extra)]
            fired.append(Fired(f.state.name, [_sent(f.state, run) for run in made], f.plan.missed))
        if fired:
            report_fired(lease.store, fired)
        for f in rearmed:
            state, plan = f.state, f.plan
            if f.skipped:
                log.info("periodic entry %r: %d period(s) skipped, its last run still running (overlap %s)",
                         state.name, f.skipped, state.overlap)  # fmt: skip
                report.skipped.append(Skipped(f.d.id, state.name, f.skipped))
            if plan.missed:
                log.warning(
                    "periodic entry %r: %d period(s) missed (%s), %d run(s) sent; next %s",
                    state.name,
                    plan.missed,
                    state.misfire.policy,
                    len(plan.runs),
                    describe_time(plan.next.at_ms),
                )
            if f.following is not None and f.following.finished and not state.finished:
                log.info("periodic entry %r finished (its last period ran); it stays listed", state.name)

    def queue_depth(self, queue: str) -> int:
        """The inner target's depth probe (flow control), when it has one."""
        probe = getattr(self.inner, "queue_depth", None)
        if probe is None:
            raise NotImplementedError("the inner target has no queue depth probe")
        return int(probe(queue))

    def close(self) -> None:
        """The inner target is the forwarder's too; it closes it."""
