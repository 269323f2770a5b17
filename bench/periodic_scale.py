#!/usr/bin/env python
"""Celery periodic entries at scale: 1,000,000 entries, edits while firing, fire lateness, memory.

Run ``python bench/periodic_scale.py`` (1M entries, a 240 s window: about 8 min) or
``--entries 100000 --window 60`` (about 2 min). It starts two Valkey servers of its own
(``EmbeddedServer``: the delay store, and the Celery broker, so the store's ``INFO memory`` holds
the entries alone and the system Redis is untouched), then:

1. stores N entries (``celery-periodic`` items, every 3600 s, the first periods staggered evenly
   over the hour, so N/3600 fall due each second: 278/s for 1M), built as the module builds
   them (one entry from a ``beat_schedule`` dict by ``periodic._entry``, then per entry its
   state and envelope) and written through the store's bulk path (``schedule_checked``) plus
   the registry hash, timing the load (setup, not a goal);
2. measures memory: ``INFO memory`` used_memory before and after, ``MEMORY USAGE`` of the
   shard keys and the registry, per entry;
3. starts 2 ``delayq forward --celery-broker redis://…`` processes and drains the broker's
   Celery queue in a thread, stamping each run as it lands;
4. during the window, edits entries one at a time (the same path ``sync`` uses,
   ``store.replace_if`` by way of ``periodic._upsert``: see :func:`edit`): a new schedule that
   moves the next run to now + 1 s, and a new message (kwargs) for an entry due in ~1 s; each
   edit's latency is the time from the edit call's return to its run landing on the broker
   (and that minus the run's period time: the effect, goal ≤ 1 s);
5. reports the lateness (landed − period time) of every run whose period lies in the window
   (goal: p99 ≤ 50 ms), the load average and the processes' CPU, and cProfiles a forwarder
   (``--profile``) when asked.

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
from collections.abc import Iterator
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
from delayq_backends.celery import periodic
from delayq_backends.celery.schedules import Slot, run_task_id
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.keys import periodic_key
from delayq_backends.models import ScheduleItem

HOUR_MS = 3_600_000
TASK = "dqb.tick"
#: goals of issue 25
EDIT_GOAL_MS = 1000
LATENESS_P99_GOAL_MS = 50


# -- the edit under test --------------------------------------------------------------------------


def edit(store: DelayStore, entry: periodic.PeriodicEntry) -> str:
    """Change one stored entry to ``entry``: today the sync's own compare-and-set path
    (``store.replace_if``). When ``periodic.ops.upsert`` lands (issue 25, the same path), this
    is its one call: ``ops.upsert(store, spec)``."""
    return periodic._upsert(store, entry, time.monotonic() + store.config.lease_seconds + 1)


# -- building and loading entries -------------------------------------------------------------------


def _app(broker_url: str, queue: str) -> Celery:
    """The app whose sender builds the entries' messages (no connection is made)."""
    app = Celery("dqb")
    app.conf.update(broker_url=broker_url, task_default_queue=queue, enable_utc=True)
    return app


def entry_of(app: Celery, name: str, *, every_s: float = HOUR_MS / 1000, edit_no: int = 0) -> periodic.PeriodicEntry:
    """Entry ``name`` as ``sync`` builds it from ``beat_schedule[name]``."""
    conf = {"task": TASK, "schedule": every_s, "args": ("report",), "kwargs": {"edit": edit_no}}
    return periodic._entry(app, name, conf)


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


def load(store: DelayStore, app: Celery, layout: Layout, chunk: int = 20_000) -> float:
    """Store every entry of ``layout`` (items through the bulk path, registry lines in
    pipelines); returns the seconds it took."""
    template = entry_of(app, layout.name(0))
    registry = periodic_key(store.config.prefix)
    start = time.perf_counter()
    for low in range(0, layout.entries, chunk):
        items, names = [], {}
        for i in range(low, min(low + chunk, layout.entries)):
            entry = replace(template, name=layout.name(i))
            at = layout.due_ms(i)
            envelope = store.check_payload(entry.item_id, entry.envelope(entry.state(Slot(str(at), at))))
            items.append(ScheduleItem(entry.item_id, at, envelope, entry.rank))
            names[entry.name] = entry.item_id
        store.schedule_checked(items, mode="replace")
        store.client.hset(registry, mapping=names)
        if low // chunk % 10 == 0:
            log(f"  loaded {low + len(items):,} entries")
    return time.perf_counter() - start


