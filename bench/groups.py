#!/usr/bin/env python
"""Groups bench (issue 31): what a group's backlog costs other groups, what a group costs a
release, how fast a group at its limit drains, and how weights share releases; each against its
baseline in the same run.

Run ``python bench/groups.py`` (full sizes) or ``--quick`` (smaller backlogs, fewer rounds);
``--only STEP`` runs one step. Each measurement wipes the bench's own Valkey (16 shards) and
loads its backlog untimed. The steps:

- **lateness**: a real ``delayq forward`` (the list target) and 300 items of a quiet group due
  over 6 s, their lateness timed by a consumer that pops them as they arrive (the body carries
  the ready time): with nothing else in the store (the baseline), beside a group at limit 1 with
  50,000 items waiting (one released, nobody ends it), and beside 150,000 items of another group
  due now (released into a list nobody reads; how many of the limit-1 group went is printed:
  1 when its limit held). Before the stream, the forwarder's and the
  server's CPU over 5 s with nothing releasable: the limit-1 backlog against the empty store.
- **release**: one ``delayq forward`` process releasing 20,000 due items into one list:
  ungrouped (the baseline), all of one group, spread over 100 groups (limits above the backlog,
  so every item is admitted: the cost of admission). Goal: grouped >= 0.8x ungrouped.
- **drain**: a forwarder thread releasing a group at limit 10 (2,000 items) and at limit 1
  (200) while a worker thread pops each and at once ends it (ungrouped items the same way, the
  baseline), the most running at once reported beside (a drain past its limit meets no goal).
  The worker ends an item through the forwarder's give-back (``give_back_slots``): a Redis list
  carries no token for a worker's own report. Goals: limit 1 >= 500/s, limit 10 >= 3,000/s.
- **weights**: two groups of 20,000 due items each, their ready times interleaved, one
  ``delayq forward``: the heavy group's share of releases while both have a backlog, at weights
  1:1 (the baseline, 0.5) and 3:1 (goal 0.75 +- 5 %).

On the code before groups the bench writes through the slot API that groups alias
(``lib/grouping.py``), where a weight cannot be set: the 3:1 case then runs unweighted, and the
output says so. Prints markdown tables (medians, min–max, the load average); JSON with ``--json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from lib.grouping import API, Drain, drain, grouped, set_policy
from lib.items import OUT_LIST, envelope, load
from lib.movers import Case, cli_forward, cpu_seconds, load_line, options, process_drain, rounds, summary, table
from lib.processes import Processes
from lib.report import distribution, loadavg, log, median_spread
from lib.server import BenchServer
from lib.timing import ms_now
from lib.waiting import wait_for

from delayq_backends import DelayStore

STEPS = ("lateness", "release", "drain", "weights")
#: the lists nobody reads (the backlog groups' items), and the two weighted groups'
FULL_LIST, FLOOD_LIST, HEAVY_LIST, LIGHT_LIST = "bench:full", "bench:flood", "bench:heavy", "bench:light"
GOAL_P99_MS, GOAL_RELEASE_RATIO, GOAL_SHARE = 50.0, 0.8, 0.75
DRAIN_GOALS = {"limit 10": 3_000.0, "limit 1": 500.0}


@dataclass(frozen=True)
class Sizes:
    full_line: int  # items waiting in the limit-1 group
    flood: int  # items of another group due now
    runs: int  # lateness runs per case
    release: int  # items per release round
    rounds: int  # release and drain rounds
    drain: int  # items of the limit-10 drain (a tenth at limit 1)
    weighted: int  # items per weighted group


FULL = Sizes(50_000, 150_000, 3, 20_000, 3, 2_000, 20_000)
QUICK = Sizes(10_000, 30_000, 1, 5_000, 2, 500, 5_000)
QUIET_ITEMS, QUIET_OVER_S, IDLE_WINDOW_S = 300, 6.0, 5.0


def load_group(
    store: DelayStore, prefix: str, n: int, key: str | None, list_key: str, *, each: bool = False, **policy: Any
) -> None:
    """``n`` items due a second ago (in order), all of group ``key`` (None: ungrouped) carrying
    ``policy`` (limit, weight), for ``list_key``; untimed. They share one envelope, or with
    ``each`` have their own, whose body names the item (a worker that ends it needs its id)."""
    due = int(ms_now()) - 1000

    def data(item_id: str) -> bytes:
        env = envelope(item_id, 0, list_key)
        return (env if key is None else grouped(env, key, **policy)).encode()

    if not each:
        return load(store, prefix, n, lambda i: due - n + i, data=data(prefix))
    ids = [f"{prefix}-{i:08d}" for i in range(n)]
    store.schedule_many((item_id, (due - n + i) / 1000, data(item_id)) for i, item_id in enumerate(ids))


# -- lateness --------------------------------------------------------------------------------


def consume(server: BenchServer, expected: int, late: list[float], patience_s: float = 600) -> None:
    """Pop ``expected`` quiet items as they arrive (behind a flood on the code before groups:
    minutes) and record each one's lateness (ms); give up after ``patience_s`` without one."""
    client = server.connect()
    last = time.monotonic()
    while len(late) < expected and time.monotonic() - last < patience_s:
        got = client.blpop([OUT_LIST], timeout=1)  # under the client's 5 s socket timeout
        if got is not None:
            late.append(ms_now() - json.loads(got[1])["ready_ms"])
            last = time.monotonic()
    client.close()


