"""The per-target benches' shared parts: the naive movers they compare with, the ``delayq forward``
process they time, and the round-robin rounds with their markdown table.

A naive mover is what "move due items to their destination" costs with no reliability at all:
no lease and no ack, so two movers move the same items twice and a crash between its read and
its write loses or doubles a batch. It is the floor the forwarder is measured against.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
from rq.utils import utcformat

from delayq_backends import DelayStore, Envelope

from .processes import Processes
from .report import loadavg, log
from .server import PREFIX, BenchServer
from .waiting import wait_for

__all__ = [
    "PIPE_ITEMS", "Case", "Results", "Round", "cli_forward", "cpu_seconds", "in_process", "load_line", "naive_move",
    "naive_rq_move", "options", "process_drain", "rounds", "summary", "table",
]  # fmt: skip

#: items per read and per pipeline of the naive movers
PIPE_ITEMS = 500


def naive_move(client: redis.Redis, store: DelayStore, now_ms: int, batch: int = PIPE_ITEMS) -> int:
    """The reference mover into Redis lists (issue 16). Per shard: ZRANGEBYSCORE … LIMIT
    ``batch`` and HMGET, then RPUSH + ZREM + HDEL in one pipeline."""
    moved = 0
    for shard in range(store.shards):
        keys = store.keys(shard)
        while ids := client.zrangebyscore(keys.due, "-inf", now_ms, start=0, num=batch):
            by_list: dict[str, list[bytes]] = {}
            for data in client.hmget(keys.items, ids):
                env = Envelope.decode(data)
                by_list.setdefault(env.destination, []).append(env.body)
            with client.pipeline(transaction=False) as pipe:
                for key, bodies in by_list.items():
                    pipe.rpush(key, *bodies)
                pipe.zrem(keys.due, *ids)
                pipe.hdel(keys.items, *ids)
                pipe.execute()
            moved += len(ids)
    return moved


def naive_rq_move(client: redis.Redis, store: DelayStore, queue: str, now_ms: int, batch: int = PIPE_ITEMS) -> int:
    """The reference mover of RQ jobs waiting in a delay store, all of one queue. Per shard:
    ZRANGEBYSCORE … LIMIT ``batch``, then in one pipeline what RQ's enqueue writes for a plain
    job (status, origin, enqueued_at per job hash, one RPUSH, SADD rq:queues, the scheduled
    registry's entries removed) and the store entries deleted. No job hash is read: a
    cancelled or deleted job is queued anyway."""
    queue_key, moved = f"rq:queue:{queue}", 0
    for shard in range(store.shards):
        keys = store.keys(shard)
        while ids := client.zrangebyscore(keys.due, "-inf", now_ms, start=0, num=batch):
            enqueued_at = utcformat(datetime.now(timezone.utc))
            with client.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hset(b"rq:job:" + job_id, mapping={"status": "queued", "origin": queue,
                                                            "enqueued_at": enqueued_at})  # fmt: skip
                pipe.rpush(queue_key, *ids)
                pipe.sadd("rq:queues", queue_key)
                pipe.zrem(f"rq:scheduled:{queue}", *ids)
                pipe.zrem(keys.due, *ids)
                pipe.hdel(keys.items, *ids)
                pipe.execute()
            moved += len(ids)
    return moved


def options(doc: str | None, argv: Sequence[str] | None, steps: Sequence[str] = ()) -> argparse.Namespace:
    """The per-target benches' options: ``--quick`` (smaller sizes) and ``--json``; with
    ``steps`` (a bench of several), ``--only STEP`` runs one of them (``args.only``: None for all)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="smaller backlog, fewer rounds")
    parser.add_argument("--json", action="store_true", help="print the rates as JSON too")
    if steps:
        parser.add_argument("--only", choices=steps, help="run this step alone")
    return parser.parse_args(argv)


def cli_forward(server: BenchServer, *extra: str) -> list[str]:
    """The ``delayq forward`` command users run, on the bench's store (16 shards)."""
    return ["forward", "--url", server.url, "--prefix", PREFIX, "--shards", "16", "--log-level", "warning", *extra]


@dataclass(frozen=True)
class Round:
    """One timed move: items per second from the first item delivered to the last (a
    process's start-up excluded), and including the start-up; the mover's and the server's
    CPU per item over the timed part (None where it could not be read)."""

    rate: float
    with_startup: float
    mover_us: float | None = None
    server_us: float | None = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _per_item_us(before: float | None, after: float | None, items: int) -> float | None:
    return None if before is None or after is None else (after - before) / max(items, 1) * 1e6


@dataclass(frozen=True)
class Case:
    """One way of moving the same backlog: ``load`` fills the wiped server (untimed), ``run``
    moves it and returns its :class:`Round`."""

    name: str
    load: Callable[[], None]
    run: Callable[[], Round]


