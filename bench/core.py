#!/usr/bin/env python
"""Core benchmark of delayq_backends: schedule, forward, lateness, claim latency, wake-up.

Run ``python bench/core.py`` (full, about 7 min) or ``python bench/core.py --quick`` (smoke
test, < 2 min). JSON goes to stdout, progress to stderr, and a dated section is appended to
``bench/RESULTS.md`` (``--no-results`` skips that). Every figure is measured against a Valkey
server this script starts itself (``EmbeddedServer``), so the only data it ever wipes is its
own; the physical ceilings (plain pipelined ZADD+HSET, ``redis-benchmark``) are measured on the
same server in the same run, so ratios stay meaningful on a noisy, shared 2-core machine.

Throughput figures are medians over several repetitions, with the cases that are compared
(schedule_many vs its ceilings, batch 100/200/500) run round-robin; latency figures are
percentiles over all samples (for the steady-load test, the median over runs of each one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from itertools import islice
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import redis
from lib.items import OUT_LIST, entries, envelope, in_an_hour, load
from lib.movers import PIPE_ITEMS, naive_move
from lib.report import (
    BENCH_DIR,
    RESULTS_PATH,
    Figure,
    Goal,
    code_digest,
    distribution,
    figure,
    fmt_dist,
    loadavg,
    log,
    median_spread,
    percentile,
    write_results,
)
from lib.server import PREFIX, BenchServer
from lib.timing import Case, measure_cases, ms_now

from delayq_backends import Config, DelayStore
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget

#: Items per pipeline execute in the ceiling runs: schedule_many sends 500 items per script
#: call (SCHEDULE_CHUNK), so the ceiling uses pipelines of the same depth.


# -- sizes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does; ``--quick`` shrinks everything for a smoke test."""

    name: str
    reps: int  # repetitions of each throughput figure; the median is reported
    single_items: int  # store.schedule() calls per repetition
    bulk_items: int  # items per schedule_many repetition
    forward_items: int  # due backlog per forwarding repetition
    batches: tuple[int, ...]
    steady_rate: int  # items/s of the steady producer
    steady_seconds: float
    steady_runs: int
    due_rate: int  # items/s falling due in the falling-due run (scheduled ahead, all at once)
    due_seconds: float
    due_runs: int
    claim_sizes: tuple[int, ...]  # backlogs timed side by side; each is compared with the first
    claim_samples: int  # claim+ack pairs timed per backlog size
    wake_reps: int


FULL = Sizes(
    "full",
    reps=5,
    single_items=10_000,
    bulk_items=200_000,
    forward_items=200_000,
    batches=(100, 200, 500),
    steady_rate=1000,
    steady_seconds=20.0,
    steady_runs=3,
    due_rate=20_000,
    due_seconds=5.0,  # 100k items: what ForwarderStats keeps of lateness samples
    due_runs=3,
    claim_sizes=(10_000, 1_000_000, 10_000_000),
    claim_samples=400,
    wake_reps=50,
)
QUICK = replace(
    FULL,
    name="quick",
    reps=3,
    single_items=2_000,
    bulk_items=100_000,
    forward_items=30_000,
    steady_seconds=5.0,
    steady_runs=1,
    due_seconds=3.0,
    due_runs=1,
    claim_sizes=(10_000, 200_000),
    claim_samples=100,
    wake_reps=10,
)


# -- 1. schedule throughput and 2. its physical ceiling -----------------------------------------


def schedule_single_case(server: BenchServer, sizes: Sizes) -> Case:
    """One ``store.schedule`` per item: what a Celery ``apply_async(countdown=…)`` costs."""

    def prepare() -> Callable[[], int]:
        server.wipe()
        store = server.store()
        items = entries("single", sizes.single_items, in_an_hour(int(ms_now())))

        def work() -> int:
            for item_id, when, env in items:
                store.schedule(item_id, when, env)
            return len(items)

        return work

    return Case("schedule_single", "store.schedule() one call per item", prepare)


def ceiling_single_case(server: BenchServer, sizes: Sizes) -> Case:
    """ZADD+HSET in one pipeline round trip per item: the ceiling of one-call-per-item schedule."""

    def prepare() -> Callable[[], int]:
        server.wipe()
        store = server.store()
        items = entries("ceil1", sizes.single_items, in_an_hour(int(ms_now())), encoded=True)

        def work() -> int:
            for item_id, when, data in items:
                keys = store.keys(store.shard_of(item_id))
                with store.client.pipeline(transaction=False) as pipe:
                    pipe.zadd(keys.due, {item_id: int(when * 1000)})
                    pipe.hset(keys.items, item_id, data)
                    pipe.execute()
            return len(items)

        return work

    return Case("ceiling_single", "ceiling: ZADD+HSET, one round trip per item", prepare)


