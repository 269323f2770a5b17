#!/usr/bin/env python
"""Redis-list target bench: the ``delayq forward`` process against a naive mover, in one run.

Run ``python bench/target_list.py`` (200,000 due items, 5 rounds) or ``--quick`` (40,000, 3
rounds). Each round wipes the bench's own Valkey, loads the same due backlog (untimed) and
moves it into one list, once by each case, back to back:

- **naive mover**: ZRANGEBYSCORE + HMGET, then RPUSH + ZREM + HDEL pipelined, in this process
  (``lib.movers.naive_move``; no lease, no ack);
- **forwarder in process**: ``Forwarder.run_once()`` with the CLI's default settings, in this
  process, to tell the forwarder's own cost from the process's;
- **delayq forward**: the CLI process users run (default settings, and ``--batch 500``, the
  naive mover's batch), timed from its first item in the list to the last (its start-up is
  shown beside it).

Prints a markdown table (medians, min–max, the ratio per round, the load average); JSON with
``--json``. Issue 23's goal: the CLI ≥ 0.5× the naive mover.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from lib.items import OUT_LIST, load
from lib.movers import (
    Case,
    cli_forward,
    in_process,
    load_line,
    naive_move,
    options,
    process_drain,
    rounds,
    summary,
    table,
)
from lib.server import BenchServer
from lib.timing import ms_now

from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget


@dataclass(frozen=True)
class Sizes:
    items: int
    rounds: int


FULL = Sizes(200_000, 5)
QUICK = Sizes(40_000, 2)


def cases(server: BenchServer, sizes: Sizes) -> list[Case]:
    def fill() -> None:
        due = int(ms_now()) - 1000
        load(server.store(), "fwd", sizes.items, lambda i: due - i % 1000)

    def delivered() -> int:
        return int(server.client.llen(OUT_LIST))

    def naive() -> int:
        client = server.connect()
        return naive_move(client, server.store(client=client), int(ms_now()))

    def forwarder() -> int:
        client = server.connect()
        return Forwarder(server.store(client=client), [RedisListTarget(client)]).run_once()

    return [
        Case("naive mover", fill, lambda: in_process(server, naive, sizes.items)),
        Case("forwarder in process", fill, lambda: in_process(server, forwarder, sizes.items)),
        Case("delayq forward", fill, lambda: process_drain(server, cli_forward(server), delivered, sizes.items)),
        Case(
            "delayq forward --batch 500",
            fill,
            lambda: process_drain(server, cli_forward(server, "--batch", "500"), delivered, sizes.items),
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__, argv)
    sizes = QUICK if args.quick else FULL
    with BenchServer() as server:
        results = rounds(server, cases(server, sizes), sizes.rounds)
        version = server.version()
    print(f"## Redis list: {sizes.items:,} due items into one list, {sizes.rounds} rounds, {version}\n")
    print("\n".join(table(results, "delayq forward", "naive mover", goal=0.5)))
    print(f"\n{load_line(results)}")
    if args.json:
        print(json.dumps(summary(results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
