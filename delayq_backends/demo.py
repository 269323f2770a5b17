"""``delayq demo``: schedule a burst of items on a real server, forward them at their time, and
measure how late they arrived.

The demo uses a fresh random prefix, so it never touches real data, and deletes its keys at the
end. With no URL it starts an embedded Valkey (see :mod:`delayq_backends.embedded`).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from typing import cast

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .config import Config
from .connection import Client, connect, redact_url
from .embedded import EmbeddedServer
from .forwarder import Forwarder
from .keys import meta_key
from .store import DelayStore
from .targets import RedisListTarget

__all__ = ["GRACE_SECONDS", "DemoResult", "print_result", "run_demo"]

#: How long after the last ready time the demo waits before it calls items missing.
GRACE_SECONDS = 30.0

#: The spread starts this far after "now", so the time spent scheduling does not count as
#: lateness of the earliest items.
LEAD_MS = 250


@dataclass(frozen=True)
class DemoResult:
    """What a demo run measured.

    Attributes:
        server: server kind and version, e.g. ``"valkey 9.0.0 (embedded)"``.
        url: the server's URL, password hidden.
        prefix: the throw-away key prefix (its keys are deleted when the demo ends).
        items: items scheduled.
        forwarded: publishes counted by the forwarder (more than ``items`` means re-deliveries).
        delivered: distinct ids found in the output list.
        duplicates: list entries beyond the first of each id (at-least-once shows up here).
        p50_ms, p99_ms, max_ms: lateness, server time at publish minus ready time; None if
            nothing was forwarded.
        elapsed_s: from scheduling until the last item was forwarded (or the wait gave up).
    """

    server: str
    url: str
    prefix: str
    items: int
    forwarded: int
    delivered: int
    duplicates: int
    p50_ms: int | None
    p99_ms: int | None
    max_ms: int | None
    elapsed_s: float

    @property
    def missing(self) -> int:
        return self.items - self.delivered


class _Background:
    """A forwarder's loop in a daemon thread; an error it dies of is kept for the caller."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, name="delayq-demo-forwarder", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.forwarder.run(install_signals=False, log_every=3600.0)
        except Exception as exc:  # re-raised in the caller's thread by stop()
            self.error = exc

    def stop(self) -> None:
        """Stop the loop (it finishes its batch) and raise what killed it, if anything."""
        self.forwarder.stop()
        self.thread.join(timeout=10.0)
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def run_demo(
    *,
    url: str | None = None,
    items: int = 3000,
    spread: float = 10.0,
    shards: int = 16,
    console: Console | None = None,
) -> DemoResult:
    """Schedule ``items`` list-target items over the next ``spread`` seconds, forward them with a
    :class:`Forwarder` in a background thread, and measure lateness and duplicates.

    Args:
        url: server to use; None starts an embedded one for the duration of the demo.
        console: where to show a progress bar; None shows nothing (tests).

    Raises:
        ServerNotFoundError: no URL and no server binary to start.
        DelayqError: the embedded server did not start, or the URL is unusable.
    """
    with ExitStack() as stack:
        url, embedded = _server(stack, url)
        prefix = f"delayq-demo-{uuid.uuid4().hex[:10]}"
        store = DelayStore(connect(url), Config(url=url, prefix=prefix, shards=shards))
        stack.callback(store.client.close)
        list_key = f"{prefix}:out"
        stack.callback(_delete_keys, store, list_key)
        background = _Background(Forwarder(store, [RedisListTarget(cast(redis.Redis, store.client))]))
        stack.callback(background.stop)  # also on errors and Ctrl-C; a second stop is harmless
        started = time.monotonic()
        _schedule(store, list_key, items, spread)
        _wait(background, items, spread + LEAD_MS / 1000 + GRACE_SECONDS, console)
        elapsed = time.monotonic() - started
        background.stop()
        delivered, duplicates = _count_list(store.client, list_key)
        stats = background.forwarder.stats
        return DemoResult(
            server=_describe(store.client, embedded),
            url=redact_url(url),
            prefix=prefix,
            items=items,
            forwarded=stats.forwarded,
            delivered=delivered,
            duplicates=duplicates,
            p50_ms=stats.percentile(0.5),
            p99_ms=stats.percentile(0.99),
            max_ms=max(stats.lateness_ms, default=None),
            elapsed_s=elapsed,
        )


