#!/usr/bin/env python
"""Concurrency slots bench: what a slot costs the forwarder, and how fast a key at its limit
drains, each against unslotted items in the same run.

Run ``python bench/slots.py`` (20,000 due items, 3 rounds) or ``--quick`` (5,000, 2 rounds).
Each round wipes the bench's own Valkey, loads the same due backlog (untimed) and releases it
into one Redis list with ``Forwarder.run_once()`` in this process, once by each case:

- **unslotted**: the items carry no slot;
- **one key, no wait**: every item carries the same slot key with a limit above the backlog, so
  each is granted: the cost of taking slots (one join and one take call per claim);
- **100 keys, no wait**: the same over 100 keys (one script call per key per publish call).

Then the **drain of a key at its limit**: 2,000 items (500 quick) of one key with limit 100
(and 10; 200 items, 50 quick, with limit 1), released by a forwarder thread while a worker
thread takes each item off the list and at once gives its slot back, timed until the list has
had them all; unslotted items the same way beside it. A slot given back passes to the head of
the line, whose item is brought forward and the forwarder woken (``slot_end.lua``,
``promote.lua``): with limit 1 each item costs a full round (the worker's end, a forwarder pass,
the pop), the latency of a hand-over.

Prints markdown tables (medians, min–max, ratios per round, forwarder and server CPU per item,
the load average); JSON with ``--json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from lib import grouping
from lib.items import envelope
from lib.movers import Case, in_process, load_line, options, rounds, summary, table
from lib.report import loadavg, log
from lib.server import BenchServer
from lib.timing import ms_now

from delayq_backends import DelayStore
from delayq_backends.envelope import Slot, with_slot
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget


@dataclass(frozen=True)
class Sizes:
    items: int
    rounds: int
    drain: int


FULL = Sizes(20_000, 3, 2_000)
QUICK = Sizes(5_000, 2, 500)


def load(store: DelayStore, n: int, keys: int, limit: int | None) -> None:
    """``n`` due items; with ``keys``, spread over that many slot keys of ``limit``."""
    due = int(ms_now()) - 1000
    rows = []
    for i in range(n):
        env = envelope(f"s-{i:08d}", due)
        if keys:
            env = with_slot(env, Slot(f"key-{i % keys}", limit))
        rows.append((f"s-{i:08d}", (due - n + i) / 1000, env.encode()))
    store.schedule_many(rows)


def cases(server: BenchServer, sizes: Sizes) -> list[Case]:
    def forward() -> int:
        client = server.connect()
        return Forwarder(server.store(client=client), [RedisListTarget(client)]).run_once()

    def case(name: str, keys: int) -> Case:
        limit = sizes.items + 1 if keys else None
        return Case(name, lambda: load(server.store(), sizes.items, keys, limit),
                    lambda: in_process(server, forward, sizes.items))  # fmt: skip

    return [case("unslotted", 0), case("one key, no wait", 1), case("100 keys, no wait", 100)]


#: the drain cases: name, slot limit (None: unslotted), items as a share of Sizes.drain
DRAINS = (("unslotted", None, 1), ("limit 100", 100, 1), ("limit 10", 10, 1), ("limit 1", 1, 10))


def drain(server: BenchServer, n: int, limit: int | None) -> float:
    """Items/s of a forwarder thread releasing ``n`` items of one key of ``limit`` (None:
    unslotted) while a worker thread pops each and gives its slot back at once."""
    return grouping.drain(
        server, n, lambda store: load(store, n, 1 if limit else 0, limit), "key-0" if limit else None
    ).rate


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__, argv)
    sizes = QUICK if args.quick else FULL
    drains: dict[str, list[float]] = {name: [] for name, _, _ in DRAINS}
    with BenchServer() as server:
        results = rounds(server, cases(server, sizes), sizes.rounds)
        for r in range(sizes.rounds):
            for name, limit, share in DRAINS:
                drains[name].append(drain(server, sizes.drain // share, limit))
                log(f"drain round {r + 1}/{sizes.rounds} {name}: {drains[name][-1]:,.0f}/s")
        version = server.version()
        end_load = loadavg()
    print(f"## Concurrency slots: {sizes.items:,} due items released into one list, {sizes.rounds} rounds, {version}\n")
    print("\n".join(table(results, "one key, no wait", "unslotted", goal=None)))
    print(f"\n{load_line(results)}\n")
    print(f"### Drain of one key, slots given back at once ({sizes.drain:,} items, {sizes.rounds} rounds)\n")
    print("| case | items | items/s, median (min–max) | ratio to unslotted, median |")
    print("|---|---:|---:|---:|")
    for name, _, share in DRAINS:
        rates = drains[name]
        ratio = statistics.median(r / u for r, u in zip(rates, drains["unslotted"]))
        print(f"| {name} | {sizes.drain // share:,} | {statistics.median(rates):,.0f} "
              f"({min(rates):,.0f}–{max(rates):,.0f}) | {ratio:.3f} |")  # fmt: skip
    print(f"\nload average (1, 5, 15 min) at the end: {end_load}")
    if args.json:
        print(json.dumps({**summary(results), "drain": drains}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