def schedule_many_case(server: BenchServer, sizes: Sizes, *, encoded: bool) -> Case:
    """``store.schedule_many`` of Envelope objects (the adapters' path) or of encoded bytes."""

    def prepare() -> Callable[[], int]:
        server.wipe()
        store = server.store()
        items = entries("bulk", sizes.bulk_items, in_an_hour(int(ms_now())), encoded=encoded)

        def work() -> int:
            return store.schedule_many(items).added

        return work

    if encoded:
        return Case("schedule_many_bytes", "store.schedule_many() of pre-encoded bytes", prepare)
    return Case("schedule_many", "store.schedule_many() of Envelopes", prepare, Goal(100_000, True, "items/s"))


def ceiling_pipelined_case(server: BenchServer, sizes: Sizes, *, variadic: bool) -> Case:
    """Plain redis-py pipelines writing the same keys, ids and bytes as schedule_many.

    ``variadic=False``: one ZADD + one HSET per item, ``PIPE_ITEMS`` items per execute (what a
    hand-written client would do). ``variadic=True``: one ZADD and one HSET of ``PIPE_ITEMS``
    members per shard chunk, 64 chunks per execute: the same call shape as schedule_many,
    minus validation and Lua, so it is the tightest ceiling for it.
    """

    def prepare() -> Callable[[], int]:
        server.wipe()
        store = server.store()
        items = entries("ceil", sizes.bulk_items, in_an_hour(int(ms_now())), encoded=True)
        client = server.connect()

        def per_item() -> int:
            it = iter(items)
            while chunk := list(islice(it, PIPE_ITEMS)):
                with client.pipeline(transaction=False) as pipe:
                    for item_id, when, data in chunk:
                        keys = store.keys(store.shard_of(item_id))
                        pipe.zadd(keys.due, {item_id: int(when * 1000)})
                        pipe.hset(keys.items, item_id, data)
                    pipe.execute()
            return len(items)

        def grouped() -> int:
            by_shard: dict[int, list[tuple[str, float, bytes]]] = {}
            for item in items:
                by_shard.setdefault(store.shard_of(item[0]), []).append(item)
            calls = [
                (shard, rows[i : i + PIPE_ITEMS])
                for shard, rows in by_shard.items()
                for i in range(0, len(rows), PIPE_ITEMS)
            ]
            it = iter(calls)
            while batch := list(islice(it, 64)):
                with client.pipeline(transaction=False) as pipe:
                    for shard, rows in batch:
                        keys = store.keys(shard)
                        pipe.zadd(keys.due, {item_id: int(when * 1000) for item_id, when, _ in rows})
                        pipe.hset(keys.items, mapping={item_id: data for item_id, _, data in rows})
                    pipe.execute()
            return len(items)

        return grouped if variadic else per_item

    if variadic:
        return Case("ceiling_pipeline_variadic", "ceiling: pipelined variadic ZADD+HSET, 500/shard-chunk", prepare)
    return Case("ceiling_pipeline_per_item", "ceiling: pipelined ZADD+HSET per item, 500 items/execute", prepare)


