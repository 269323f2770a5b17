"""What the per-broker Celery target benches share: one captured task message, a
``celery -A … delayq forward`` process, the release of N due copies timed until the broker
holds them all, a falling-due lateness step, and the markdown table.

The bench for each broker (``bench/target_rabbitmq.py``, ``bench/target_celery_redis.py``)
brings its native publishers, how to read its queue's depth and how to consume it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from delayq_backends.celery import forget_store, store_for
from delayq_backends.embedded import EmbeddedServer

from .celery_run import CeleryRun
from .report import distribution, loadavg, log, median_spread
from .waiting import wait_for

__all__ = ["Bench", "Rates", "eta_ms", "sizes"]


def sizes(description: str) -> argparse.Namespace:
    """The command line every target bench takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="~3,000 tasks a round and a 2 s lateness step")
    parser.add_argument("--items", type=int, help="due tasks released a round (default 20,000; 3,000 quick)")
    parser.add_argument("--rounds", type=int, help="rounds, each way (default 5; 3 quick)")
    parser.add_argument("--late-seconds", type=float, help="how long tasks fall due in the lateness step")
    parser.add_argument("--queue-prefix", default="dqb-target-", help="broker queue names start with this")
    parser.add_argument(
        "--forward-arg",
        action="append",
        default=[],
        help="a forwarder option (--forward-arg=--overlap)",
    )
    args = parser.parse_args()
    args.items = args.items or (3_000 if args.quick else 20_000)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.late_seconds = args.late_seconds or (2.0 if args.quick else 6.0)
    return args


def eta_ms(eta: str) -> float:
    """The epoch ms of a message's ``eta`` header (the time it fell due in the store)."""
    return datetime.fromisoformat(eta).timestamp() * 1000


@dataclass
class Rates:
    """Items per second of each way, one per round, in the order measured."""

    runs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, way: str, rate: float) -> None:
        self.runs.setdefault(way, []).append(rate)
        log(f"  {way}: {rate:,.0f}/s")

    def median(self, way: str) -> float:
        return statistics.median(self.runs[way])


@dataclass
class Bench:
    """One broker's run: ``depth()`` reads the bench queue's message count, ``purge()`` empties it."""

    run: CeleryRun
    depth: Callable[[], int]
    purge: Callable[[], None]
    envelope: bytes = b""

    @classmethod
    @contextmanager
    def on(
        cls, kind: str, broker: str, valkey: EmbeddedServer, queue_prefix: str, queue_tools: Callable[[str, str], Any]
    ) -> Iterator[Bench]:
        """A bench on ``broker`` with a fresh queue; ``queue_tools(broker, queue)`` returns its
        ``(depth, purge)``. The queue and the store's items are removed at the end."""
        run = CeleryRun.on(kind, broker, valkey)
        run = replace(run, queue=f"{queue_prefix}{run.prefix}")
        depth, purge = queue_tools(broker, run.queue)
        bench = cls(run, depth, purge)
        bench.envelope = bench._template()
        try:
            yield bench
        finally:
            run.stop()
            run.delete_queue()

    def _template(self) -> bytes:
        """One task message, captured by the plugin as in production (its stored envelope)."""
        app = self.run.app()
        result = app.send_task("dqb.record", args=["bench", "x" * 100], countdown=3600)
        item = store_for(app).get(result.id)
        assert item is not None
        store_for(app).cancel(result.id)
        forget_store(app)
        return item.envelope

    def start_forwarder(self, *extra: str) -> None:
        """``celery -A lib.celery_app delayq forward`` with options ``extra``, returned once it has started."""
        log_path = Path(tempfile.mkdtemp(prefix="dq-target-")) / "forwarder.log"
        self.run.start_celery_forwarder(log_path, *extra)
        wait_for(lambda: "started" in log_path.read_text(errors="replace"), 60, "the forwarder to start")

    def schedule(self, ready: list[float]) -> None:
        """Copies of the template due at ``ready`` (epoch seconds), with fresh ids."""
        app = self.run.app()
        tag = uuid.uuid4().hex[:8]
        store_for(app).schedule_many((f"{tag}-{n}", when, self.envelope) for n, when in enumerate(ready))
        forget_store(app)

    def released(self, items: int) -> float:
        """Items/s of the running forwarder releasing ``items`` tasks that fall due together:
        from their due time until the broker's queue holds them all."""
        self.purge()
        due = time.time() + 1.0 + items / 10_000  # after the writes below are done
        self.schedule([due] * items)
        wait_for(lambda: time.time() >= due, 60, "the due time", interval=0.001)
        wait_for(lambda: self.depth() >= items, 120, f"{items} tasks in the broker", interval=0.01)
        took = time.time() - due
        self.purge()
        return items / took

    def timed(self, items: int, publish: Callable[[int], None]) -> float:
        """Items/s of a native ``publish(items)``: until the broker's queue holds them all."""
        self.purge()
        started = time.perf_counter()
        publish(items)
        wait_for(lambda: self.depth() >= items, 120, f"{items} native messages in the broker", interval=0.01)
        took = time.perf_counter() - started
        self.purge()
        return items / took

    def lateness(self, per_second: int, seconds: float, consume: Callable[[int, float], list[float]]) -> dict[str, Any]:
        """Tasks falling due at ``per_second`` for ``seconds``; ``consume(n, deadline)`` reads
        ``n`` messages and returns each one's lateness (read time − eta, ms)."""
        self.purge()
        n = int(per_second * seconds)
        start = time.time() + 1.5 + n / 10_000
        self.schedule([start + i / per_second for i in range(n)])
        late = consume(n, start + seconds + 60)
        return {"per_second": per_second, "seconds": seconds, **distribution(late)}


def rows(rates: Rates, ratios: list[tuple[str, str]]) -> list[str]:
    """Markdown rows: each way's median (min–max), then each (delayq, native) pair's ratio."""
    out = []
    for way, runs in rates.runs.items():
        spread = median_spread(runs)
        out.append(f"| {way} | {spread['median']:,.0f}/s ({spread['min']:,.0f}–{spread['max']:,.0f}) | |")
    for delayq, native in ratios:
        ratio = rates.median(delayq) / rates.median(native)
        out.append(f"| ratio {delayq} / {native} | | **{ratio:.2f}** |")
    return out


def table(title: str, args: argparse.Namespace, rates: Rates, ratios: list[tuple[str, str]], late: Any) -> str:
    """The bench's markdown table: rates and ratios, the lateness step, the load average."""
    head = f"### {title} ({args.items:,} tasks a round, {args.rounds} rounds, median (min–max))\n\n"
    lines = ["| way | rate | ratio |", "|---|---:|---:|", *rows(rates, ratios)]
    lines.append(
        f"| lateness, {late['per_second']:,}/s falling due for {late['seconds']:g} s (n={late['n']:,}) | "
        f"p50 {late['p50']:g} / p99 {late['p99']:g} / max {late['max']:g} ms | |"
    )
    return head + "\n".join(lines) + f"\n\nload average (1, 5, 15 min) at the end: {loadavg()}\n"
