#!/usr/bin/env python
"""Measure the capacity model's per-item costs on this machine, and check its predictions.

``python bench/capacity.py`` (about 2 min) starts its own servers and:

1. measures the costs of :class:`delayq_backends.capacity.Costs` on one Valkey: server CPU per
   item (from /proc, so a busy machine slows the run but not the figure) of ``schedule_many``,
   ``claim`` and ``ack`` at two batch sizes (the difference splits per-call from per-item cost),
   of an RPUSH publish, and the forwarder's own Python CPU per item; memory and wire bytes per
   waiting item; time inside one claim script (INFO commandstats: how long it blocks the server);
2. forwards a due backlog with 1 and 2 forwarder processes into 1 master and a 3-master cluster,
   and prints measured against predicted items/s and CPU µs per item.

JSON goes to stdout (its ``costs`` object is what ``delayq capacity --costs`` reads); with
``--results`` a dated section is appended to ``bench/RESULTS.md``. Load average is recorded at
start and end of every measurement: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from delayq_backends import Config, DelayStore
from delayq_backends.capacity import Costs, predict_forward_rate, store_us_per_forwarded
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from delayq_backends.timeutil import from_ms

RESULTS_PATH = Path(__file__).resolve().parent / "RESULTS.md"
BODY = b"x" * 100
SHARDS = 6
LIST = "bench:capacity:out"
SMALL, LARGE = 20, 500  # claim/ack batch sizes whose difference splits per-call from per-item cost
BATCH = 200  # forwarder batch in the validation runs


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(servers: Sequence[EmbeddedServer]) -> float:
    """User+system CPU of server processes (Linux /proc)."""
    total = 0.0
    for server in servers:
        pid = server.process.pid if server.process else 0
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def store_on(url: str, prefix: str) -> DelayStore:
    return DelayStore(connect(url), Config(url=url, prefix=prefix, shards=SHARDS))


def load(store: DelayStore, n: int, tag: str) -> None:
    """``n`` list items, all due (ready one second ago)."""
    due = from_ms(store.server_time_ms() - 1000)
    envelope = RedisListTarget.envelope(LIST, BODY).encode()
    for start in range(0, n, 50_000):
        store.schedule_many((f"{tag}-{i}", due, envelope) for i in range(start, min(n, start + 50_000)))


class Meter:
    """Server CPU, command time, memory and network bytes of one server over a block of work."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.client = redis.Redis.from_url(server.url)

    def sample(self) -> dict[str, float]:
        stats = self.client.info("stats")
        commands = self.client.info("commandstats")
        return {
            "cpu": cpu_seconds([self.server]),
            "usec": float(sum(v["usec"] for v in commands.values())),
            "memory": float(self.client.info("memory")["used_memory"]),
            "net_in": float(stats["total_net_input_bytes"]),
            "net_out": float(stats["total_net_output_bytes"]),
        }

    def over(self, work: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        before = self.sample()
        result = work()
        after = self.sample()
        return result, {k: after[k] - before[k] for k in before}


def claim_all(store: DelayStore, batch: int) -> list[Any]:
    claims = []
    for shard in range(SHARDS):
        while (claim := store.claim(shard, limit=batch)).items:
            claims.append(claim)
    return claims


def claim_ack_costs(server: EmbeddedServer, meter: Meter, n: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Per item and per call costs of claim and ack, from the same backlog claimed and acked at
    batch SMALL and at batch LARGE (per call = fixed + batch · per item); and the facts seen."""
    per_call: dict[str, dict[int, float]] = {"claim": {}, "ack": {}}
    block: dict[str, float] = {}
    wire_out = 0.0
    for batch in (SMALL, LARGE):
        store = store_on(server.url, f"c{batch}")
        load(store, n, "c")
        claims, d = meter.over(lambda b=batch, s=store: claim_all(s, b))
        assert sum(len(c.items) for c in claims) == n
        per_call["claim"][batch] = d["cpu"] * 1e6 / len(claims)
        block[str(batch)] = round(d["usec"] / len(claims), 1)
        wire_out = d["net_out"] / n
        _, d = meter.over(lambda cs=claims, s=store: [s.ack(c) for c in cs])
        per_call["ack"][batch] = d["cpu"] * 1e6 / len(claims)
    out = {}
    for verb, calls in per_call.items():
        out[f"{verb}_us"] = max(0.0, (calls[LARGE] - calls[SMALL]) / (LARGE - SMALL))
        out[f"{verb}_call_us"] = max(0.0, calls[SMALL] - SMALL * out[f"{verb}_us"])
    return out, {"claim_block_us": block, "claim_wire_bytes_per_item": round(wire_out, 1)}


def publish_us(client: redis.Redis, meter: Meter, n: int) -> float:
    """Server CPU per item RPUSHed in groups of BATCH, pipelined."""

    def publish() -> None:
        with client.pipeline(transaction=False) as pipe:
            for start in range(0, n, BATCH):
                pipe.rpush(LIST, *([BODY] * min(BATCH, n - start)))
                if len(pipe) >= 20:
                    pipe.execute()
            pipe.execute()

    _, d = meter.over(publish)
    client.delete(LIST)
    return d["cpu"] * 1e6 / n


def rtt_us(client: redis.Redis) -> float:
    """Median PING round trip."""
    rtts = []
    for _ in range(200):
        t0 = time.perf_counter()
        client.ping()
        rtts.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(rtts), 1)


def measure_costs(n: int) -> dict[str, Any]:
    """Every cost of :class:`Costs`, on one fresh Valkey."""
    with EmbeddedServer() as server:
        meter = Meter(server)
        client = redis.Redis.from_url(server.url)
        out: dict[str, float] = {}
        _, d = meter.over(lambda: load(store_on(server.url, "sched"), n, "s"))
        out["schedule_us"] = d["cpu"] * 1e6 / n
        out["bytes_per_item"] = d["memory"] / n
        wire_in = d["net_in"] / n
        script_costs, facts = claim_ack_costs(server, meter, n)
        out.update(script_costs)
        out["publish_us"] = publish_us(client, meter, n)
        store = store_on(server.url, "fwd")
        load(store, n, "f")
        forwarder = Forwarder(store, [RedisListTarget(client)], batch=BATCH)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        moved, d = meter.over(lambda: drain(forwarder))
        wall, py = time.perf_counter() - wall0, time.process_time() - cpu0
        assert moved == n and client.llen(LIST) == n
        out["forwarder_us"] = py * 1e6 / n
        out["wire_bytes_per_item"] = max(wire_in, facts["claim_wire_bytes_per_item"])
        facts["forward_one_in_process"] = {
            "items_s": round(n / wall),
            "server_us_per_item": round(d["cpu"] * 1e6 / n, 2),
            "python_us_per_item": round(out["forwarder_us"], 2),
        }
        facts["rtt_us_loopback"] = rtt_us(client)
        return {"costs": {k: round(v, 2) for k, v in out.items()}, "facts": facts}


def drain(forwarder: Forwarder) -> int:
    """Forward until nothing is due (``run_once`` goes on while anything is)."""
    moved = 0
    while claimed := forwarder.run_once():
        moved += claimed
    return moved


def _forwarder_main(url: str, broker: str, prefix: str, n: int, go: Any, ready: Any, results: Any) -> None:
    """Child process: one forwarder until all ``n`` items reached the list; its items and CPU."""
    out = redis.Redis.from_url(broker)
    forwarder = Forwarder(store_on(url, prefix), [RedisListTarget(out)], batch=BATCH)
    forwarder.store.check_meta()  # connected and checked before the clock starts
    ready.put(os.getpid())
    go.wait()
    cpu0, moved = time.process_time(), 0
    while moved < n:
        moved += drain(forwarder)
        if out.llen(LIST) >= n:  # the rest went through another forwarder
            break
        time.sleep(0.002)  # another forwarder holds the last leases: wait for its ack
    results.put({"moved": moved, "cpu": time.process_time() - cpu0})


def forward_run(
    url: str, masters: Sequence[EmbeddedServer], broker: EmbeddedServer, n: int, forwarders: int
) -> dict[str, Any]:
    """``forwarders`` processes draining ``n`` due items from the store at ``url``."""
    prefix = f"v{time.time_ns()}"
    load(store_on(url, prefix), n, "v")
    out = redis.Redis.from_url(broker.url)
    out.delete(LIST)
    ctx = mp.get_context("spawn")
    go, ready, results = ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=_forwarder_main, args=(url, broker.url, prefix, n, go, ready, results))
        for _ in range(forwarders)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:  # spawned interpreters import the package before the clock starts
        ready.get(timeout=120)
    load0, cpu0 = os.getloadavg()[0], cpu_seconds([*masters, broker])
    start = time.perf_counter()
    go.set()
    reports = [results.get(timeout=300) for _ in procs]
    wall = time.perf_counter() - start
    server_cpu = cpu_seconds([*masters, broker]) - cpu0
    for proc in procs:
        proc.join(10)
    assert sum(r["moved"] for r in reports) == n and out.llen(LIST) == n, "every item forwarded exactly once"
    total_cpu = server_cpu + sum(r["cpu"] for r in reports)
    return {
        "items_s": round(n / wall),
        "cpu_us_per_item": round(total_cpu * 1e6 / n, 2),
        "forwarders_us_per_item": round(sum(r["cpu"] for r in reports) * 1e6 / n, 2),
        "servers_us_per_item": round(server_cpu * 1e6 / n, 2),
        "cores_got": round(total_cpu / wall, 2),
        "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


def predict(costs: Costs, masters: int, forwarders: int, cores: float, rtt_us: float) -> dict[str, float]:
    """Items/s the model expects here: the least of the forwarders (each serial), the masters
    (one core each), the broker (one core) and the machine's cores shared by all."""
    store_side = store_us_per_forwarded(costs, BATCH)
    per_item_cpu = costs.forwarder_us + store_side + costs.publish_us
    limits = {
        "forwarders": forwarders * predict_forward_rate(costs, BATCH, rtt_us=rtt_us),
        "masters": masters * 1e6 / store_side,
        "broker": 1e6 / costs.publish_us if costs.publish_us else float("inf"),
        "cores": cores * 1e6 / per_item_cpu,
    }
    bound = min(limits, key=lambda k: limits[k])
    return {"items_s": round(limits[bound]), "bound": bound, "cpu_us_per_item": round(per_item_cpu, 2)}  # type: ignore[dict-item]


def validate(costs: Costs, n: int, rtt_us: float) -> list[dict[str, Any]]:
    rows = []
    cores = os.cpu_count() or 1
    with EmbeddedServer() as broker:
        for masters in (1, 3):
            cluster: EmbeddedCluster | None = None
            single: EmbeddedServer | None = None
            if masters == 1:
                single = EmbeddedServer().start()
                url, nodes = single.url, [single]
            else:
                cluster = EmbeddedCluster(masters=3).start()
                url, nodes = cluster.url, list(cluster.nodes)
            try:
                for forwarders in (1, 2):
                    log(f"forwarding {n} items: {masters} master(s), {forwarders} forwarder(s)")
                    measured = forward_run(url, nodes, broker, n, forwarders)
                    rows.append(
                        {
                            "masters": masters,
                            "forwarders": forwarders,
                            "measured": measured,
                            "predicted": predict(costs, masters, forwarders, cores, rtt_us),
                            # the same model, given only the CPU our processes got on the shared machine
                            "predicted_at_cores_got": predict(
                                costs, masters, forwarders, measured["cores_got"], rtt_us
                            ),
                        }
                    )
            finally:
                if single:
                    single.stop()
                if cluster:
                    cluster.stop()
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"## {report['when']} — capacity model: costs and validation ({report['seconds']} s)",
        "",
        f"Load average {report['load_start']} at start, {report['load_end']} at end (shared 2-core machine: "
        "other helpers' jobs ran too). Costs are CPU time, so load slows the run more than it moves them.",
        "",
        "| cost | value |",
        "|---|---:|",
        *(f"| `{k}` | {v} |" for k, v in report["costs"].items()),
        "",
        f"Facts: {json.dumps(report['facts'])}",
        "",
        "| masters | forwarders | items/s measured | predicted, quiet (bound) | predicted at cores got (bound) "
        "| cores got | CPU µs/item measured | predicted | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["validation"]:
        m, p, g = r["measured"], r["predicted"], r["predicted_at_cores_got"]
        lines.append(
            f"| {r['masters']} | {r['forwarders']} | {m['items_s']:,} | {p['items_s']:,} ({p['bound']}) | "
            f"{g['items_s']:,} ({g['bound']}) | {m['cores_got']} | {m['cpu_us_per_item']} | {p['cpu_us_per_item']} "
            f"| {m['load']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=20_000, help="items per measurement")
    parser.add_argument("--results", action="store_true", help="append a section to bench/RESULTS.md")
    args = parser.parse_args(argv)
    started, load_start = time.monotonic(), [round(x, 2) for x in os.getloadavg()]
    log(f"measuring costs on {args.items} items (load {load_start})")
    measured = measure_costs(args.items)
    costs = Costs(**measured["costs"])
    rows = validate(costs, args.items, measured["facts"]["rtt_us_loopback"])
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.monotonic() - started),
        "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()],
        **measured,
        "validation": rows,
    }
    print(json.dumps(report, indent=2))
    if args.results:
        with RESULTS_PATH.open("a", encoding="utf-8") as results:
            results.write("\n" + markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