def bench_redis_benchmark(server: BenchServer, sizes: Sizes) -> Figure | None:
    """``redis-benchmark -c 1 -P 500`` ZADD and HSET (240-byte values) against our server.

    A C client cannot be the bottleneck, so this is the server's own ceiling for one
    pipelining producer; an item needs one of each, so items/s = 1 / (1/zadd + 1/hset).
    """
    exe = shutil.which("redis-benchmark")
    if exe is None:
        log("  redis-benchmark not on PATH: skipped")
        return None
    value = "v" * 240
    commands = {
        "zadd": ["zadd", "rb:{bench:0}:due", "__rand_int__", "item:__rand_int__"],
        "hset": ["hset", "rb:{bench:0}:items", "item:__rand_int__", value],
    }
    n = max(sizes.bulk_items, 200_000)
    medians: dict[str, float] = {}
    for name, command in commands.items():
        rates = []
        for _ in range(sizes.reps):
            server.wipe()
            out = subprocess.run(
                [
                    exe,
                    "-p",
                    str(server.port),
                    "-c",
                    "1",
                    "-P",
                    str(PIPE_ITEMS),
                    "-n",
                    str(n),
                    "-r",
                    "100000000",
                    "--csv",
                    *command,
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
            rates.append(float(out.strip().splitlines()[-1].split(",")[1].strip('"')))
        medians[name] = statistics.median(rates)
    combined = 1 / (1 / medians["zadd"] + 1 / medians["hset"])
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return figure(
        "ceiling_redis_benchmark",
        "ceiling: redis-benchmark -c 1 -P 500, ZADD then HSET",
        combined,
        "items/s",
        zadd_per_s=round(medians["zadd"]),
        hset_per_s=round(medians["hset"]),
        commands_per_run=n,
        tool=version,
    )


# -- 3. forwarding throughput -----------------------------------------------------------------


def forward_case(server: BenchServer, sizes: Sizes, batch: int, *, overlap: bool = False) -> Case:
    """One forwarder's ``run_once()`` draining a backlog of due items into a Redis list; with
    ``overlap``, each pass after the first is claimed while the one before it publishes."""

    def prepare() -> Callable[[], int]:
        server.wipe()
        client = server.connect()
        store = server.store(client=client)
        due = int(ms_now()) - 1000
        load(store, "fwd", sizes.forward_items, lambda i: due - i % 1000)
        forwarder = Forwarder(store, [RedisListTarget(client)], batch=batch, overlap=overlap)

        def work() -> int:
            claimed = forwarder.run_once()
            delivered = int(server.client.llen(OUT_LIST))
            if claimed != sizes.forward_items or delivered != sizes.forward_items:
                raise RuntimeError(f"forwarded {claimed} / delivered {delivered} of {sizes.forward_items}")
            return claimed

        return work

    key, what = (f"forward_b{batch}_overlap", ", claims overlapped") if overlap else (f"forward_b{batch}", "")
    return Case(key, f"forward, one forwarder, batch {batch}{what}", prepare, Goal(20_000, True, "items/s"))


def naive_mover_case(server: BenchServer, sizes: Sizes) -> Case:
    """:func:`naive_move` draining the same backlog as :func:`forward_case`, into the same list."""

    def prepare() -> Callable[[], int]:
        server.wipe()
        client = server.connect()
        store = server.store(client=client)
        due = int(ms_now()) - 1000
        load(store, "fwd", sizes.forward_items, lambda i: due - i % 1000)

        def work() -> int:
            moved = naive_move(client, store, int(ms_now()))
            delivered = int(server.client.llen(OUT_LIST))
            if moved != sizes.forward_items or delivered != sizes.forward_items:
                raise RuntimeError(f"moved {moved} / delivered {delivered} of {sizes.forward_items}")
            return moved

        return work

    return Case("naive_mover", f"reference: naive unreliable mover, LIMIT {PIPE_ITEMS}, no lease/ack", prepare)


def bench_forwarding(server: BenchServer, sizes: Sizes) -> list[Figure]:
    """One forwarder at each batch size and the naive mover, round-robin in one run, then the
    forwarder (batch 500, the mover's batch) as a fraction of the mover: per round, so load
    that drifts between rounds cancels out, with the spread over rounds."""
    cases = [*(forward_case(server, sizes, b) for b in sizes.batches)]
    cases += [forward_case(server, sizes, max(sizes.batches), overlap=True), naive_mover_case(server, sizes)]
    figures = measure_cases(server, sizes.reps, cases)
    by_key = {f.key: f for f in figures}
    forwarder, mover = by_key[f"forward_b{max(sizes.batches)}"], by_key["naive_mover"]
    per_round = [f / m for f, m in zip(forwarder.detail["runs"], mover.detail["runs"])]
    ratio = figure(
        "forwarder_vs_naive_mover",
        f"one forwarder (batch {max(sizes.batches)}) / naive mover, same run",
        statistics.median(per_round),
        "x",
        Goal(0.5, True, "x"),
        per_round=median_spread(per_round),
        forwarder_items_per_s=round(forwarder.value),
        mover_items_per_s=round(mover.value),
    )
    return [*figures, ratio]


# -- 4. lateness under steady load (forwarder and consumer in their own processes) --------------


def _forwarder_main(url: str, batch: int, stop: MpEvent, results: Any) -> None:
    """Child process: one forwarder, stopped by ``stop``; sends its lateness samples back."""
    import threading

    client = redis.Redis.from_url(url)
    forwarder = Forwarder(DelayStore(client, Config(prefix=PREFIX)), [RedisListTarget(client)], batch=batch)

    def stop_when_told() -> None:
        stop.wait()
        forwarder.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    stats = forwarder.run(install_signals=False, log_every=3600)
    results.put(
        {
            "lateness_ms": list(stats.lateness_ms),
            "forwarded": stats.forwarded,
            "batches": stats.batches,
            "cpu_fraction": (time.process_time() - cpu0) / (time.perf_counter() - wall0),
        }
    )


def _consumer_main(url: str, list_key: str, stop: MpEvent, received: Any, results: Any) -> None:
    """Child process: pop the list and record receive time − ready time (from the body).

    Pops up to 500 at a time (one BLPOP when the list is empty): one round trip per item could
    not keep up with 20,000 items/s, and the lateness would be the consumer's own."""
    client = redis.Redis.from_url(url)
    lateness: list[float] = []
    while True:
        bodies = client.lpop(list_key, 500)
        if not bodies:
            reply = client.blpop([list_key], timeout=0.2)
            if reply is None:
                if stop.is_set():
                    break
                continue
            bodies = [reply[1]]
        now = ms_now()
        lateness.extend(now - json.loads(b)["ready_ms"] for b in bodies)
        with received.get_lock():
            received.value += len(bodies)
    results.put(lateness)


@dataclass
class Pipeline:
    """A forwarder process and a consumer process around our server, for latency runs."""

    forwarder: Any
    consumer: Any
    stop: MpEvent
    received: Any
    forwarder_results: Any
    consumer_results: Any


@contextmanager
def forwarding_processes(
    server: BenchServer, list_key: str, *, batch: int = 200, consumer: bool = True
) -> Iterator[Pipeline]:
    """Start forwarder (+ consumer) processes, wait until the forwarder listens for wake-ups.

    Separate processes, not threads: on 2 cores a thread would share the producer's GIL and
    its lateness would measure our harness, not the forwarder.
    """
    ctx = mp.get_context("spawn")
    stop, received = ctx.Event(), ctx.Value("i", 0)
    fwd_q, con_q = ctx.Queue(), ctx.Queue()
    fwd = ctx.Process(target=_forwarder_main, args=(server.url, batch, stop, fwd_q), daemon=True)
    con = ctx.Process(target=_consumer_main, args=(server.url, list_key, stop, received, con_q), daemon=True)
    fwd.start()
    if consumer:
        con.start()
    channel = server.store().wake_channel
    deadline = time.monotonic() + 30
    while dict(server.client.pubsub_numsub(channel)).get(channel.encode(), 0) < 1:
        if time.monotonic() > deadline or not fwd.is_alive():
            raise RuntimeError("forwarder process did not subscribe to the wake channel")
        time.sleep(0.05)
    pipeline = Pipeline(fwd, con, stop, received, fwd_q, con_q)
    try:
        yield pipeline
    finally:
        stop.set()
        for proc in (fwd, con):
            if proc.pid is not None:
                proc.join(10)
                if proc.is_alive():
                    proc.terminate()


def finish(pipeline: Pipeline) -> tuple[dict[str, Any], list[float]]:
    """Stop both processes and collect (forwarder stats, consumer lateness samples)."""
    pipeline.stop.set()
    fwd = pipeline.forwarder_results.get(timeout=30)
    con = pipeline.consumer_results.get(timeout=30) if pipeline.consumer.pid is not None else []
    return fwd, con


@dataclass
class Produced:
    """What a lateness run's producer scheduled."""

    count: int
    call_ms: list[float]  # each schedule() call's latency (none for one bulk call)


def produce_steady(store: DelayStore, run: int, sizes: Sizes, list_key: str) -> Produced:
    """Schedule ``steady_rate`` items/s, each 50–500 ms ahead, with one schedule() per item,
    paced against absolute times (no drift)."""
    rng = random.Random(run)
    count = int(sizes.steady_rate * sizes.steady_seconds)
    call_ms: list[float] = []
    start = time.perf_counter()
    for i in range(count):
        pause = start + i / sizes.steady_rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        item_id = f"steady{run}-{i}"
        ready = int(ms_now()) + rng.randint(50, 500)
        t0 = time.perf_counter()
        store.schedule(item_id, ready / 1000, envelope(item_id, ready, list_key))
        call_ms.append((time.perf_counter() - t0) * 1000)
    return Produced(count, call_ms)


def produce_falling_due(store: DelayStore, run: int, sizes: Sizes, list_key: str) -> Produced:
    """Schedule ``due_rate × due_seconds`` items ahead with schedule_many, their ready times
    spread evenly at ``due_rate`` items/s from a start 1–4 s away: what the forwarder meets is
    that rate falling due, and no producer competes for the cores while it does.

    Raises if loading ran past the first ready time.
    """
    count = int(sizes.due_rate * sizes.due_seconds)
    start_ms = int(ms_now()) + 1000 + count // 30  # ~33 µs per item to build and load, with room
    rows = []
    for i in range(count):
        item_id, ready = f"due{run}-{i}", start_ms + i * 1000 // sizes.due_rate
        rows.append((item_id, ready / 1000, envelope(item_id, ready, list_key)))
    store.schedule_many(rows)
    if ms_now() >= start_ms:
        raise RuntimeError(f"loading {count} items ran past their first ready time: raise the lead time")
    return Produced(count, [])


#: schedules a lateness run's items: (store, run, sizes, list key) -> what it scheduled
Producer = Callable[[DelayStore, int, Sizes, str], Produced]


def lateness_run(server: BenchServer, sizes: Sizes, run: int, produce: Producer) -> dict[str, Any]:
    """One lateness run: ``produce`` schedules, then wait for every item to arrive and collect
    both sides, and the CPU share of each process and of the server."""
    server.wipe()
    list_key = f"bench:{produce.__name__}{run}"
    store = server.store()
    with forwarding_processes(server, list_key) as pipeline:
        t0, cpu0, server0 = time.perf_counter(), time.process_time(), server.cpu_seconds()
        produced = produce(store, run, sizes, list_key)
        produced_s = time.perf_counter() - t0
        deadline = time.monotonic() + 30
        while pipeline.received.value < produced.count and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        producer_cpu = (time.process_time() - cpu0) / wall
        server1 = server.cpu_seconds()
        server_cpu = (server1 - server0) / wall if server0 is not None and server1 is not None else None
        fwd, consumer_ms = finish(pipeline)
    return {
        "produced": produced.count,
        "achieved_rate": round(produced.count / produced_s, 1),
        "received": len(consumer_ms),
        "forwarder_ms": [float(x) for x in fwd["lateness_ms"]],
        "consumer_ms": consumer_ms,
        "schedule_call_ms": produced.call_ms,
        "items_per_batch": round(fwd["forwarded"] / max(1, fwd["batches"]), 2),
        "cpu_fraction": {
            "forwarder": round(fwd["cpu_fraction"], 2),
            "producer": round(producer_cpu, 2),
            "server": round(server_cpu, 2) if server_cpu is not None else None,
        },
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def lateness_figures(runs: list[dict[str, Any]], key: str, what: str, goal_ms: float) -> list[Figure]:
    """p99 lateness, forwarder side (server time at publish − ready) and consumer side (pop −
    ready): the median over runs of each run's percentiles."""
    figures = []
    for side, label in (("forwarder_ms", "forwarder side"), ("consumer_ms", "consumer side")):
        per_run = [distribution(r[side]) for r in runs]
        figures.append(
            figure(
                f"{key}_{side.split('_')[0]}_p99",
                f"lateness p99 {what}, {label}",
                statistics.median(d["p99"] for d in per_run),
                "ms",
                Goal(goal_ms, False, "ms"),
                p50=statistics.median(d["p50"] for d in per_run),
                max=max(d["max"] for d in per_run),
                per_run=per_run,
                pooled=distribution([x for r in runs for x in r[side]]),
            )
        )
    figures[0].detail.update(
        produced=[r["produced"] for r in runs],
        received=[r["received"] for r in runs],
        achieved_rate=[r["achieved_rate"] for r in runs],
        items_per_batch=[r["items_per_batch"] for r in runs],
        cpu_fraction=[r["cpu_fraction"] for r in runs],
        loadavg_1m=[r["loadavg_1m"] for r in runs],
        schedule_call_ms=distribution([x for r in runs for x in r["schedule_call_ms"]]),
    )
    return figures


def lateness_runs(server: BenchServer, sizes: Sizes, produce: Producer, runs: int, what: str) -> list[dict[str, Any]]:
    """``runs`` lateness runs of ``produce``, each logged with ``what`` it does."""
    out = []
    for run in range(runs):
        log(f"  run {run + 1}/{runs}: {what}")
        out.append(lateness_run(server, sizes, run, produce))
    return out


def bench_steady_lateness(server: BenchServer, sizes: Sizes) -> list[Figure]:
    """Lateness at a steady 1,000 items/s scheduled one call each, 50–500 ms ahead."""
    what = f"{sizes.steady_rate}/s for {sizes.steady_seconds:.0f} s, one schedule() each"
    runs = lateness_runs(server, sizes, produce_steady, sizes.steady_runs, what)
    return lateness_figures(runs, "lateness", f"at {sizes.steady_rate}/s", 20)


def bench_falling_due(server: BenchServer, sizes: Sizes) -> list[Figure]:
    """Lateness while ``due_rate`` items/s fall due for ``due_seconds``, one forwarder."""
    what = f"{sizes.due_rate}/s falling due for {sizes.due_seconds:.0f} s"
    runs = lateness_runs(server, sizes, produce_falling_due, sizes.due_runs, what)
    return lateness_figures(runs, "due_lateness", f"with {sizes.due_rate}/s falling due", 50)


# -- 5. claim latency vs backlog size -----------------------------------------------------------


def ids_on_shard(store: DelayStore, shard: int, count: int, tag: str) -> Iterator[list[str]]:
    """Endless batches of ``count`` fresh ids that all land on ``shard``."""
    n = 0
    while True:
        batch: list[str] = []
        while len(batch) < count:
            item_id = f"{tag}-{n}"
            n += 1
            if store.shard_of(item_id) == shard:
                batch.append(item_id)
        yield batch


@dataclass
class ClaimProbe:
    """A store with a backlog in the future, plus fresh ids on shard 0 to make due each time."""

    store: DelayStore
    fresh: Iterator[list[str]]
    total_ms: list[float] = field(default_factory=list)
    claim_ms: list[float] = field(default_factory=list)

    def sample(self, data: bytes, limit: int) -> None:
        """Make ``limit`` items due at shard 0's head (untimed), then time claim + ack.

        Everything else in the backlog lies an hour ahead, so the claim always finds a full
        batch at the head and must not look at the rest.
        """
        due = (int(ms_now()) - 1000) / 1000
        self.store.schedule_many([(item_id, due, data) for item_id in next(self.fresh)])
        t0 = time.perf_counter()
        claim = self.store.claim(0, limit=limit)
        t1 = time.perf_counter()
        acked = self.store.ack(claim)
        t2 = time.perf_counter()
        if len(claim.items) != limit or acked != limit:
            raise RuntimeError(f"claim found {len(claim.items)}, acked {acked}, expected {limit}")
        self.total_ms.append((t2 - t0) * 1000)
        self.claim_ms.append((t1 - t0) * 1000)


def claim_probe(server: BenchServer, shards: int, backlog: int) -> ClaimProbe:
    """Load ``backlog`` future items under a prefix of their own on our server."""
    store = DelayStore(server.connect(), Config(prefix=f"{PREFIX}-{backlog}", shards=shards))
    t0 = time.perf_counter()
    load(store, "later", backlog, in_an_hour(int(ms_now())))
    log(f"  {shards} shard(s): loaded {backlog:_} items in {time.perf_counter() - t0:.1f} s")
    return ClaimProbe(store, ids_on_shard(store, 0, 200, "due"))


def bench_claim_latency(server: BenchServer, sizes: Sizes, shards: int, limit: int = 200) -> list[Figure]:
    """claim(200)+ack latency with a small vs larger backlogs in the future.

    A claim is ZRANGEBYSCORE … LIMIT plus O(1) hash work per item, so it should not care how
    many items wait behind the head; the target is each larger backlog within 1.2x of the
    smallest. All backlogs live side by side (a prefix each) and samples go round them, so
    machine noise hits them alike instead of skewing the ratio.
    """
    server.wipe()
    probes = [claim_probe(server, shards, n) for n in sizes.claim_sizes]
    data = envelope("claim", 0).encode()
    for _ in range(sizes.claim_samples):
        for probe in probes:
            probe.sample(data, limit)
    small, d_small = sizes.claim_sizes[0], distribution(probes[0].total_ms)
    figures = []
    for backlog, probe in zip(sizes.claim_sizes[1:], probes[1:]):
        d_large = distribution(probe.total_ms)
        figures.append(
            figure(
                f"claim_ratio_{shards}shards_{backlog}",
                f"claim({limit})+ack median, {backlog:_} vs {small:_} items, {shards} shard(s)",
                d_large["p50"] / d_small["p50"],
                "x",
                Goal(1.2, False, "x"),
                small=d_small,
                large=d_large,
                p99_ratio=round(d_large["p99"] / d_small["p99"], 3),
                claim_only_small=distribution(probes[0].claim_ms),
                claim_only_large=distribution(probe.claim_ms),
                items_per_shard_large=backlog // shards,
            )
        )
    return figures


# -- wake-up precision --------------------------------------------------------------------------


def bench_wakeup(server: BenchServer, sizes: Sizes) -> Figure:
    """An idle forwarder, one item 200 ms ahead, repeated: how close to its time it arrives.

    The item is the shard's new head, so schedule PUBLISHes a wake-up and the forwarder
    should sleep exactly until the ready time instead of its 1 s safety poll. We BLPOP here.
    """
    server.wipe()
    list_key = "bench:wake"
    store = server.store()
    rng = random.Random(7)
    consumer_ms: list[float] = []
    with forwarding_processes(server, list_key, consumer=False) as pipeline:
        for i in range(sizes.wake_reps):
            time.sleep(rng.uniform(0.05, 0.3))  # land anywhere in the forwarder's idle sleep
            ready = int(ms_now()) + 200
            store.schedule(f"wake-{i}", ready / 1000, envelope(f"wake-{i}", ready, list_key))
            reply = server.client.blpop([list_key], timeout=5)
            if reply is None:
                raise RuntimeError(f"wake-up item {i} did not arrive within 5 s")
            consumer_ms.append(ms_now() - json.loads(reply[1])["ready_ms"])
        fwd, _ = finish(pipeline)
    forwarder_ms = [float(x) for x in fwd["lateness_ms"]]
    return figure(
        "wakeup_p99",
        "wake-up: idle forwarder, item 200 ms ahead, consumer-side p99",
        percentile(consumer_ms, 0.99),
        "ms",
        consumer=distribution(consumer_ms),
        forwarder=distribution(forwarder_ms),
    )


# -- report ---------------------------------------------------------------------------------------


def machine_facts(server: BenchServer) -> dict[str, Any]:
    """What the numbers depend on, recorded beside them."""
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor()
    try:
        import hiredis

        parser = f"hiredis {hiredis.__version__}"
    except ImportError:
        parser = "pure-Python parser"
    git = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=BENCH_DIR, capture_output=True, text=True
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "code_digest": code_digest(),
        "platform": platform.platform(),
        "server": server.version(),
        "server_settings": server.settings(),
        "redis_py": redis.__version__,
        "parser": parser,
        "git": git,
        "loadavg_start": loadavg(),
    }


def ceiling_ratios(figures: list[Figure]) -> dict[str, float]:
    """schedule_many as a fraction of each ceiling measured in the same run."""
    by_key = {f.key: f for f in figures}
    out = {}
    for ceiling in ("ceiling_pipeline_variadic", "ceiling_pipeline_per_item", "ceiling_redis_benchmark"):
        if ceiling in by_key and "schedule_many" in by_key:
            out[f"schedule_many/{ceiling}"] = round(by_key["schedule_many"].value / by_key[ceiling].value, 3)
    if "ceiling_single" in by_key and "schedule_single" in by_key:
        single = by_key["schedule_single"].value / by_key["ceiling_single"].value
        out["schedule_single/ceiling_single"] = round(single, 3)
    return out


def cpu_split(fig: Figure) -> str:
    """'client 31 µs + server 18 µs of 52 µs/item' for throughput figures, else ''."""
    d = fig.detail
    if d.get("wall_us_per_item") is None:
        return ""
    server = d.get("server_cpu_us_per_item")
    return (
        f"{d['wall_us_per_item']:.1f} µs/item wall = client CPU {d['client_cpu_us_per_item']:.1f}"
        f" + server CPU {server if server is not None else '?'} (of which commands "
        f"{d['server_cmd_us_per_item']:.1f}) + waiting"
    )


def markdown_section(report: dict[str, Any]) -> str:
    """The human-readable section appended to RESULTS.md for this run."""
    m, sizes = report["machine"], report["sizes"]
    lines = [
        f"## {report['started']} — {sizes['name']} run ({report['duration_s']:.0f} s)",
        "",
        *(
            ["*Quick (smoke-test) sizes: the targets are judged, but on too little data to trust.*", ""]
            if sizes["name"] == "quick"
            else []
        ),
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}, {m['server']} (embedded, "
        f"{', '.join(f'{k} {v}' for k, v in m['server_settings'].items())}), "
        f"redis-py {m['redis_py']} + {m['parser']}, code `{m['git']}` (source digest {m['code_digest']}); load average "
        f"{m['loadavg_start']} at start, {m['loadavg_end']} at end (shared machine: other jobs ran too).",
        *(
            ["**WARNING: delayq_backends changed while this run went on; its figures mix two versions.**"]
            if m["code_changed_during_run"]
            else []
        ),
        f"Throughput: median of {sizes['reps']} repetitions (all runs listed), the cases of a group run "
        "round-robin so drifting load hits them alike. Latency: percentiles over all samples.",
        "",
        "| figure | value | target | met |",
        "|---|---:|---|---|",
    ]
    for f in report["figures"]:
        met = "—" if f["met"] is None else ("yes" if f["met"] else "**NO**")
        lines.append(
            f"| {f['label']} | {f['value']:,.{0 if f['unit'] == 'items/s' else 2}f} {f['unit']} "
            f"| {f['target'] or '—'} | {met} |"
        )
    lines += ["", "Ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in report["ratios"].items()), "", "Details:", ""]
    for f in report["figures"]:
        lines.append(f"- **{f['key']}**: " + _detail_text(f))
        for row in f["detail"].get("profile_top_own_time", []):
            lines.append(f"    - `{row}`")
    return "\n".join(lines) + "\n"


def _detail_text(f: dict[str, Any]) -> str:
    """One readable line of evidence per figure (the JSON keeps everything)."""
    d = f["detail"]
    load = f"; load {d['loadavg_1m_after']}" if "loadavg_1m_after" in d else ""
    if "runs" in d:
        return f"runs {d['runs']} items/s; " + cpu_split(Figure(**f)) + load
    if "zadd_per_s" in d:
        return (
            f"ZADD {d['zadd_per_s']:_}/s, HSET {d['hset_per_s']:_}/s ({d['commands_per_run']:_} commands "
            f"each, {d['tool']}){load}"
        )
    if "consumer" in d:
        return f"consumer {fmt_dist(d['consumer'])}; forwarder {fmt_dist(d['forwarder'])}{load}"
    if "small" in d:
        return (
            f"claim+ack {fmt_dist(d['small'])} small vs {fmt_dist(d['large'])} large, p99 ratio "
            f"{d['p99_ratio']}; claim alone p50 {d['claim_only_small']['p50']} vs "
            f"{d['claim_only_large']['p50']} ms; {d['items_per_shard_large']:_} items per shard in the "
            f"large case{load}"
        )
    if "per_round" in d:
        r = d["per_round"]
        return (
            f"forwarder {d['forwarder_items_per_s']:_} vs mover {d['mover_items_per_s']:_} items/s (medians); "
            f"per round {r['min']:.2f}–{r['max']:.2f}x (spread {r['spread_pct']}%, n={r['n']}){load}"
        )
    if "per_run" in d:
        text = f"all samples {fmt_dist(d['pooled'])}; per-run p99 {[r['p99'] for r in d['per_run']]}"
        if "produced" in d:
            text += (
                f"; produced {d['produced']} at {d['achieved_rate']}/s, received {d['received']}; "
                f"{d['items_per_batch']} items per forwarder batch; CPU (share of one core) "
                f"{d['cpu_fraction']}; "
                + (f"schedule() call {fmt_dist(d['schedule_call_ms'])}; " if d["schedule_call_ms"]["n"] else "")
                + f"load {d['loadavg_1m']}"
            )
        return text
    return json.dumps(d)


# -- main -----------------------------------------------------------------------------------------


def run_all(sizes: Sizes, only: str | None = None) -> dict[str, Any]:
    """Every measurement (or those whose name contains ``only``) against one server we start,
    in a fixed order."""
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    figures: list[Figure] = []
    with BenchServer() as server:
        machine = machine_facts(server)
        log(f"server {machine['server']} on port {server.port}; {sizes.name} sizes")
        steps: list[tuple[str, Callable[[], Any]]] = [
            (
                "schedule, one call per item (interleaved with its ceiling)",
                lambda: measure_cases(
                    server, sizes.reps, [schedule_single_case(server, sizes), ceiling_single_case(server, sizes)]
                ),
            ),
            (
                "schedule_many (interleaved with its ceilings)",
                lambda: measure_cases(
                    server,
                    sizes.reps,
                    [
                        schedule_many_case(server, sizes, encoded=False),
                        schedule_many_case(server, sizes, encoded=True),
                        ceiling_pipelined_case(server, sizes, variadic=False),
                        ceiling_pipelined_case(server, sizes, variadic=True),
                    ],
                ),
            ),
            ("redis-benchmark", lambda: bench_redis_benchmark(server, sizes)),
            (
                f"forwarding, batches {sizes.batches} and the naive mover interleaved",
                lambda: bench_forwarding(server, sizes),
            ),
            ("steady lateness", lambda: bench_steady_lateness(server, sizes)),
            ("falling due", lambda: bench_falling_due(server, sizes)),
            ("claim latency 16 shards", lambda: bench_claim_latency(server, sizes, 16)),
            ("claim latency 1 shard", lambda: bench_claim_latency(server, sizes, 1)),
            ("wake-up", lambda: bench_wakeup(server, sizes)),
        ]
        for name, step in steps:
            if only is not None and only not in name:
                continue
            log(f"{name} ...")
            result = step()
            for fig in result if isinstance(result, list) else [result] if result else []:
                fig.detail["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                figures.append(fig)
                verdict = "" if fig.met is None else ("  target met" if fig.met else "  TARGET MISSED")
                log(f"  {fig.label}: {fig.value:,.2f} {fig.unit}{verdict}")
        server.wipe()
    machine["loadavg_end"] = loadavg()
    machine["code_changed_during_run"] = code_digest() != machine["code_digest"]
    if machine["code_changed_during_run"]:
        log("WARNING: delayq_backends changed during this run; its results mix two versions of the code")
    return {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": round(time.monotonic() - t0, 1),
        "sizes": asdict(sizes),
        "machine": machine,
        "figures": [asdict(f) for f in figures],
        "ratios": ceiling_ratios(figures),
        "targets": {f.key: f.met for f in figures if f.met is not None},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, < 2 min (smoke test)")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH, help="markdown file to append to")
    parser.add_argument("--no-results", action="store_true", help="print JSON only, do not touch RESULTS.md")
    parser.add_argument("--only", metavar="TEXT", help="run only the steps whose name contains TEXT (e.g. forwarding)")
    args = parser.parse_args(argv)
    report = run_all(QUICK if args.quick else FULL, args.only)
    json.dump(report, sys.stdout, indent=2)
    print()
    if not args.no_results:
        write_results(args.results, markdown_section(report))
        log(f"appended a section to {args.results}")
    missed = [k for k, met in report["targets"].items() if not met]
    log("all targets met" if not missed else f"targets missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