def memory(store: DelayStore) -> dict[str, int]:
    """Bytes of the store's keys (exact ``MEMORY USAGE … SAMPLES 0``) and the server's used_memory."""
    client = store.client
    usage = {"used_memory": int(client.info("memory")["used_memory"])}
    keys = [periodic_key(store.config.prefix), *(k for shard in store._keys for k in (shard.due, shard.items))]
    usage["keys"] = sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)
    return usage


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
    machine's clock, the one the forwarders and the server use): run id -> landed times.
    Kwargs are kept for the runs in ``watch`` (the message edits)."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.client, self.queue = redis.Redis.from_url(url), queue
        self.landed: dict[str, list[float]] = {}
        self.kwargs: dict[str, Any] = {}
        self.watch: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            first = self.client.blpop([self.queue], timeout=0.2)
            if first is None:
                continue
            now = time.time_ns() / 1e6
            rest = self.client.lpop(self.queue, 1000) or []
            for raw in [first[1], *rest]:
                message = json.loads(raw)
                task_id = message["headers"]["id"]
                self.landed.setdefault(task_id, []).append(now)
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
class EditRecord:
    kind: str  # "schedule" | "message"
    call_ms: float  # the edit call itself
    landed_after_return_ms: float  # edit returned -> its run landed
    effect_ms: float  # landed - max(edit returned, the run's period time)


def _edits(
    store: DelayStore, app: Celery, layout: Layout, drain: Drain, count: int, deadline: float
) -> Iterator[EditRecord]:
    """``count`` edits of each kind, alternating, each waited for before the next."""
    used: set[int] = set()
    for k in range(count):
        for kind in ("schedule", "message"):
            if time.monotonic() > deadline:
                return
            yield (_schedule_edit if kind == "schedule" else _message_edit)(store, app, layout, drain, k, used)


def _free_index(layout: Layout, used: set[int], from_ms: float) -> int:
    """An entry not edited before whose period is at or after ``from_ms``."""
    i = layout.index_due_after(int(from_ms))
    while i in used:
        i += 1
    used.add(i)
    return i


def _wait_landed(drain: Drain, task_id: str, what: str) -> float:
    wait_for(lambda: drain.first(task_id) is not None, 30, what, interval=0.001)
    landed = drain.first(task_id)
    assert landed is not None
    return landed


def _schedule_edit(store: DelayStore, app: Celery, layout: Layout, drain: Drain, k: int, used: set[int]) -> EditRecord:
    """An entry due in ~10 min gets a 1 s schedule: its next run is now + 1 s. Then it goes
    back to hourly (not timed)."""
    i = _free_index(layout, used, time.time() * 1000 + 600_000)
    name = layout.name(i)
    called = time.perf_counter()
    outcome = edit(store, entry_of(app, name, every_s=1.0))
    returned_ms, call_ms = time.time_ns() / 1e6, (time.perf_counter() - called) * 1000
    assert outcome == "changed", outcome
    item = store.get(periodic.item_id(name))
    assert item is not None
    period = item.ready_ms
    task_id = run_task_id(name, Slot(str(period), period))
    landed = _wait_landed(drain, task_id, f"the run of schedule edit {k} ({name}, due {period})")
    edit(store, entry_of(app, name))  # back to hourly
    return EditRecord("schedule", call_ms, landed - returned_ms, landed - max(returned_ms, period))


def _message_edit(store: DelayStore, app: Celery, layout: Layout, drain: Drain, k: int, used: set[int]) -> EditRecord:
    """An entry due in ~1 s gets new kwargs; its run must carry them."""
    i = _free_index(layout, used, time.time() * 1000 + 1000)
    name = layout.name(i)
    period = layout.due_ms(i)
    task_id = run_task_id(name, Slot(str(period), period))
    drain.watch.add(task_id)
    called = time.perf_counter()
    outcome = edit(store, entry_of(app, name, edit_no=k + 1))
    returned_ms, call_ms = time.time_ns() / 1e6, (time.perf_counter() - called) * 1000
    assert outcome == "changed", outcome
    landed = _wait_landed(drain, task_id, f"the run of message edit {k} ({name}, due {period})")
    wait_for(lambda: task_id in drain.kwargs, 5, f"the kwargs of {task_id}")
    if drain.kwargs[task_id] != {"edit": k + 1}:
        raise AssertionError(f"message edit {k} of {name}: the run carried {drain.kwargs[task_id]}, not the edit")
    return EditRecord("message", call_ms, landed - returned_ms, landed - max(returned_ms, period))


