#!/usr/bin/env python
"""Celery periodic entries at scale: 1,000,000 entries, edits, pause and run-now while firing,
fire lateness with run history on, memory per entry with and without history.

Run ``python bench/periodic_scale.py`` (1M entries, a 240 s window: about 8 min) or
``--entries 100000 --window 60`` (about 2 min). It starts two Valkey servers of its own
(``EmbeddedServer``: the delay store, and the Celery broker, so the store's ``INFO memory`` holds
the entries alone and the system Redis is untouched), then:

1. times ``periodic.ops.upsert`` (the runtime add users call: registry line, read, one script)
   on a sample under a prefix of its own, and extrapolates it to N entries;
2. stores N runtime entries (every 3600 s, the first periods staggered evenly over the hour, so
   N/3600 fall due each second: 278/s for 1M). Each is built as a user builds it
   (``celery.periodic.entry_spec``; one Celery message capture, then the spec renamed per entry)
   and written in bulk (``schedule_checked`` plus the registry hash): the same envelope, ready
   time, rank and registry line ``ops.upsert`` writes, checked byte for byte against it for one
   entry before the load (:func:`check_bulk_path`); only the first period differs (staggered);
3. measures memory without history: ``INFO memory`` used_memory before and after, ``MEMORY
   USAGE`` of the shard keys and the registry, per entry;
4. starts 2 ``delayq forward --celery-broker redis://…`` processes and drains the broker's
   Celery queue in a thread, stamping each run as it lands. The firing records each run's
   history (one ``periodic_run.lua`` call per run after the rearm, a claim's in one round trip),
   so the lateness below is with history on;
5. during the window, acts on entries one at a time through ``periodic.ops``, the runtime path
   users call: ``upsert`` with a new schedule (next run now + 1 s) and with a new message (kwargs,
   for an entry due in ~1 s), each timed from the call's return to its run landing; ``pause`` of
   an entry due in ~1 s (its run must not land: checked until 1 s after its period);
   ``run_now`` (timed from the call to the manual run landing);
6. reports the lateness (landed − period time) of every run whose period lies in the window
   (goal: p99 ≤ 50 ms), the load average and the processes' CPU; then memory after runs: the
   history keys and envelope growth of entries fired once in the window, and of a sample given
   ``--history-runs`` full runs (published, started, finished) through ``periodic.history``;
   and cProfiles a forwarder (``--profile``) when asked.

JSON goes to stdout, progress to stderr, and a section is appended to bench/RESULTS.md unless
``--no-results``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from lib.processes import Processes
from lib.report import RESULTS_PATH, code_digest, distribution, fmt_dist, loadavg, log, median_spread, write_results
from lib.waiting import wait_for

from delayq_backends import Config, DelayStore
from delayq_backends.celery.periodic import entry_spec
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.keys import periodic_key
from delayq_backends.models import ScheduleItem
from delayq_backends.periodic import ops
from delayq_backends.periodic.history import (
    HISTORY_SIZE,
    RUN_HEADER,
    RunMark,
    history_keys,
    read_histories,
    record_finished,
    record_published,
    record_started,
)
from delayq_backends.periodic.ops import EntrySpec, item_id
from delayq_backends.periodic.schedules import Period, run_task_id
from delayq_backends.periodic.state import state_of, with_state

HOUR_MS = 3_600_000
TASK = "dqb.tick"
#: goals of issue 25
EDIT_GOAL_MS = 1000
LATENESS_P99_GOAL_MS = 50


# -- building and loading entries -------------------------------------------------------------------


def _app(broker_url: str, queue: str) -> Celery:
    """The app whose sender builds the entries' messages (no connection is made)."""
    app = Celery("dqb")
    app.conf.update(broker_url=broker_url, task_default_queue=queue, enable_utc=True)
    return app


def spec_of(app: Celery, name: str, *, every_s: float = HOUR_MS / 1000, edit_no: int = 0) -> EntrySpec:
    """Entry ``name`` as a user adds it at runtime (``entry_spec``: Celery's sender builds its message)."""
    conf = {"task": TASK, "schedule": every_s, "args": ("report",), "kwargs": {"edit": edit_no}}
    return entry_spec(app, name, conf)


def stored_envelope(spec: EntrySpec, slot: Period, now_ms: int) -> tuple[bytes, int]:
    """The envelope ``ops.upsert`` stores for ``spec`` as a new entry, with its first period at
    ``slot`` (upsert's is the first after now); and the item's ready time."""
    state = replace(spec.state(None, now_ms), slot=slot)
    return with_state(spec.template.envelope, state), state.ready_ms()