def cpu_pct(server: BenchServer, pid: int, window: float) -> tuple[float | None, float]:
    """The server's and process ``pid``'s CPU (% of one core) over the next ``window`` s."""
    before = (server.cpu_seconds(), cpu_seconds(pid))
    time.sleep(window)
    after = (server.cpu_seconds(), cpu_seconds(pid))
    redis = None if before[0] is None or after[0] is None else round(100 * (after[0] - before[0]) / window, 1)
    return redis, round(100 * (after[1] - before[1]) / window, 1)


#: the lateness cases: name, the background they load (None: nothing), its CPU measured idle
LATENESS = (
    ("no backlog", None),
    ("beside a limit-1 group, {full_line:,} waiting", "full"),
    ("beside {flood:,} due now of another group", "flood"),
)


def lateness_once(server: BenchServer, background: str | None, sizes: Sizes, logs: Path) -> dict[str, Any]:
    server.wipe()
    store = server.store()
    if background == "full":
        load_group(store, "full", sizes.full_line, "full", FULL_LIST, limit=1)
    elif background == "flood":
        load_group(store, "flood", sizes.flood, "flood", FLOOD_LIST)
    out: dict[str, Any] = {"load": loadavg()}
    log_path = logs / f"forwarder-{background}.log"
    with Processes() as procs:
        forwarder = procs.delayq(*cli_forward(server, "--log-level", "info"), log=log_path)
        wait_for(lambda: "started" in log_path.read_text(), 120, "the forwarder started", interval=0.1)
        if background != "flood":  # nothing releasable: the idle store, or the limit-1 group's line
            time.sleep(2)  # past the start's first passes
            out["idle_redis_cpu_pct"], out["idle_forwarder_cpu_pct"] = cpu_pct(server, forwarder.pid, IDLE_WINDOW_S)
        late: list[float] = []
        reader = threading.Thread(target=consume, args=(server, QUIET_ITEMS, late), daemon=True)
        reader.start()
        start_ms = int(ms_now()) + 1000
        rows = [(f"quiet-{n}", start_ms + int(n * QUIET_OVER_S * 1000 / QUIET_ITEMS)) for n in range(QUIET_ITEMS)]
        cpu = (server.cpu_seconds(), cpu_seconds(forwarder.pid), time.monotonic())
        store.schedule_many((i, ready / 1000, grouped(envelope(i, ready), "quiet")) for i, ready in rows)
        reader.join(QUIET_OVER_S + 600)
        window = time.monotonic() - cpu[2]
        redis_after, forwarder_after = server.cpu_seconds(), cpu_seconds(forwarder.pid)
    if len(late) != QUIET_ITEMS:
        raise RuntimeError(f"{len(late)} of {QUIET_ITEMS} quiet items arrived")
    if background == "full":  # nobody ends the one released: more than one means no limit held the line
        out["full_released"] = int(server.client.llen(FULL_LIST))
    out["lateness_ms"] = distribution(late)
    out["stream_s"] = round(window, 1)
    out["forwarder_cpu_pct"] = round(100 * (forwarder_after - cpu[1]) / window, 1)
    if cpu[0] is not None and redis_after is not None:
        out["redis_cpu_pct"] = round(100 * (redis_after - cpu[0]) / window, 1)
    return out


