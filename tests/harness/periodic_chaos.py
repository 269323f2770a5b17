"""Edits under fire: periodic entries edited, paused and run now while two forwarders fire them
and one of them is SIGKILLed and restarted again and again; and the checks of what the workers
ran against what the actions asked (used by the Celery and RQ chaos tests).

Times are epoch ms of this host: the test's calls (``time.time``), the workers' start times and
the store's clock (the embedded server's ``TIME``) all read the same clock, give or take
:data:`CLOCK_SLACK_MS`. An action takes
effect when its call returns; a run's period is its ``delayq_periodic`` mark (``due``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayq_backends import DelayStore
from delayq_backends.envelope import Envelope
from delayq_backends.periodic import ops
from delayq_backends.periodic.firing import MANUAL, SCHEDULED, Run
from delayq_backends.periodic.ops import EntrySpec, item_id
from delayq_backends.periodic.schedules import Period, run_task_id
from delayq_backends.periodic.state import state_of
from tests.harness.launch import Proc
from tests.helpers import wait_for

__all__ = [
    "CLOCK_SLACK_MS",
    "ENTRIES",
    "START_SLACK_MS",
    "Action",
    "Chaos",
    "Epoch",
    "RunRecord",
    "Scenario",
    "check_args",
    "check_manual_runs",
    "check_paused",
    "check_periods",
    "next_slot_ms",
    "unique_runs",
]

#: the scenario's entries: name -> (period s, misfire policy). ``once`` is run now, ``flip``'s
#: schedule flips between 1 s and 2 s, ``pauser`` is paused and resumed, ``args`` gets new arguments
ENTRIES = {"once": (1.0, "run_once"), "flip": (1.0, "run_all"), "pauser": (1.0, "run_all"), "args": (1.0, "run_all")}
#: how far the store's clock (the server's, read through its client) and this process's may differ
CLOCK_SLACK_MS = 5
#: a run published just before a pause returned may start this much later (an idle worker)
START_SLACK_MS = 500


def _now() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class RunRecord:
    """One run a worker executed: its task (job) id, entry, period, kind, start, and tag (its first
    argument)."""

    id: str
    entry: str
    due_ms: int
    kind: str
    started_ms: int
    tag: str
    #: when the forwarder sent it, where the worker can tell (an RQ job's ``enqueued_at``)
    sent_ms: int | None = None

    @classmethod
    def parse(
        cls, id: str, mark: Mapping[str, Any], started_ms: int, tag: str, sent_ms: int | None = None
    ) -> RunRecord:
        """From a run's ``delayq_periodic`` mark (``name``, ``due``, ``kind`` unless scheduled)."""
        kind = str(mark.get("kind", SCHEDULED))
        return cls(id, str(mark["name"]), int(mark["due"]), kind, started_ms, tag, sent_ms)


