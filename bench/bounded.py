#!/usr/bin/env python
"""What junk and size in the periodic registry cost: this tree against another revision.

``python bench/bounded.py [--before REV] [--entries 20000] [--junk 200000] [--max-wait 100]``
starts a Valkey of its own (``EmbeddedServer``) and, for this tree and for REV (``git archive``d
into a temporary folder, run with ``PYTHONPATH`` set to it), measures:

- ``periodic``: a real ``delayq dashboard`` over ``--entries`` periodic entries: one ``GET
  /api/v1/periodic`` (its seconds and bytes: the whole list, or the first page where it pages),
  and, where it pages, a walk of every page at ``limit=1000`` (seconds, pages, entries seen);
- ``start``: a real ``delayq forward --rq-cron`` (one cron entry) over ``--junk`` registry fields
  naming no entry: the seconds from its start to its first item forwarded to a Redis list (not
  forwarded within ``--max-wait``: reported as that, the process stopped).

The entries are one runtime entry's item copied under other names (as ``ops.upsert`` stores them),
loaded with this tree's code (the store format is the same). Prints one JSON object per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from delayq_backends import Config, DelayStore
from delayq_backends.embedded import EmbeddedServer, free_port
from delayq_backends.keys import periodic_key
from delayq_backends.periodic import ops
from delayq_backends.periodic.schedules import interval
from delayq_backends.targets import RedisListTarget

HERE = Path(__file__).resolve().parent.parent
SHARDS = 4
CRON = """
    import json
    from delayq_backends.rq import cron

    cron.register(json.dumps, "bench", args=("tick",), interval=3600, name="bench-tick")
"""


def tree_of(rev: str, into: Path) -> Path:
    """Revision ``rev`` of this repository as files under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(HERE), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def env_of(tree: Path, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    return {**env, "PYTHONPATH": str(tree), "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": str(SHARDS)}


def load_entries(store: DelayStore, count: int) -> None:
    """``count`` runtime entries: one added as users add it, its item copied under other names."""
    from celery import Celery

    from delayq_backends.celery.periodic import entry_spec

    app = Celery("bench", broker="memory://", set_as_current=False)
    ops.upsert(store, entry_spec(app, "e000000", {"task": "bench.tick", "schedule": interval(3600)}))
    item = store.get(ops.item_id("e000000"))
    assert item is not None
    names = [f"e{n:06d}" for n in range(1, count)]
    for start in range(0, len(names), 10_000):
        chunk = names[start : start + 10_000]
        store.client.hset(periodic_key(store.config.prefix), mapping={n: ops.item_id(n) for n in chunk})
        store.schedule_many([(ops.item_id(n), item.ready_ms / 1000, item.envelope) for n in chunk])


def periodic(tree: Path, url: str, prefix: str) -> dict[str, Any]:
    port = free_port()
    args = [sys.executable, "-m", "delayq_backends.cli", "dashboard", "--url", url, "--port", str(port), "--no-auth"]
    proc = subprocess.Popen(args, env=env_of(tree, prefix), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/api/v1/periodic"
    try:
        with httpx.Client(timeout=120) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.get(f"http://127.0.0.1:{port}/")
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            started = time.monotonic()
            first = client.get(base)
            out: dict[str, Any] = {
                "get_s": round(time.monotonic() - started, 3),
                "get_bytes": len(first.content),
                "get_entries": len(first.json()["entries"]),
            }
            if "next_cursor" in first.json():
                seen, pages, cursor = set(), 0, "0"
                started = time.monotonic()
                while cursor is not None:
                    page = client.get(base, params={"cursor": cursor, "limit": 1000}).json()
                    seen.update(e["name"] for e in page["entries"])
                    cursor, pages = page["next_cursor"], pages + 1
                out.update(walk_s=round(time.monotonic() - started, 3), walk_pages=pages, walk_entries=len(seen))
            return out
    finally:
        proc.terminate()
        proc.wait(10)


def start_delay(tree: Path, server: EmbeddedServer, prefix: str, junk: int, max_wait: float, tmp: Path) -> Any:
    client = redis.Redis.from_url(server.url)
    key = periodic_key(prefix)
    for start in range(0, junk, 20_000):
        client.hset(key, mapping={f"junk-{n}": f"periodic:junk-{n}" for n in range(start, min(start + 20_000, junk))})
    store = DelayStore(client, Config(prefix=prefix, shards=SHARDS))
    out = f"{prefix}:out"
    store.schedule("first", 0, RedisListTarget.envelope(out, b"first"))
    config = tmp / f"cron_{prefix}.py"
    config.write_text(textwrap.dedent(CRON))
    args = [sys.executable, "-m", "delayq_backends.cli", "forward", "--url", server.url, "--list-redis", server.url]
    args += ["--rq-redis", server.url, "--rq-cron", str(config), "--poll", "0.2"]
    started = time.monotonic()
    proc = subprocess.Popen(args, env=env_of(tree, prefix), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not client.llen(out):
            if time.monotonic() - started > max_wait:
                return f"> {max_wait} (not forwarded)"
            time.sleep(0.05)
        return round(time.monotonic() - started, 2)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", action="append", default=[], help="a revision to compare (repeatable)")
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--junk", type=int, default=200_000)
    parser.add_argument("--max-wait", type=float, default=100.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer() as server:
        trees = {"this tree": HERE}
        for rev in options.before:
            trees[rev] = tree_of(rev, Path(tmp) / rev)
        for n, (name, tree) in enumerate(trees.items()):
            store = DelayStore(redis.Redis.from_url(server.url), Config(prefix=f"p{n}", shards=SHARDS))
            load_entries(store, options.entries)
            figures = {"tree": name, "entries": options.entries, "junk": options.junk}
            figures["periodic"] = periodic(tree, server.url, f"p{n}")
            print(json.dumps(figures), flush=True)
            figures["start_s"] = start_delay(tree, server, f"s{n}", options.junk, options.max_wait, Path(tmp))
            print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