def check_bulk_path(store: DelayStore, app: Celery, template: EntrySpec) -> None:
    """The bulk load writes what ``ops.upsert`` writes: for one entry added by ``upsert`` (its
    spec built by ``entry_spec`` for its name), the envelope built from ``template`` renamed, at
    the period ``upsert`` chose, is the same bytes, ready time and rank, and the registry line is
    the same. Then the entry is removed again.

    Raises:
        AssertionError: the bulk path would store something else (the bench would measure it).
    """
    name = "bulk-check"
    outcome = ops.upsert(store, spec_of(app, name))
    item = store.get(item_id(name))
    if outcome != "added" or item is None:
        raise AssertionError(f"ops.upsert of {name!r}: {outcome}, item {item}")
    slot = state_of(Envelope.decode(item.envelope)).slot
    envelope, ready = stored_envelope(replace(template, name=name), slot, store.clock())
    registered = store.client.hget(periodic_key(store.config.prefix), name)
    if (item.envelope, item.ready_ms, item.rank, registered) != (envelope, ready, template.template.rank,
                                                                  item_id(name).encode()):  # fmt: skip
        raise AssertionError(
            f"the bulk load would store another entry than ops.upsert:\n upsert {item} (registry {registered!r})\n"
            f" bulk   envelope {envelope!r}, ready {ready}, rank {template.template.rank}"
        )
    ops.remove(store, [name])


@dataclass(frozen=True)
class UpsertCost:
    """``ops.upsert`` of new entries, one at a time: per-call times and the rate."""

    count: int
    call_ms: dict[str, float]
    rate: float


def upsert_cost(client: redis.Redis, app: Celery, prefix: str, shards: int, count: int) -> UpsertCost:
    """Time ``count`` ``ops.upsert`` calls adding entries (under ``prefix``, apart from the
    bench's entries); each spec is built beforehand, so the figure is the store's path alone."""
    store = DelayStore(client, Config(prefix=prefix, shards=shards))
    template = spec_of(app, "u")
    specs = [replace(template, name=f"u{i:07d}") for i in range(count)]
    times = []
    start = time.perf_counter()
    for spec in specs:
        called = time.perf_counter()
        if ops.upsert(store, spec) != "added":
            raise AssertionError(f"ops.upsert of {spec.name!r} did not add it")
        times.append((time.perf_counter() - called) * 1000)
    return UpsertCost(count, median_spread(times), round(count / (time.perf_counter() - start)))