def measure(
    entries: int,
    window: float,
    edits: int,
    forwarders: int,
    shards: int,
    warmup: float,
    profile: bool,
    peer: int,
    spread: float = HOUR_MS / 1000,
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    prefix, queue = f"dqs{tag}", f"dqs-{tag}"
    tmp = Path(tempfile.mkdtemp(prefix="dqb-periodic-scale-"))
    with EmbeddedServer() as store_server, EmbeddedServer() as broker_server, Processes(grace=30) as processes:
        store = DelayStore(
            redis.Redis.from_url(store_server.url, socket_timeout=600), Config(prefix=prefix, shards=shards)
        )
        app = _app(broker_server.url, queue)
        warm = entry_of(app, "warm")  # the store's meta and scripts go in before the baseline
        store.schedule(warm.item_id, 3600.0, warm.envelope(warm.state(Slot("0", 0))))
        store.cancel(warm.item_id)
        before = memory(store)
        load_margin_s = 3 + entries / 12_000  # the load runs at ~15k entries/s here (2 shared cores)
        layout = Layout(entries, int(time.time() * 1000 + load_margin_s * 1000), int(spread * 1000))
        log(f"loading {entries:,} entries (first period in {load_margin_s:.0f} s), prefix {prefix}")
        load_s = load(store, app, layout)
        after = memory(store)
        template = entry_of(app, layout.name(0))
        envelope_bytes = len(store.check_payload(template.item_id, template.envelope(template.state(Slot("0", 0)))))
        log(f"loaded in {load_s:.1f} s; {(after['used_memory'] - before['used_memory']) / entries:.0f} B/entry")
        late_start = max(0.0, time.time() - layout.start_ms / 1000)
        drain = Drain(broker_server.url, queue)
        drain.start()
        fleet = Forwarders(
            processes,
            store_server.url,
            broker_server.url,
            prefix,
            shards,
            tmp,
            tmp / "forwarder-0.prof" if profile else None,
        )
        fleet.start(forwarders)
        time.sleep(max(0.0, layout.start_ms / 1000 - time.time()))
        time.sleep(warmup)  # forwarders up; the runs of periods that passed during the load are out
        window_low = time.time() * 1000
        cpu0, server_cpu0, load0 = fleet.cpu(), _proc_cpu(store_server.process.pid), loadavg()  # type: ignore[union-attr]
        wait0 = fleet.cpu_wait()
        records = list(_edits(store, app, layout, drain, edits, time.monotonic() + window))
        time.sleep(max(0.0, window_low / 1000 + window - time.time()))
        window_high = time.time() * 1000
        cpu1, server_cpu1, load1 = fleet.cpu(), _proc_cpu(store_server.process.pid), loadavg()  # type: ignore[union-attr]
        wait1 = fleet.cpu_wait()
        time.sleep(3)  # the window's last runs land
        drain.stopping.set()
        drain.join()
        lateness, missing = [], 0
        for i in layout.between(int(window_low), int(window_high)):
            at = layout.due_ms(i)
            landed = drain.first(run_task_id(layout.name(i), Slot(str(at), at)))
            if landed is None:
                missing += 1
            else:
                lateness.append(landed - at)
        duplicates = sum(len(v) - 1 for v in drain.landed.values())
        processes.stop()  # a profiled forwarder writes its profile as it exits
    wall = (window_high - window_low) / 1000
    report: dict[str, Any] = {
        "entries": entries,
        "spread_s": spread,
        "shards": shards,
        "forwarders": forwarders,
        "load_s": round(load_s, 1),
        "load_rate": round(entries / load_s),
        "late_start_s": round(late_start, 1),
        "memory": {
            "used_memory_before": before["used_memory"],
            "used_memory_after": after["used_memory"],
            "per_entry_used_memory": round((after["used_memory"] - before["used_memory"]) / entries, 1),
            "per_entry_keys": round((after["keys"] - before["keys"]) / entries, 1),
            "envelope_bytes": envelope_bytes,
        },
        "window_s": round(wall, 1),
        "fires_per_s": round(len(layout.between(int(window_low), int(window_high))) / wall, 1),
        "lateness_ms": distribution(lateness),
        "missing": missing,
        "duplicates": duplicates,
        "edits": {
            kind: {
                "landed_after_return_ms": distribution([r.landed_after_return_ms for r in records if r.kind == kind]),
                "effect_ms": distribution([r.effect_ms for r in records if r.kind == kind]),
                "call_ms": median_spread([r.call_ms for r in records if r.kind == kind] or [float("nan")]),
            }
            for kind in ("schedule", "message")
        },
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
    if peer:
        log(f"peer: {peer:,} celery-redbeat entries")
        report["peer_redbeat"] = redbeat_memory(peer)
    if profile:
        report["profile_top_own_time"] = _profile_top(tmp / "forwarder-0.prof")
    return report


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
    mem, late, edits = report["memory"], report["lateness_ms"], report["edits"]
    effect_p99 = max(edits[k]["effect_ms"]["p99"] for k in edits)
    lines = [
        f"## Periodic entries at scale, {when} (`bench/periodic_scale.py`, code {report['code']})\n",
        f"`{command}`: {report['entries']:,} Celery periodic entries (hourly, first periods staggered over the "
        f"hour) in {report['shards']} shards of a fresh Valkey, {report['forwarders']} `delayq forward "
        f"--celery-broker redis://…` processes, Redis broker on a second Valkey, the queue drained and stamped as "
        f"runs land. Load average {report['load_avg']['start']} at the window's start, {report['load_avg']['end']} "
        f"at its end (2 shared cores).\n",
        "| figure | value | goal |\n|---|---|---|",
        f"| load (setup): `schedule_checked` + registry | {report['load_s']} s, "
        f"{report['load_rate']:,} entries/s | — |",
        f"| memory per entry: INFO used_memory delta | {mem['per_entry_used_memory']:.0f} B "
        f"(envelope {mem['envelope_bytes']} B) | stated |",
        "| memory per entry: MEMORY USAGE of due ZSETs + items HASHes + registry | "
        f"{mem['per_entry_keys']:.0f} B | — |",
        _peer_row(report.get("peer_redbeat")),
        f"| fire lateness (landed − period), {report['window_s']:g} s window, {report['fires_per_s']:g} fires/s | "
        f"{fmt_dist(late)}; missing {report['missing']}, duplicates {report['duplicates']} | "
        f"p99 ≤ {LATENESS_P99_GOAL_MS} ms: {_goal(late['p99'] <= LATENESS_P99_GOAL_MS)} |",
    ]
    for kind, label in (("schedule", "new schedule, next run now + 1 s"), ("message", "new kwargs, run due in ~1 s")):
        e = edits[kind]
        lines.append(
            f"| edit ({label}): edit returned → run landed | {fmt_dist(e['landed_after_return_ms'])} | — |\n"
            f"| edit ({label}): effect = landed − max(returned, period) | {fmt_dist(e['effect_ms'])} | "
            f"≤ {EDIT_GOAL_MS} ms: {_goal(e['effect_ms']['max'] <= EDIT_GOAL_MS)} |\n"
            f"| edit ({label}): the edit call (`_upsert`: get + replace_if) | median {e['call_ms']['median']} ms "
            f"({e['call_ms']['min']}–{e['call_ms']['max']}) | — |"
        )
    cpu = report["cpu_share"]
    lines.append(
        f"\nCPU during the window (cores): forwarders {cpu['forwarders']}, store server {cpu['store_server']}; "
        f"the forwarders waited for a CPU (runnable, not running: schedstat) "
        f"{cpu['forwarders_waiting_for_cpu_ms_per_s']} ms per second. "
        f"Periods that passed while loading: {report['late_start_s']} s of them (fired at start, outside the window). "
        f"Edit effect p99 {effect_p99:g} ms.\n"
    )
    if "profile_top_own_time" in report:
        lines.append(
            "Forwarder 0 under cProfile (own time):\n\n```\n" + "\n".join(report["profile_top_own_time"]) + "\n```\n"
        )
    return "\n".join(lines) + "\n"


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--window", type=float, default=240.0, help="seconds of firing measured")
    parser.add_argument("--edits", type=int, default=25, help="edits of each kind (within the window)")
    parser.add_argument("--forwarders", type=int, default=2)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of firing before the window")
    parser.add_argument(
        "--spread",
        type=float,
        default=HOUR_MS / 1000,
        help="seconds the first periods are spread over (default: the hour)",
    )
    parser.add_argument("--profile", action="store_true", help="run forwarder 0 under cProfile")
    parser.add_argument(
        "--peer-entries", type=int, default=100_000, help="celery-redbeat entries saved for its memory (0: none)"
    )
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    report = measure(
        args.entries,
        args.window,
        args.edits,
        args.forwarders,
        args.shards,
        args.warmup,
        args.profile,
        min(args.peer_entries, args.entries),
        args.spread,
    )
    print(json.dumps(report, indent=2))
    if not args.no_results:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        command = "python bench/periodic_scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_results(RESULTS_PATH, markdown(report, when, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