def _server(stack: ExitStack, url: str | None) -> tuple[str, bool]:
    """The URL to use and whether it is embedded; an embedded server is stopped by ``stack``."""
    if url is not None:
        return url, False
    server = EmbeddedServer().start()  # ServerNotFoundError says what to install
    stack.callback(server.stop)
    return server.url, True


def _schedule(store: DelayStore, list_key: str, items: int, spread: float) -> None:
    """Schedule ``items`` envelopes whose bodies carry their id and ready time (JSON)."""
    start = store.clock() + LEAD_MS  # the server's clock is the one the forwarder claims by
    rng = random.Random()
    entries = []
    for n in range(items):
        item_id = f"demo-{n:07d}"
        ready_ms = start + int(rng.random() * spread * 1000)
        body = json.dumps({"id": item_id, "ready_ms": ready_ms}).encode()
        entries.append((item_id, ready_ms / 1000, RedisListTarget.envelope(list_key, body)))
    store.schedule_many(entries)


def _wait(background: _Background, items: int, timeout: float, console: Console | None) -> None:
    """Show progress until every item was forwarded, the forwarder died, or ``timeout`` passed."""
    stats = background.forwarder.stats
    deadline = time.monotonic() + timeout
    columns = (TextColumn("forwarding"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=console is None) as progress:
        task = progress.add_task("forwarding", total=items)
        while stats.forwarded < items and background.thread.is_alive() and time.monotonic() < deadline:
            progress.update(task, completed=stats.forwarded)
            time.sleep(0.05)
        progress.update(task, completed=min(items, stats.forwarded))


def _count_list(client: Client, list_key: str) -> tuple[int, int]:
    """(distinct ids, extra copies) in the output list."""
    counts = Counter(json.loads(body)["id"] for body in client.lrange(list_key, 0, -1))
    return len(counts), sum(counts.values()) - len(counts)


def _delete_keys(store: DelayStore, list_key: str) -> None:
    """Delete every key the demo made: the shards', the meta hash and the output list."""
    keys = [key for shard in range(store.shards) for key in store.keys(shard).all()]
    with store.client.pipeline(transaction=False) as pipe:
        for key in [*keys, meta_key(store.config.prefix), list_key]:
            pipe.delete(key)  # one key per command: shards live in different cluster slots
        pipe.execute()


def _describe(client: Client, embedded: bool) -> str:
    """Server kind and version, e.g. "valkey 9.0.0" or "redis 7.2.4"."""
    info = client.info("server")
    name = str(info.get("server_name") or "redis")
    version = info.get(f"{name}_version") or info.get("redis_version") or "?"
    return f"{name} {version}" + (" (embedded)" if embedded else "")


def print_result(result: DemoResult, console: Console) -> None:
    """The lateness table and the counts, as ``delayq demo`` prints them."""
    table = Table(title="lateness: forwarded time - ready time", min_width=44)
    for header in ("p50", "p99", "max"):
        table.add_column(header, justify="right")
    table.add_row(*("-" if ms is None else f"{ms} ms" for ms in (result.p50_ms, result.p99_ms, result.max_ms)))
    console.print(table)
    console.print(f"server: {result.server} at {result.url}", markup=False, soft_wrap=True)
    console.print(
        f"forwarded {result.forwarded} of {result.items} items in {result.elapsed_s:.1f} s; "
        f"in the list: {result.delivered} distinct, {result.duplicates} duplicates, "
        f"{result.missing} missing",
        markup=False,
        soft_wrap=True,
    )