@dataclass(frozen=True)
class Layout:
    """N hourly entries, entry i first due at ``start_ms + i * spread / N``: spread over the hour
    (N/3600 fall due each second), or over less, to fire as many per second with fewer entries."""

    entries: int
    start_ms: int
    spread_ms: int = HOUR_MS

    def name(self, i: int) -> str:
        return f"e{i:07d}"

    def due_ms(self, i: int) -> int:
        return self.start_ms + i * self.spread_ms // self.entries

    def index_due_after(self, ms: int) -> int:
        """The first entry whose first period is at or after ``ms`` (within the hour)."""
        i = -(-(ms - self.start_ms) * self.entries // self.spread_ms)
        return min(max(i, 0), self.entries - 1)

    def between(self, low_ms: int, high_ms: int) -> range:
        return range(self.index_due_after(low_ms), self.index_due_after(high_ms))


def load(store: DelayStore, template: EntrySpec, layout: Layout, chunk: int = 20_000) -> float:
    """Store every entry of ``layout`` as ``ops.upsert`` would (:func:`check_bulk_path`): items
    through the bulk path, registry lines in pipelines; returns the seconds it took."""
    registry = periodic_key(store.config.prefix)
    now = store.clock()
    start = time.perf_counter()
    for low in range(0, layout.entries, chunk):
        items, names = [], {}
        for i in range(low, min(low + chunk, layout.entries)):
            spec, at = replace(template, name=layout.name(i)), layout.due_ms(i)
            ident = item_id(spec.name)
            envelope, ready = stored_envelope(spec, Period(str(at), at), now)
            items.append(ScheduleItem(ident, ready, store.check_payload(ident, envelope), spec.template.rank))
            names[spec.name] = ident
        store.client.hset(registry, mapping=names)  # first, as upsert: a stored entry is always listed
        store.schedule_checked(items, mode="replace")
        if low // chunk % 10 == 0:
            log(f"  loaded {low + len(items):,} entries")
    return time.perf_counter() - start


def memory(store: DelayStore) -> dict[str, int]:
    """Bytes of the store's keys (exact ``MEMORY USAGE … SAMPLES 0``) and the server's used_memory."""
    client = store.client
    usage = {"used_memory": int(client.info("memory")["used_memory"])}
    shards = [store.keys(k) for k in range(store.config.shards)]
    keys = [periodic_key(store.config.prefix), *(k for shard in shards for k in (shard.due, shard.items))]
    usage["keys"] = _key_bytes(client, keys)
    return usage


def _key_bytes(client: Any, keys: Sequence[str]) -> int:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.memory_usage(key, samples=0)
        return sum(int(n or 0) for n in pipe.execute())


def history_bytes(store: DelayStore, names: Sequence[str]) -> float:
    """Mean bytes (``MEMORY USAGE``) of the history keys (record hash + runs ZSET) of ``names``."""
    return _key_bytes(store.client, [k for n in names for k in history_keys(store, n)]) / max(1, len(names))


def envelope_growth(store: DelayStore, names: Sequence[str], before: int) -> float:
    """Mean bytes an entry's envelope grew by since it was stored (``before`` bytes): its state's
    last run and run count, written by the rearm."""
    items = [store.get(item_id(n)) for n in names]
    return sum(len(i.envelope) - before for i in items if i is not None) / max(1, len(names))


def give_history(store: DelayStore, names: Sequence[str], runs: int) -> list[float]:
    """``runs`` hourly runs of each entry of ``names``, as a forwarder and a worker record them
    (published, started, finished with success: the largest record), through ``periodic.history``;
    returns the ms each ``record_published`` took (what a firing adds per run, after its rearm)."""
    base = store.clock() - runs * HOUR_MS
    published = []
    for name in names:
        for r in range(runs):
            due = base + r * HOUR_MS
            mark, run_id = RunMark(name, due), run_task_id(name, Period(str(due), due))
            called = time.perf_counter()
            record_published(store, mark, run_id)
            published.append((time.perf_counter() - called) * 1000)
            record_started(store, mark, run_id)
            record_finished(store, mark, run_id, "success")
    return published


def redbeat_memory(entries: int) -> dict[str, Any]:
    """The peer, measured here: ``entries`` entries of the same task, args and hourly schedule
    saved by celery-redbeat's own ``RedBeatSchedulerEntry.save()`` (a hash ``definition`` +
    ``meta`` per entry, a member of one schedule ZSET) into a fresh Valkey, with a last run
    recorded as after a first firing; its INFO used_memory delta per entry. Skipped (with the
    fix) when celery-redbeat is not installed."""
    try:
        from redbeat import RedBeatSchedulerEntry
    except ImportError:
        return {"skipped": "celery-redbeat is not installed: pip install celery-redbeat"}
    from celery.schedules import schedule

    with EmbeddedServer() as server:
        app = Celery("dqb-redbeat")
        app.conf.update(broker_url=server.url, redbeat_redis_url=server.url, enable_utc=True)
        client = redis.Redis.from_url(server.url)
        before = int(client.info("memory")["used_memory"])
        now = datetime.now(timezone.utc)
        every = schedule(HOUR_MS / 1000, app=app)
        start = time.perf_counter()
        for i in range(entries):
            entry = RedBeatSchedulerEntry(f"e{i:07d}", TASK, every, ("report",), {"edit": 0}, app=app)
            entry.last_run_at = now - timedelta(milliseconds=i * HOUR_MS // entries)
            entry.save()
        seconds = time.perf_counter() - start
        after = int(client.info("memory")["used_memory"])
        sample = int(client.memory_usage("redbeat:e0000000", samples=0) or 0)
        definition = len(client.hget("redbeat:e0000000", "definition") or b"")
    return {
        "entries": entries,
        "per_entry_used_memory": round((after - before) / entries, 1),
        "entry_hash_bytes": sample,
        "definition_bytes": definition,
        "save_rate": round(entries / seconds),
        "version": _version("celery-redbeat"),
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# -- the broker side ------------------------------------------------------------------------------------


class Drain(threading.Thread):
    """Pops every message off the Celery queue as it lands and stamps it (epoch ms, this
    machine's clock, the one the forwarders and the server use): run id -> landed times, and
    entry name -> landed times of its manual runs (``run_now``: their ids name the request time).
    Kwargs are kept for the runs in ``watch`` (the message edits)."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.client, self.queue = redis.Redis.from_url(url), queue
        self.landed: dict[str, list[float]] = {}
        self.manual: dict[str, list[float]] = {}
        self.kwargs: dict[str, Any] = {}
        self.watch: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            first = self.client.blpop([self.queue], timeout=0.2)
            if first is None:
                continue
            first_ms = time.time_ns() / 1e6
            rest = self.client.lpop(self.queue, 1000) or []
            # each stamped no earlier than it was in the queue: the rest at the LPOP's reply (a
            # stamp from before it would make a run that landed meanwhile look early)
            rest_ms = time.time_ns() / 1e6
            for raw, now in [(first[1], first_ms), *((r, rest_ms) for r in rest)]:
                message = json.loads(raw)
                task_id = message["headers"]["id"]
                self.landed.setdefault(task_id, []).append(now)
                mark = message["headers"].get(RUN_HEADER) or {}
                if mark.get("kind") == "manual":
                    self.manual.setdefault(mark["name"], []).append(now)
                if task_id in self.watch:
                    _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
                    self.kwargs[task_id] = kwargs

    def first(self, task_id: str) -> float | None:
        times = self.landed.get(task_id)
        return times[0] if times else None


# -- processes ------------------------------------------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    """User+system CPU seconds of process ``pid`` (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_cpu_wait(pid: int) -> float:
    """Seconds process ``pid``'s threads spent runnable but waiting for a CPU (Linux schedstat):
    on a shared machine, the part of a run's lateness that is the machine's, not the code's."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


@dataclass
class Forwarders:
    """The ``delayq forward`` processes, optionally one under cProfile."""

    processes: Processes
    store_url: str
    broker_url: str
    prefix: str
    shards: int
    logs: Path
    profile_to: Path | None = None
    procs: list[Any] = field(default_factory=list)

    def start(self, count: int) -> None:
        for i in range(count):
            command = [sys.executable]
            if i == 0 and self.profile_to is not None:
                command += ["-m", "cProfile", "-o", str(self.profile_to)]
            command += ["-m", "delayq_backends.cli", "forward", "--url", self.store_url, "--prefix", self.prefix]
            command += ["--shards", str(self.shards), "--celery-broker", self.broker_url, "--log-every", "30"]
            self.procs.append(self.processes.start(command, log=self.logs / f"forwarder-{i}.log"))

    def cpu(self) -> list[float]:
        return [_proc_cpu(p.pid) for p in self.procs]

    def cpu_wait(self) -> list[float]:
        return [_proc_cpu_wait(p.pid) for p in self.procs]


# -- the measurement ------------------------------------------------------------------------------------------


@dataclass
class ActionRecord:
    """One runtime action on an entry and what it did. ``effect_ms``: for an edit, landed −
    max(returned, the run's period); for run_now, landed − the call's start; None for a pause
    (it holds when the call returns: one compare-and-set; the bench checks no run lands)."""

    kind: str  # "schedule" | "message" | "pause" | "run_now"
    call_ms: float  # the ops call itself
    landed_after_return_ms: float | None = None  # the call returned -> its run landed
    effect_ms: float | None = None


#: the actions a round takes, in order
ACTIONS = ("schedule", "message", "pause", "run_now")


@dataclass
class Actions:
    """What the actions need: the store, the app building specs, the layout, the drain; the
    entries used (each once) and those paused (left out of the lateness: they must not run)."""

    store: DelayStore
    app: Celery
    layout: Layout
    drain: Drain
    used: set[int] = field(default_factory=set)
    paused: set[int] = field(default_factory=set)

    def free_index(self, from_ms: float) -> int:
        """An entry not acted on before whose period is at or after ``from_ms``."""
        i = self.layout.index_due_after(int(from_ms))
        while i in self.used:
            i += 1
        self.used.add(i)
        return i

    def far_ahead_ms(self) -> float:
        """A time whose entries do not fall due while an action runs: 10 min ahead, or a third of
        a shorter spread (10 min past a 3 min spread is past every entry's first period)."""
        return time.time() * 1000 + min(600_000, self.layout.spread_ms // 3)


def _actions(acts: Actions, count: int, deadline: float) -> Iterator[ActionRecord]:
    """``count`` actions of each kind, in rounds, each waited for before the next."""
    steps: dict[str, Callable[[Actions, int], ActionRecord]] = {
        "schedule": _schedule_edit,
        "message": _message_edit,
        "pause": _pause,
        "run_now": _run_now,
    }
    for k in range(count):
        for kind in ACTIONS:
            if time.monotonic() > deadline:
                return
            yield steps[kind](acts, k)


def _wait_landed(landed: Callable[[], float | None], what: str) -> float:
    wait_for(lambda: landed() is not None, 30, what, interval=0.001)
    at = landed()
    assert at is not None
    return at


def _timed(call: Callable[[], Any]) -> tuple[Any, float, float, float]:
    """``call()``'s result, the epoch ms when it was called and returned, and its duration."""
    called_ms, called = time.time_ns() / 1e6, time.perf_counter()
    result = call()
    return result, called_ms, time.time_ns() / 1e6, (time.perf_counter() - called) * 1000


def _schedule_edit(acts: Actions, k: int) -> ActionRecord:
    """An entry due far ahead gets a 1 s schedule (``ops.upsert``): its next run is now + 1 s.
    Then it goes back to hourly (not timed)."""
    i = acts.free_index(acts.far_ahead_ms())
    name = acts.layout.name(i)
    spec = spec_of(acts.app, name, every_s=1.0)  # built first: the call alone is timed
    outcome, _, returned_ms, call_ms = _timed(lambda: ops.upsert(acts.store, spec))
    assert outcome == "changed", outcome
    item = acts.store.get(item_id(name))
    assert item is not None
    period = state_of(Envelope.decode(item.envelope)).slot.at_ms
    task_id = run_task_id(name, Period(str(period), period))
    landed = _wait_landed(lambda: acts.drain.first(task_id), f"the run of schedule edit {k} ({name}, due {period})")
    ops.upsert(acts.store, spec_of(acts.app, name))  # back to hourly
    return ActionRecord("schedule", call_ms, landed - returned_ms, landed - max(returned_ms, period))


def _message_edit(acts: Actions, k: int) -> ActionRecord:
    """An entry due in ~1 s gets new kwargs (``ops.upsert``); its run must carry them."""
    i = acts.free_index(time.time() * 1000 + 1000)
    name, period = acts.layout.name(i), acts.layout.due_ms(i)
    task_id = run_task_id(name, Period(str(period), period))
    acts.drain.watch.add(task_id)
    spec = spec_of(acts.app, name, edit_no=k + 1)  # built first: the call alone is timed
    outcome, _, returned_ms, call_ms = _timed(lambda: ops.upsert(acts.store, spec))
    assert outcome == "changed", outcome
    landed = _wait_landed(lambda: acts.drain.first(task_id), f"the run of message edit {k} ({name}, due {period})")
    wait_for(lambda: task_id in acts.drain.kwargs, 5, f"the kwargs of {task_id}")
    if acts.drain.kwargs[task_id] != {"edit": k + 1}:
        raise AssertionError(f"message edit {k} of {name}: the run carried {acts.drain.kwargs[task_id]}, not the edit")
    return ActionRecord("message", call_ms, landed - returned_ms, landed - max(returned_ms, period))


def _pause(acts: Actions, k: int) -> ActionRecord:
    """An entry due in ~1 s is paused (``ops.pause``); its run must not land: checked until 1 s
    (the edit goal) after its period. It stays paused."""
    i = acts.free_index(time.time() * 1000 + 1000)
    name, period = acts.layout.name(i), acts.layout.due_ms(i)
    task_id = run_task_id(name, Period(str(period), period))
    status, _, returned_ms, call_ms = _timed(lambda: ops.pause(acts.store, name))
    if status.state != "paused" or status.next_run_ms is not None:
        raise AssertionError(f"pause {k} of {name}: {status}")
    acts.paused.add(i)
    time.sleep(max(0.0, (max(period, returned_ms) + EDIT_GOAL_MS) / 1000 - time.time()))  # the period passes
    landed = acts.drain.first(task_id)
    if landed is not None:
        raise AssertionError(f"pause {k} of {name}: its run of {period} landed at {landed}, after the pause returned")
    return ActionRecord("pause", call_ms)


def _run_now(acts: Actions, k: int) -> ActionRecord:
    """An entry due far ahead is run now (``ops.run_now``): its manual run must land."""
    i = acts.free_index(acts.far_ahead_ms())
    name = acts.layout.name(i)
    status, called_ms, returned_ms, call_ms = _timed(lambda: ops.run_now(acts.store, name))
    assert status.state in ("scheduled", "firing"), status

    def landed() -> float | None:
        times = acts.drain.manual.get(name)
        return times[0] if times else None

    at = _wait_landed(landed, f"the manual run of run_now {k} ({name})")
    return ActionRecord("run_now", call_ms, at - returned_ms, at - called_ms)


@dataclass(frozen=True)
class Settings:
    """One run's settings (the command line's)."""

    entries: int = 1_000_000
    window: float = 240.0
    actions: int = 25
    forwarders: int = 2
    shards: int = 16
    warmup: float = 10.0
    profile: bool = False
    peer: int = 100_000
    spread: float = HOUR_MS / 1000
    upsert_sample: int = 2000
    history_runs: int = HISTORY_SIZE
    history_sample: int = 200


def measure(cfg: Settings) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    prefix, queue = f"dqs{tag}", f"dqs-{tag}"
    tmp = Path(tempfile.mkdtemp(prefix="dqb-periodic-scale-"))
    with EmbeddedServer() as store_server, EmbeddedServer() as broker_server, Processes(grace=30) as processes:
        client = redis.Redis.from_url(store_server.url, socket_timeout=600)
        store = DelayStore(client, Config(prefix=prefix, shards=cfg.shards))
        app = _app(broker_server.url, queue)
        log(f"ops.upsert of {cfg.upsert_sample:,} entries (prefix {prefix}u)")
        upsert = upsert_cost(client, app, f"{prefix}u", cfg.shards, cfg.upsert_sample)
        template = spec_of(app, "template")
        check_bulk_path(store, app, template)  # also puts the store's meta and scripts in before the baseline
        before = memory(store)
        load_margin_s = 3 + cfg.entries / 12_000  # the load runs at ~15k entries/s here (2 shared cores)
        layout = Layout(cfg.entries, int(time.time() * 1000 + load_margin_s * 1000), int(cfg.spread * 1000))
        log(f"loading {cfg.entries:,} entries (first period in {load_margin_s:.0f} s), prefix {prefix}")
        load_s = load(store, template, layout)
        after = memory(store)
        envelope_bytes = len(stored_envelope(template, Period("0", 0), 0)[0])
        log(f"loaded in {load_s:.1f} s; {(after['used_memory'] - before['used_memory']) / cfg.entries:.0f} B/entry")
        late_start = max(0.0, time.time() - layout.start_ms / 1000)
        drain = Drain(broker_server.url, queue)
        drain.start()
        fleet = Forwarders(
            processes,
            store_server.url,
            broker_server.url,
            prefix,
            cfg.shards,
            tmp,
            tmp / "forwarder-0.prof" if cfg.profile else None,
        )
        fleet.start(cfg.forwarders)
        time.sleep(max(0.0, layout.start_ms / 1000 - time.time()))
        time.sleep(cfg.warmup)  # forwarders up; the runs of periods that passed during the load are out
        window_low = time.time() * 1000
        cpu0, server_cpu0, load0 = fleet.cpu(), _proc_cpu(store_server.process.pid), loadavg()  # type: ignore[union-attr]
        wait0 = fleet.cpu_wait()
        acts = Actions(store, app, layout, drain)
        records = list(_actions(acts, cfg.actions, time.monotonic() + cfg.window))
        time.sleep(max(0.0, window_low / 1000 + cfg.window - time.time()))
        window_high = time.time() * 1000
        cpu1, server_cpu1, load1 = fleet.cpu(), _proc_cpu(store_server.process.pid), loadavg()  # type: ignore[union-attr]
        wait1 = fleet.cpu_wait()
        time.sleep(3)  # the window's last runs land
        drain.stopping.set()
        drain.join()
        fired = [i for i in layout.between(int(window_low), int(window_high)) if i not in acts.paused]
        lateness, missing, ran_once = [], 0, []
        for i in fired:
            at = layout.due_ms(i)
            landed = drain.first(run_task_id(layout.name(i), Period(str(at), at)))
            if landed is None:
                missing += 1
            else:
                lateness.append(landed - at)
                if i not in acts.used:
                    ran_once.append(layout.name(i))
        duplicates = sum(len(v) - 1 for v in drain.landed.values())
        processes.stop()  # a profiled forwarder writes its profile as it exits
        history = _history_memory(store, layout, ran_once, envelope_bytes, cfg)
    wall = (window_high - window_low) / 1000
    report: dict[str, Any] = {
        "entries": cfg.entries,
        "spread_s": cfg.spread,
        "shards": cfg.shards,
        "forwarders": cfg.forwarders,
        "upsert": {
            "count": upsert.count,
            "call_ms": upsert.call_ms,
            "rate": upsert.rate,
            "extrapolated_s": round(cfg.entries / upsert.rate),
        },
        "load_s": round(load_s, 1),
        "load_rate": round(cfg.entries / load_s),
        "late_start_s": round(late_start, 1),
        "memory": {
            "used_memory_before": before["used_memory"],
            "used_memory_after": after["used_memory"],
            "per_entry_used_memory": round((after["used_memory"] - before["used_memory"]) / cfg.entries, 1),
            "per_entry_keys": round((after["keys"] - before["keys"]) / cfg.entries, 1),
            "envelope_bytes": envelope_bytes,
            **history,
        },
        "window_s": round(wall, 1),
        "fires_per_s": round(len(layout.between(int(window_low), int(window_high))) / wall, 1),
        "lateness_ms": distribution(lateness),
        "missing": missing,
        "duplicates": duplicates,
        "paused": len(acts.paused),
        "actions": _action_report(records),
        "cpu_share": {
            "forwarders": [round((b - a) / wall, 2) for a, b in zip(cpu0, cpu1, strict=True)],
            "store_server": round((server_cpu1 - server_cpu0) / wall, 2),
            "forwarders_waiting_for_cpu_ms_per_s": [
                round((b - a) / wall * 1000, 1) for a, b in zip(wait0, wait1, strict=True)
            ],
        },
        "load_avg": {"start": load0, "end": load1},
        "code": code_digest(),
    }
    if cfg.peer:
        log(f"peer: {cfg.peer:,} celery-redbeat entries")
        report["peer_redbeat"] = redbeat_memory(cfg.peer)
    if cfg.profile:
        report["profile_top_own_time"] = _profile_top(tmp / "forwarder-0.prof")
    return report


def _history_memory(
    store: DelayStore, layout: Layout, ran_once: Sequence[str], envelope_bytes: int, cfg: Settings
) -> dict[str, Any]:
    """Memory after runs, per entry: the history keys and envelope growth of (up to 1,000)
    entries the forwarders fired once in the window (their history recorded by the firing: a
    ``published`` record each); and the history keys of ``history_sample`` entries that had no
    run in the window, given ``history_runs`` full runs each (:func:`give_history`).

    Raises:
        AssertionError: a fired entry's history does not hold its run.
    """
    once = list(ran_once[:1000])
    recorded = read_histories(store, once, limit=1)
    unrecorded = [h.name for h in recorded if not h.runs or h.runs[0].published_ms is None]
    if unrecorded:
        raise AssertionError(
            f"{len(unrecorded)} fired entries have no published run in their history: {unrecorded[:5]}"
        )
    sample = [layout.name(i) for i in range(layout.entries - cfg.history_sample, layout.entries)]  # last to fire
    log(f"history: {cfg.history_runs} runs of {len(sample)} entries")
    published_ms = give_history(store, sample, cfg.history_runs)
    full = read_histories(store, sample[:1], limit=cfg.history_runs)[0]
    if len(full.runs) != min(cfg.history_runs, HISTORY_SIZE):
        raise AssertionError(f"{sample[0]}: {len(full.runs)} runs kept of {cfg.history_runs}")
    return {
        "fired_once_sample": len(once),
        "history_bytes_after_1_run": round(history_bytes(store, once), 1),
        "envelope_growth_after_1_run": round(envelope_growth(store, once, envelope_bytes), 1),
        "history_runs": cfg.history_runs,
        "history_bytes_after_n_runs": round(history_bytes(store, sample), 1),
        "record_published_ms": median_spread(published_ms),
    }


def _action_report(records: Sequence[ActionRecord]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ACTIONS:
        mine = [r for r in records if r.kind == kind]
        entry: dict[str, Any] = {"n": len(mine), "call_ms": median_spread([r.call_ms for r in mine] or [float("nan")])}
        if kind != "pause":
            for figure in ("landed_after_return_ms", "effect_ms"):
                entry[figure] = distribution([v for r in mine if (v := getattr(r, figure)) is not None])
        out[kind] = entry
    return out


def _profile_top(path: Path, limit: int = 15) -> list[str]:
    import pstats

    if not path.exists():
        return [f"no profile at {path}: the forwarder did not exit cleanly"]
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    return [
        f"{tt / total:5.1%} own, {ct / total:5.1%} cum, {nc:>8} calls  {Path(fn).name}:{line}({name})"
        for (fn, line, name), (_, nc, tt, ct, _) in rows[:limit]
    ]


# -- reporting ----------------------------------------------------------------------------------------------


def _goal(met: bool) -> str:
    return "met" if met else "**missed**"


def markdown(report: dict[str, Any], when: str, command: str) -> str:
    mem, late, acts, up = report["memory"], report["lateness_ms"], report["actions"], report["upsert"]
    lines = [
        f"## Periodic entries at scale, {when} (`bench/periodic_scale.py`, code {report['code']})\n",
        f"`{command}`: {report['entries']:,} Celery periodic entries added at runtime (hourly, first periods "
        f"staggered over {report['spread_s']:g} s) in {report['shards']} shards of a fresh Valkey, "
        f"{report['forwarders']} `delayq forward --celery-broker redis://…` processes (run history on: one "
        f"`periodic_run.lua` call per run), Redis broker on a second Valkey, the queue drained and stamped as "
        f"runs land. Load average {report['load_avg']['start']} at the window's start, {report['load_avg']['end']} "
        f"at its end (2 shared cores).\n",
        "| figure | value | goal |\n|---|---|---|",
        f"| `ops.upsert` of a new entry, {up['count']:,} one at a time | median {up['call_ms']['median']} ms "
        f"({up['call_ms']['min']}–{up['call_ms']['max']}), {up['rate']:,}/s: {report['entries']:,} in "
        f"~{up['extrapolated_s']:,} s | — |",
        f"| load (setup): the same envelopes as `ops.upsert` (checked for one), `schedule_checked` + registry | "
        f"{report['load_s']} s, {report['load_rate']:,} entries/s | — |",
        f"| memory per entry, no history: INFO used_memory delta | {mem['per_entry_used_memory']:.0f} B "
        f"(envelope {mem['envelope_bytes']} B) | stated |",
        "| memory per entry, no history: MEMORY USAGE of due ZSETs + items HASHes + registry | "
        f"{mem['per_entry_keys']:.0f} B | — |",
        f"| memory per entry after 1 run (fired in the window, {mem['fired_once_sample']:,} sampled): history "
        f"keys + envelope growth | +{mem['history_bytes_after_1_run']:.0f} B + {mem['envelope_growth_after_1_run']:.0f}"
        f" B = {_with_history(mem, 'history_bytes_after_1_run'):.0f} B | stated |",
        f"| memory per entry after {mem['history_runs']} runs (published, started, finished; the history's bound is "
        f"{HISTORY_SIZE}) | +{mem['history_bytes_after_n_runs']:.0f} B history = "
        f"{_with_history(mem, 'history_bytes_after_n_runs'):.0f} B | stated |",
        f"| run history: one `record_published` call (what a firing adds per run, after its rearm), "
        f"{mem['record_published_ms']['n']:,} calls after the window | median {mem['record_published_ms']['median']} "
        f"ms ({mem['record_published_ms']['min']}–{mem['record_published_ms']['max']}) | — |",
        _peer_row(report.get("peer_redbeat")),
        f"| fire lateness (landed − period), history on, {report['window_s']:g} s window, "
        f"{report['fires_per_s']:g} fires/s | {fmt_dist(late)}; missing {report['missing']}, duplicates "
        f"{report['duplicates']} | p99 ≤ {LATENESS_P99_GOAL_MS} ms: {_goal(late['p99'] <= LATENESS_P99_GOAL_MS)} |",
    ]
    for kind, label in (("schedule", "new schedule, next run now + 1 s"), ("message", "new kwargs, run due in ~1 s")):
        a = acts[kind]
        lines.append(
            f"| `ops.upsert` ({label}): returned → run landed | {fmt_dist(a['landed_after_return_ms'])} | — |\n"
            f"| `ops.upsert` ({label}): effect = landed − max(returned, period) | {fmt_dist(a['effect_ms'])} | "
            f"≤ {EDIT_GOAL_MS} ms: {_goal(a['n'] > 0 and a['effect_ms']['max'] <= EDIT_GOAL_MS)} |\n"
            f"| `ops.upsert` ({label}): the call | {_call(a)} | — |"
        )
    pause, now = acts["pause"], acts["run_now"]
    lines.append(
        f"| `ops.pause` of an entry due in ~1 s: the call (effective when it returns) | {_call(pause)}; "
        f"{pause['n']} paused, none ran (checked to 1 s past the period; the bench fails if one does) | "
        "no paused entry fires: met |\n"
        f"| `ops.run_now`: call → manual run landed | {fmt_dist(now['effect_ms'])} | "
        f"≤ {EDIT_GOAL_MS} ms: {_goal(now['n'] > 0 and now['effect_ms']['max'] <= EDIT_GOAL_MS)} |\n"
        f"| `ops.run_now`: the call | {_call(now)} | — |"
    )
    cpu = report["cpu_share"]
    lines.append(
        f"\nCPU during the window (cores): forwarders {cpu['forwarders']}, store server {cpu['store_server']}; "
        f"the forwarders waited for a CPU (runnable, not running: schedstat) "
        f"{cpu['forwarders_waiting_for_cpu_ms_per_s']} ms per second. "
        f"Periods that passed while loading: {report['late_start_s']} s of them (fired at start, outside the "
        f"window). Paused entries ({report['paused']}) are left out of the lateness.\n"
    )
    if "profile_top_own_time" in report:
        lines.append(
            "Forwarder 0 under cProfile (own time):\n\n```\n" + "\n".join(report["profile_top_own_time"]) + "\n```\n"
        )
    return "\n".join(lines) + "\n"


def _with_history(mem: dict[str, Any], history: str) -> float:
    """Bytes per entry with its history: no-history bytes + envelope growth + history keys."""
    return float(mem["per_entry_keys"] + mem["envelope_growth_after_1_run"] + mem[history])


def _call(action: dict[str, Any]) -> str:
    call = action["call_ms"]
    return f"median {call['median']} ms ({call['min']}–{call['max']}, n={action['n']})"


def _peer_row(peer: dict[str, Any] | None) -> str:
    if not peer:
        return "| peer: celery-redbeat memory per entry | not measured (--peer-entries 0) | — |"
    if "skipped" in peer:
        return f"| peer: celery-redbeat memory per entry | skipped: {peer['skipped']} | — |"
    return (
        f"| peer, same run: celery-redbeat {peer['version']}, {peer['entries']:,} entries by its `save()` | "
        f"{peer['per_entry_used_memory']:.0f} B used_memory per entry (entry hash {peer['entry_hash_bytes']} B, "
        f"definition {peer['definition_bytes']} B; saved at {peer['save_rate']:,}/s) | — |"
    )


def main(argv: list[str] | None = None) -> int:
    d = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=d.entries)
    parser.add_argument("--window", type=float, default=d.window, help="seconds of firing measured")
    parser.add_argument(
        "--actions", type=int, default=d.actions, help="actions of each kind (edit schedule/message, pause, run now)"
    )
    parser.add_argument("--forwarders", type=int, default=d.forwarders)
    parser.add_argument("--shards", type=int, default=d.shards)
    parser.add_argument("--warmup", type=float, default=d.warmup, help="seconds of firing before the window")
    parser.add_argument(
        "--spread", type=float, default=d.spread, help="seconds the first periods are spread over (default: the hour)"
    )
    parser.add_argument("--profile", action="store_true", help="run forwarder 0 under cProfile")
    parser.add_argument(
        "--peer-entries", type=int, default=d.peer, help="celery-redbeat entries saved for its memory (0: none)"
    )
    parser.add_argument("--upsert-sample", type=int, default=d.upsert_sample, help="ops.upsert calls timed")
    parser.add_argument("--history-runs", type=int, default=d.history_runs, help="runs given to the history sample")
    parser.add_argument(
        "--history-sample", type=int, default=d.history_sample, help="entries given --history-runs runs each"
    )
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    cfg = Settings(
        args.entries,
        args.window,
        args.actions,
        args.forwarders,
        args.shards,
        args.warmup,
        args.profile,
        min(args.peer_entries, args.entries),
        args.spread,
        args.upsert_sample,
        args.history_runs,
        min(args.history_sample, args.entries),
    )
    report = measure(cfg)
    print(json.dumps(report, indent=2))
    if not args.no_results:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        command = "python bench/periodic_scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_results(RESULTS_PATH, markdown(report, when, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