@dataclass(frozen=True)
class Action:
    """One action of the test on an entry: when it was called and when it returned (ms)."""

    entry: str
    verb: str
    called_ms: int
    returned_ms: int
    #: what it set: a schedule's period, a tag (the entry's first argument)
    every_ms: int | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Epoch:
    """An entry under one schedule: its periods are ``anchor_ms + k * every_ms``, from ``anchor_ms``;
    in force from the update that set it (``called_ms`` … ``returned_ms``)."""

    every_ms: int
    anchor_ms: int
    called_ms: int
    returned_ms: int

    def periods(self, start: int, end: int) -> list[int]:
        """Its periods in ``[start, end]`` (not before its anchor)."""
        first = max(start, self.anchor_ms)
        k = -((self.anchor_ms - first) // self.every_ms)
        return list(range(self.anchor_ms + k * self.every_ms, end + 1, self.every_ms))


def next_slot_ms(store: DelayStore, name: str) -> int:
    """Entry ``name``'s next period as stored (a pending run now leaves it as it is)."""
    item = store.get(item_id(name))
    assert item is not None, f"entry {name!r} is gone"
    return state_of(Envelope.decode(item.envelope)).slot.at_ms


@dataclass
class Chaos:
    """Two forwarders, one SIGKILLed and restarted at a time (the other keeps firing), and the
    test's actions, each logged with its call and return times.

    Kills are aimed: each waits for one of ``aims`` (entry names, in turn) to come due and kills
    as soon as a forwarder has claimed it (half the time the killed one). ``hits`` counts the
    kills after which that entry was still leased 150 ms on (a live forwarder's firing takes
    milliseconds): the killed forwarder held it, mid-firing.
    """

    start: Callable[[str], Proc]
    kill: Callable[[Proc], None]
    store: DelayStore
    #: the path of a log file by its name (the forwarder ``name`` logs to ``<name>.log``)
    log: Callable[[str], Path]
    aims: Sequence[str] = ()
    forwarders: list[Proc] = field(default_factory=list)
    names: list[str] = field(default_factory=lambda: ["forwarder-a", "forwarder-b"])
    #: called with the aimed entry's name right after each kill (an edit while it is held)
    on_kill: Callable[[str], None] | None = None
    kills: int = 0
    hits: int = 0
    actions: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.forwarders = [self.start(name) for name in self.names]
        for name in self.names:
            self._wait_started(name)

    def _wait_started(self, name: str) -> None:
        """Until forwarder ``name`` forwards: a kill never leaves no forwarder running (an outage,
        whose periods an edit may replace, is not what this tests)."""
        wait_for(lambda: "started:" in self.log(f"{name}.log").read_text(errors="replace"), 60, f"{name} to start")

    def kill_one(self) -> None:
        """SIGKILL one forwarder (in turn) as an aimed entry fires, and start it again at once."""
        aim = self.aims[self.kills % len(self.aims)] if self.aims else None
        if aim is not None:  # kill as soon as a forwarder claimed it: half the time, the killed one
            due = next_slot_ms(self.store, aim)
            time.sleep(max(0.0, min(2.0, (due - _now()) / 1000 - 0.005)))
            until = time.monotonic() + 0.3
            while not self._leased(aim) and time.monotonic() < until:
                pass
        i = self.kills % 2
        self._wait_started(self.names[1 - i])
        self.kill(self.forwarders[i])
        self.kills += 1
        self.names[i] = f"forwarder-{'ab'[i]}-{self.kills}"
        self.forwarders[i] = self.start(self.names[i])
        if aim is not None:
            time.sleep(0.15)
            self.hits += self._leased(aim)
            if self.on_kill is not None:
                self.on_kill(aim)

    def _leased(self, name: str) -> bool:
        item = self.store.get(item_id(name))
        return item is not None and item.leased_until_ms is not None

    def act(self, entry: str, verb: str, call: Callable[[], object], **detail: Any) -> Action:
        called = _now()
        call()
        action = Action(entry, verb, called, _now(), **detail)
        self.actions.append(action)
        return action

    def run(
        self, seconds: float, steps: Sequence[Callable[[], None]], *, step_s: float, kill_s: float, seed: int
    ) -> None:
        """For ``seconds``: every ``step_s`` the next of ``steps`` (in turn), and about every
        ``kill_s`` (jittered by ``seed``) :meth:`kill_one`."""
        rng = random.Random(seed)
        begin = time.monotonic()
        next_step, next_kill, i = begin + step_s, begin + kill_s * rng.uniform(0.5, 1.0), 0
        while time.monotonic() < begin + seconds:
            time.sleep(max(0.0, min(next_step, next_kill) - time.monotonic()))
            if time.monotonic() >= next_kill:
                self.kill_one()
                next_kill += kill_s * rng.uniform(0.6, 1.4)
            if time.monotonic() >= next_step:
                steps[i % len(steps)]()
                i += 1
                next_step += step_s

    def summary(self) -> str:
        return f"{self.kills} kills ({self.hits} mid-firing), {len(self.actions)} actions"

    def of(self, entry: str, verb: str) -> list[Action]:
        return [a for a in self.actions if a.entry == entry and a.verb == verb]


def unique_runs(runs: Iterable[RunRecord]) -> tuple[list[RunRecord], dict[str, int]]:
    """Each run once (its first record), and the ids that ran more than once (how often).

    A scheduled run's id must be its period's, ``uuid5(name, period)``: a period sent twice (the
    at-least-once window, a kill between the broker's confirm and the rearm) is sent with the
    same id, so it shows here as a repeated id, never as a second period.
    """
    first: dict[str, RunRecord] = {}
    seen: dict[str, int] = {}
    for run in runs:
        if run.kind == SCHEDULED:
            assert run.id == run_task_id(run.entry, Period(str(run.due_ms), run.due_ms)), f"not its period's id: {run}"
        seen[run.id] = seen.get(run.id, 0) + 1
        first.setdefault(run.id, run)
    return list(first.values()), {i: n for i, n in seen.items() if n > 1}


def check_periods(
    name: str, runs: Sequence[RunRecord], epochs: Sequence[Epoch], end_ms: int, *, lost_allowed: int = 0
) -> list[int]:
    """Every period of every schedule ``name`` had ran once, and no other (``runs``: unique).

    Epoch ``i``'s periods from its anchor to the call of the next update must have run (at most
    ``lost_allowed`` of them in all may be missing: a policy's allowance); those between that
    call and its return may have (the update waited for a firing); none after it did (the old
    schedule is gone once the update returned). The last epoch runs to ``end_ms`` (exclusive: the
    entry's next period when the forwarders stopped). Returns the missing periods.
    """
    ran = sorted(r.due_ms for r in runs if r.entry == name and r.kind == SCHEDULED)
    must: set[int] = set()
    may: set[int] = set()
    for i, epoch in enumerate(epochs):
        upto = epochs[i + 1] if i + 1 < len(epochs) else None
        must |= set(epoch.periods(epoch.anchor_ms, upto.called_ms - CLOCK_SLACK_MS if upto else end_ms - 1))
        if upto is not None:
            may |= set(epoch.periods(upto.called_ms - CLOCK_SLACK_MS + 1, upto.returned_ms + CLOCK_SLACK_MS))
    stray = [p for p in ran if p not in must | may]
    assert not stray, f"{name}: runs of periods no schedule in force had (or past its end): {stray}"
    missing = sorted(must - set(ran))
    assert len(missing) <= lost_allowed, (
        f"{name}: periods that did not run: {missing} (allowed {lost_allowed}); ran {ran}; schedules {list(epochs)}; "
        f"next period {end_ms}"
    )
    return missing


def check_paused(name: str, runs: Sequence[RunRecord], pauses: Sequence[tuple[Action, Action]]) -> None:
    """No run of ``name`` went out while it was paused (from the pause's return to the resume's
    call): none sent then (where runs tell when they were sent), none started then for a period due
    after the pause, and none at all once an idle worker had had :data:`START_SLACK_MS` to start
    what was sent before."""

    def sent_while(r: RunRecord, begin: int, end: int) -> bool:
        if r.sent_ms is not None:
            return begin + CLOCK_SLACK_MS <= r.sent_ms < end
        due_after = r.due_ms >= begin + CLOCK_SLACK_MS
        return begin <= r.started_ms < end and (due_after or r.started_ms >= begin + START_SLACK_MS)

    for paused, resumed in pauses:
        begin, end = paused.returned_ms, resumed.called_ms
        fired = [r for r in runs if r.entry == name and r.kind == SCHEDULED and sent_while(r, begin, end)]
        assert not fired, f"{name}: ran while paused ({begin}..{end}): {fired}"


def check_manual_runs(name: str, runs: Sequence[RunRecord], asked: Sequence[Action]) -> None:
    """Each run now of ``name`` ran once: one manual run per call, its request time inside that
    call, its id ``uuid5(name, "manual:<request ms>")``."""
    manual = sorted((r for r in runs if r.entry == name and r.kind == MANUAL), key=lambda r: r.due_ms)
    for run in manual:
        assert run.id == Run(Period(str(run.due_ms), run.due_ms), MANUAL).task_id(name), run
    slack = CLOCK_SLACK_MS
    matched = [[r for r in manual if a.called_ms - slack <= r.due_ms <= a.returned_ms + slack] for a in asked]
    assert [len(m) for m in matched] == [1] * len(asked), f"{name}: manual runs per run now: {matched}"
    assert len(manual) == len(asked), f"{name}: {len(manual)} manual runs for {len(asked)} run now calls"


def check_args(name: str, runs: Sequence[RunRecord], changes: Sequence[Action], first_tag: str) -> None:
    """Once a change of ``name``'s arguments returned, no run of a later period carries older ones
    (each change sets a new tag; a period due just before a change may carry either, as it was
    claimed before or after it), and no run carries a change's before it was asked."""
    order = [first_tag, *(str(a.tag) for a in changes)]
    for run in (r for r in runs if r.entry == name):
        oldest = sum(1 for a in changes if a.returned_ms < run.due_ms)
        newest = sum(1 for a in changes if a.called_ms <= run.started_ms)
        assert run.tag in order[oldest : newest + 1], (
            f"{name}: args {run.tag!r}, want one of {order[oldest : newest + 1]}: {run}"
        )


@dataclass
class Scenario:
    """The edits of :data:`ENTRIES` under fire, for one entry kind: ``spec`` makes an entry's
    definition (name, period s, tag = its first argument; misfire policy from :data:`ENTRIES`
    or the kind's own entries), and the schedules each entry had (its :class:`Epoch` list).
    Entry names start with ``label`` (RQ job ids, ``uuid5(name, period)``, have no prefix)."""

    chaos: Chaos
    store: DelayStore
    spec: Callable[[str, float, str], EntrySpec]
    label: str = ""
    epochs: dict[str, list[Epoch]] = field(default_factory=dict)

    def name(self, entry: str) -> str:
        """The stored name of scenario entry ``entry``."""
        return self.label + entry

    def upsert(self, entry: str, every: float, tag: str | None = None) -> None:
        """Add or update entry ``entry`` (through ``ops.upsert``), noting a new schedule's periods."""
        name = self.name(entry)
        verb = "update" if name in self.epochs else "add"
        spec = self.spec(name, every, tag or entry)
        every_ms = int(every * 1000)
        action = self.chaos.act(name, verb, lambda: ops.upsert(self.store, spec), every_ms=every_ms, tag=tag)
        if verb == "add" or every_ms != self.epochs[name][-1].every_ms:
            epoch = Epoch(every_ms, next_slot_ms(self.store, name), action.called_ms, action.returned_ms)
            # a new schedule's first period is one period after the change (as after a sync)
            first = (action.called_ms + every_ms - CLOCK_SLACK_MS, action.returned_ms + every_ms + CLOCK_SLACK_MS)
            assert first[0] <= epoch.anchor_ms <= first[1], f"{name}: first period {epoch.anchor_ms}, want {first}"
            self.epochs.setdefault(name, []).append(epoch)

    def steps(self) -> list[Callable[[], None]]:
        """Add :data:`ENTRIES`; the edits :meth:`Chaos.run` makes in turn: flip a schedule, pause,
        run now, change arguments, resume (paused for three steps of each five)."""
        for name, (every, _) in ENTRIES.items():
            self.upsert(name, every)
        flips, tags = iter(range(1, 1_000_000)), iter(range(1, 1_000_000))
        store, act, pauser, once = self.store, self.chaos.act, self.name("pauser"), self.name("once")
        self.chaos.on_kill = self.edit_held
        return [
            lambda: self.upsert("flip", 1.0 + next(flips) % 2),
            lambda: act(pauser, "pause", lambda: ops.pause(store, pauser)),
            lambda: act(once, "run_now", lambda: ops.run_now(store, once)),
            lambda: self.upsert("args", 1.0, f"args-{next(tags)}"),
            lambda: act(pauser, "resume", lambda: ops.resume(store, pauser)),
        ]

    def edit_held(self, name: str) -> None:
        """Edit the entry a kill was aimed at, while the killed forwarder may still hold it: flip
        ``flip``'s schedule, change ``args``'s arguments (the edit waits for the lease to run out)."""
        if name == self.name("flip"):
            self.upsert("flip", 3.0 - self.epochs[name][-1].every_ms / 1000)
        elif name == self.name("args"):
            self.upsert("args", 1.0, f"args-held-{self.chaos.kills}")

    def finish(self) -> None:
        """Resume ``pauser`` if the run ended while it was paused."""
        pauser = self.name("pauser")
        if len(self.chaos.of(pauser, "pause")) > len(self.chaos.of(pauser, "resume")):
            self.chaos.act(pauser, "resume", lambda: ops.resume(self.store, pauser))

    def check(
        self, runs: Sequence[RunRecord], ends: Mapping[str, int], lost_allowed: Mapping[str, int]
    ) -> dict[str, list[int]]:
        """Every check, on ``runs`` (unique) and each entry's next period when the forwarders
        stopped (``ends``); ``lost_allowed``: periods an entry's policy may lose (else none); all
        by stored name. Returns each entry's missing periods."""
        missing = {
            name: check_periods(name, runs, epochs, ends[name], lost_allowed=lost_allowed.get(name, 0))
            for name, epochs in self.epochs.items()
        }
        pauser, once, args = self.name("pauser"), self.name("once"), self.name("args")
        pauses = list(zip(self.chaos.of(pauser, "pause"), self.chaos.of(pauser, "resume")))
        check_paused(pauser, runs, pauses)
        check_manual_runs(once, runs, self.chaos.of(once, "run_now"))
        check_args(args, runs, self.chaos.of(args, "update"), "args")
        assert len(self.epochs[self.name("flip")]) >= 4 and len(pauses) >= 2, f"too few edits: {self.chaos.actions}"
        return missing
