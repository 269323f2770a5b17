"""The slot proof runs' analysis, for Celery and RQ alike: each run of a task as the task saw it
(its start and end by its own clock, the process that ran it), the runs live at one moment, and
how long a key took to drain.

A task records ``{"id", "tag", "phase": "began"|"ended", "at_ms", "pid"}`` at its start and end
(``dqt.span``, ``tests.test_rq.jobs.span``); its tag is ``<slot key>-<n>``. A run that began and
never ended was killed: it was live from its start until its process died (the kill's time), not
until its slot's hold lapsed, so the overlap counts what really ran at once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.helpers import max_overlap

__all__ = ["Drain", "Kill", "Run", "drain_of", "runs_of"]


@dataclass(frozen=True)
class Run:
    """One run of a task: its slot key, start and end in s (end None: its process was killed)."""

    id: str
    key: str
    began: float
    ended: float | None
    pid: int


@dataclass(frozen=True)
class Kill:
    """A SIGKILL sent by the test: the process and when (s, the same machine's clock)."""

    pid: int
    at: float


def runs_of(records: Iterable[Mapping[str, Any]]) -> list[Run]:
    """The runs the records tell of, in start order: each start paired with the next end of the
    same task in the same process."""
    open_runs: dict[tuple[str, int], Mapping[str, Any]] = {}
    runs: list[Run] = []
    for r in records:
        at = (r["id"], r["pid"])
        if r["phase"] == "began":
            if at in open_runs:  # began again in the same process with no end: the first never ended
                runs.append(_run(open_runs[at], None))
            open_runs[at] = r
        else:
            runs.append(_run(open_runs.pop(at), r))
    runs += [_run(r, None) for r in open_runs.values()]
    return sorted(runs, key=lambda run: run.began)


def _run(began: Mapping[str, Any], ended: Mapping[str, Any] | None) -> Run:
    key = str(began["tag"]).rsplit("-", 1)[0]
    return Run(began["id"], key, began["at_ms"] / 1000, None if ended is None else ended["at_ms"] / 1000, began["pid"])


@dataclass(frozen=True)
class Drain:
    """How one key's tasks ran: the most live at once, the time from the first start to the last
    end against ``ceil(n / limit)`` task times, and per kill how long the key ran below its limit
    after it (until as many ran as its limit again: what the kill cost) and how long until the
    killed task started again."""

    key: str
    most_at_once: int
    elapsed: float
    ideal: float
    kill_costs: tuple[float, ...]
    restarts: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return self.elapsed / self.ideal

    def __str__(self) -> str:
        costs = ", ".join(f"{c:.2f} s" for c in self.kill_costs) or "no kills"
        restarts = ", ".join(f"{c:.2f} s" for c in self.restarts) or "-"
        return (
            f"{self.key}: at most {self.most_at_once} at once, {self.elapsed:.2f} s for an ideal "
            f"{self.ideal:.2f} s ({self.ratio:.3f}x); below the limit after a kill: {costs}; "
            f"killed task started again after: {restarts}"
        )


def drain_of(runs: Sequence[Run], key: str, ids: Sequence[str], *, limit: int, seconds: float,
             kills: Sequence[Kill] = ()) -> Drain:  # fmt: skip
    """Check that every task of ``ids`` (slot ``key``) ran to its end exactly once, and measure
    its drain (see :class:`Drain`); a run with no end must be one the test killed."""
    mine = [r for r in runs if r.key == key]
    ended = Counter(r.id for r in mine if r.ended is not None)
    assert not set(ids) - set(ended), f"{len(set(ids) - set(ended))} tasks of {key} never ran to their end"
    assert max(ended.values()) == 1, f"ran to their end twice: {[i for i, n in ended.items() if n > 1]}"
    killed_at = {k.pid: k.at for k in kills}
    spans = []
    for r in mine:
        end = r.ended if r.ended is not None else killed_at.get(r.pid)
        assert end is not None, f"{r.id} began in process {r.pid} and never ended, but no kill hit it"
        spans.append((r.began, end))
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    costs = tuple(_below_limit_after(spans, k.at, limit) for k in kills)
    victims = {r.pid: r.id for r in mine if r.ended is None}
    restarts = tuple(min(r.began for r in mine if r.id == victims[k.pid] and r.began > k.at) - k.at for k in kills)
    return Drain(key, max_overlap(spans), elapsed, math.ceil(len(ids) / limit) * seconds, costs, restarts)


def _below_limit_after(spans: Sequence[tuple[float, float]], at: float, limit: int) -> float:
    """Seconds from ``at`` until ``limit`` spans are live again (or the last end: the line ran out)."""
    live = sum(1 for start, end in spans if start <= at < end)
    if live >= limit:
        return 0.0
    events = sorted([(s, 1) for s, _ in spans if s > at] + [(e, -1) for _, e in spans if e > at])
    for t, step in events:
        live += step
        if live >= limit:
            return t - at
    return max(e for _, e in spans) - at