def in_process(server: BenchServer, move: Callable[[], int], total: int) -> Round:
    """Time ``move`` (it returns how many it moved) in this process."""
    server0, cpu0, start = server.cpu_seconds(), time.process_time(), time.perf_counter()
    moved = move()
    elapsed, cpu, server1 = time.perf_counter() - start, time.process_time() - cpu0, server.cpu_seconds()
    if moved != total:
        raise RuntimeError(f"moved {moved} of {total}")
    return Round(total / elapsed, total / elapsed, cpu / total * 1e6, _per_item_us(server0, server1, total))


def process_drain(
    server: BenchServer, args: Sequence[str], delivered: Callable[[], int], total: int, *, delayq: bool = True
) -> Round:
    """Start ``args`` (a ``delayq`` command, or any command) and time it until ``delivered()``
    reaches ``total``: from its first delivery, and from its start."""
    with Processes() as procs:
        started = time.monotonic()
        proc = procs.delayq(*args) if delayq else procs.start(args)
        first: list[tuple[float, int, float, float | None]] = []

        def done() -> bool:
            count = delivered()
            if count and not first:
                first.append((time.monotonic(), count, cpu_seconds(proc.pid), server.cpu_seconds()))
            if proc.poll() is not None:
                raise RuntimeError(f"{args[0]} exited with {proc.returncode}")
            return count >= total

        wait_for(done, 600, f"{total} delivered by {args[0]}", interval=0.01)
        end, cpu, server_cpu = time.monotonic(), cpu_seconds(proc.pid), server.cpu_seconds()
    at, count, cpu0, server0 = first[0]
    timed = total - count
    return Round(
        timed / max(end - at, 1e-6), total / (end - started), (cpu - cpu0) / max(timed, 1) * 1e6,
        _per_item_us(server0, server_cpu, timed),
    )  # fmt: skip


@dataclass
class Results:
    """Rates per case over the rounds, each round's cases run back to back."""

    rates: dict[str, list[Round]] = field(default_factory=dict)
    load: list[list[float]] = field(default_factory=list)


def rounds(server: BenchServer, cases: Sequence[Case], n: int) -> Results:
    """``n`` rounds of every case in turn (round-robin, so load that drifts is shared)."""
    out = Results({c.name: [] for c in cases})
    for r in range(n):
        for case in cases:
            server.wipe()
            case.load()
            out.rates[case.name].append(case.run())
            out.load.append(loadavg())
            log(f"round {r + 1}/{n} {case.name}: {out.rates[case.name][-1].rate:,.0f}/s")
    return out


def _cell(values: Sequence[float], fmt: str = ",.0f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def table(results: Results, ours: str, reference: str, goal: float | None, unit: str = "items/s") -> list[str]:
    """Markdown rows: each case's median (min–max) with and without start-up, then ``ours`` over
    ``reference`` per round (median, min–max) against ``goal``."""
    rows = [
        f"| case | {unit}, median (min–max) | with process start-up | ratio to {reference} | "
        "mover / server CPU per item (µs) |",
        "|---|---:|---:|---:|---:|",
    ]
    ref = [r.rate for r in results.rates[reference]]
    for name, runs in results.rates.items():
        ratios = [r.rate / x for r, x in zip(runs, ref)]
        cpu = [statistics.median(v) if (v := [x for x in xs if x is not None]) else None
               for xs in ([r.mover_us for r in runs], [r.server_us for r in runs])]  # fmt: skip
        rows.append(
            f"| {name} | {_cell([r.rate for r in runs])} | {_cell([r.with_startup for r in runs])} | "
            f"{_cell(ratios, '.2f')} | {' / '.join('—' if c is None else f'{c:.1f}' for c in cpu)} |"
        )
    if goal is not None:
        ratios = [r.rate / x for r, x in zip(results.rates[ours], ref)]
        met = "met" if statistics.median(ratios) >= goal else "NOT met"
        rows.append(f"| **{ours} / {reference}** (goal ≥ {goal:g}) | **{_cell(ratios, '.2f')}** {met} | | | |")
    return rows


def load_line(results: Results) -> str:
    loads = [x[0] for x in results.load]
    return f"load average (1 min) over the rounds: {min(loads):.2f}–{max(loads):.2f}"


def summary(results: Results) -> dict[str, Any]:
    """JSON of the rates, for a reader's own analysis."""
    return {
        "rates": {k: [round(r.rate) for r in v] for k, v in results.rates.items()},
        "with_startup": {k: [round(r.with_startup) for r in v] for k, v in results.rates.items()},
        "load": results.load,
    }