def lateness(server: BenchServer, sizes: Sizes) -> dict[str, list[dict[str, Any]]]:
    """Every case once per run, interleaved: all of them see the same machine."""
    results: dict[str, list[dict[str, Any]]] = {}
    with TemporaryDirectory() as tmp:
        for run in range(sizes.runs):
            for name, background in LATENESS:
                label = name.format(full_line=sizes.full_line, flood=sizes.flood)
                results.setdefault(label, []).append(lateness_once(server, background, sizes, Path(tmp)))
                log(f"lateness run {run + 1}/{sizes.runs} {label}: {results[label][-1]}")
    return results


def _cell(values: Sequence[float], fmt: str = ",.1f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def lateness_report(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    rows = [
        f"| case | lateness p50, ms | p99, ms (goal ≤ {GOAL_P99_MS:g} beside a backlog) | forwarder / server CPU "
        "during the stream, % | forwarder / server CPU with nothing releasable, % | load (1 min) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        idle = [r for r in runs if "idle_forwarder_cpu_pct" in r]
        idle_cell = "—" if not idle else (
            f"{_cell([r['idle_forwarder_cpu_pct'] for r in idle])} / "
            f"{_cell([r.get('idle_redis_cpu_pct') or 0.0 for r in idle])}")  # fmt: skip
        rows.append(
            f"| {name} | {_cell([r['lateness_ms']['p50'] for r in runs])} | "
            f"{_cell([r['lateness_ms']['p99'] for r in runs])} | "
            f"{_cell([r['forwarder_cpu_pct'] for r in runs])} / {_cell([r.get('redis_cpu_pct') or 0.0 for r in runs])} "
            f"| {idle_cell} | {', '.join(str(r['load'][0]) for r in runs)} |"
        )
    return rows


# -- release ---------------------------------------------------------------------------------


def release_cases(server: BenchServer, sizes: Sizes) -> list[Case]:
    n = sizes.release

    def fill(groups: int) -> None:
        store = server.store()
        if not groups:
            return load_group(store, "u", n, None, OUT_LIST)
        for g in range(groups):  # the groups' items interleaved in time, each with a limit above the backlog
            load_group(store, f"g{g}", n // groups, f"group-{g}", OUT_LIST, limit=n + 1)

    def run() -> Any:
        return process_drain(server, cli_forward(server), lambda: int(server.client.llen(OUT_LIST)), n)

    return [Case(name, lambda groups=groups: fill(groups), run)
            for name, groups in (("ungrouped", 0), ("one group", 1), ("100 groups", 100))]  # fmt: skip


# -- drain -----------------------------------------------------------------------------------

#: the drain cases: name, group limit (None: ungrouped), items as a share of Sizes.drain
DRAINS = (("ungrouped", None, 1), ("limit 10", 10, 1), ("limit 1", 1, 10))


def drains(server: BenchServer, sizes: Sizes) -> dict[str, list[Drain]]:
    out: dict[str, list[Drain]] = {name: [] for name, _, _ in DRAINS}
    for r in range(sizes.rounds):
        for name, limit, share in DRAINS:
            n, key = sizes.drain // share, None if limit is None else "tenant"

            def fill(store: DelayStore, n: int = n, key: str | None = key, limit: int | None = limit) -> None:
                load_group(store, "d", n, key, OUT_LIST, each=True, **({} if limit is None else {"limit": limit}))

            out[name].append(drain(server, n, fill, key))
            log(f"drain round {r + 1}/{sizes.rounds} {name}: {out[name][-1].rate:,.0f}/s, "
                f"at most {out[name][-1].most_running} running")  # fmt: skip
    return out


# -- weights ---------------------------------------------------------------------------------


def share_once(server: BenchServer, n: int, heavy_weight: int) -> dict[str, Any]:
    """The heavy group's share of releases while both groups have items left: sampled every
    0.1 s from the 200th release until either group's last; the share over that whole time."""
    server.wipe()
    store = server.store()
    due = int(ms_now()) - 1000
    for key, list_key, weight, offset in (("heavy", HEAVY_LIST, heavy_weight, 0), ("light", LIGHT_LIST, 1, 1)):
        set_policy(store, key, weight=heavy_weight if key == "heavy" else 1)
        data = grouped(envelope(key, 0, list_key), key, weight=weight).encode()
        load(store, key, n, lambda i, offset=offset: due - 2 * n + 2 * i + offset, data=data)
    samples: list[tuple[int, int]] = []
    with Processes() as procs:
        procs.delayq(*cli_forward(server))

        def sample() -> bool:
            heavy, light = int(server.client.llen(HEAVY_LIST)), int(server.client.llen(LIGHT_LIST))
            if heavy < n and light < n and heavy + light >= 200:
                samples.append((heavy, light))
            return heavy + light >= 2 * n

        wait_for(sample, 600, f"{2 * n} released", interval=0.1)
    if not samples:
        raise RuntimeError("no sample while both groups had items left")
    heavy, light = samples[-1]
    return {"share": round(heavy / (heavy + light), 4), "samples": len(samples),
            "sample_shares": median_spread([h / (h + x) for h, x in samples]), "load": loadavg()}  # fmt: skip


def weights(server: BenchServer, sizes: Sizes) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"1:1": [], "3:1": []}
    for r in range(sizes.rounds):
        for name, heavy in (("1:1", 1), ("3:1", 3)):
            out[name].append(share_once(server, sizes.weighted, heavy))
            log(f"weights round {r + 1}/{sizes.rounds} {name}: {out[name][-1]}")
    return out


# -- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__, argv, STEPS)
    sizes = QUICK if args.quick else FULL
    chosen: Callable[[str], bool] = lambda step: args.only in (None, step)  # noqa: E731
    found: dict[str, Any] = {"api": API, "sizes": sizes.__dict__}
    with BenchServer() as server:
        version = server.version()
        print(f"## Groups ({'the slot API: the code before groups' if API == 'slot' else 'the group API'}), "
              f"{version}, {'quick' if args.quick else 'full'} sizes\n")  # fmt: skip
        if chosen("lateness"):
            found["lateness"] = lateness(server, sizes)
            print(f"### A quiet group's lateness ({QUIET_ITEMS} items due over {QUIET_OVER_S:g} s), "
                  f"median (min–max) of {sizes.runs} run(s)\n")  # fmt: skip
            print("\n".join(lateness_report(found["lateness"])) + "\n")
            released = [r["full_released"] for runs in found["lateness"].values() for r in runs if "full_released" in r]
            held = "its limit held" if set(released) == {1} else "**its limit did not hold: no group held it**"
            print(f"The limit-1 group's items released per run: {released} ({held})\n")
        if chosen("release"):
            results = rounds(server, release_cases(server, sizes), sizes.rounds)
            found["release"] = summary(results)
            print(f"### Release by one `delayq forward`, {sizes.release:,} due items, {sizes.rounds} rounds\n")
            print("\n".join(table(results, "one group", "ungrouped", goal=GOAL_RELEASE_RATIO)))
            print(f"\n{load_line(results)}\n")
        if chosen("drain"):
            found["drain"] = drained = drains(server, sizes)
            print(f"### Drain of one group whose tasks end at once, {sizes.rounds} rounds\n")
            print("| case | items | items/s, median (min–max) | goal | ratio to ungrouped | most running at once |")
            print("|---|---:|---:|---:|---:|---:|")
            for name, limit, share in DRAINS:
                rates, goal = [d.rate for d in drained[name]], DRAIN_GOALS.get(name)
                ratio = statistics.median(d.rate / u.rate for d, u in zip(drained[name], drained["ungrouped"]))
                most = max(d.most_running for d in drained[name])
                over = "" if limit is None or most <= limit else f" **over the limit {limit}**"
                met = "" if goal is None else f"≥ {goal:,.0f} " + (
                    "met" if statistics.median(rates) >= goal and not over else "NOT met")  # fmt: skip
                cells = [name, f"{sizes.drain // share:,}", _cell(rates, ",.0f"), met, f"{ratio:.3f}", f"{most}{over}"]
                print(f"| {' | '.join(cells)} |")
            print()
        if chosen("weights"):
            found["weights"] = shares = weights(server, sizes)
            unweighted = " (no weight on this code: run unweighted)" if API == "slot" else ""
            print(f"### Share of releases, two backlogged groups of {sizes.weighted:,} items, {sizes.rounds} rounds\n")
            print("| weights | heavy group's share while both wait, median (min–max) | expected |")
            print("|---|---:|---:|")
            for name, expected in (("1:1", 0.5), ("3:1", GOAL_SHARE)):
                print(f"| {name}{unweighted if name == '3:1' else ''} | "
                      f"{_cell([s['share'] for s in shares[name]], '.3f')} | {expected:.2f} ± 5 % |")  # fmt: skip
            print()
        print(f"load average (1, 5, 15 min) at the end: {loadavg()}")
    if args.json:
        print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
