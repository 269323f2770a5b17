"""Hostile writes to every key kind of the layout, with real `delayq forward` processes.

The kinds come from ``keys.py`` itself (its ``*_key``/``*_channel`` functions and the keys of
:class:`ShardKeys`), so a new kind without an entry in :data:`COVERED` fails
:func:`test_every_key_kind_has_a_hostile_write_case`. Each kind is covered here or by the
named test. The outcome of a hostile write is one of two, never "forwarded 0, errors 0":

* good items keep flowing (and the garbage is reset, with a log line naming the key), or
* the forwarder stops loudly: non-zero exit, a line naming the key and the command that
  restores it; running that command lets a new forwarder deliver every item.
"""

from __future__ import annotations

import re
import threading
import types
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import pytest
import redis

from delayq_backends import DelayStore, keys
from delayq_backends.envelope import with_rate_key
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import ShardKeys, key_rate_key, meta_key, rate_key
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import Launcher, Proc, make_store
from tests.helpers import wait_for

SHARDS = 4
ITEMS = 40
OUT = "out"

#: Every key kind -> where its hostile writes are tried ("here" or a test's node id).
COVERED = {
    "meta_key": "here: test_meta_garbage_at_start, test_meta_changed_under_a_running_forwarder",
    "rate_key": "here: test_garbage_in_rate_buckets_is_reset_and_the_queue_flows",
    "key_rate_key": "here: test_garbage_in_rate_buckets_is_reset_and_the_queue_flows",
    "wake_channel": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "periodic_key": "tests/test_celery/test_periodic.py (registry; non-UTF-8 fields: issue 21 item 8, misc)",
    "ShardKeys.due": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.items": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.tries": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.leased": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.ranked": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.dead": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.dead_items": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.dead_info": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.calls": (
        "tests/scripts/test_debounce_lua.py::test_a_hand_written_counter_of_another_type_is_refused_before_any_write"
    ),
    "ShardKeys.started": "tests/scripts/test_keep_lua.py::test_started_finds_the_runs_workers_recorded",
}
#: Names in keys.py that end like a key builder but build none.
NOT_KEYS = {"collapsed_key": "parses an item id into (mode, key)"}


def key_kinds() -> set[str]:
    """Every key kind keys.py defines: module-level ``*_key``/``*_channel`` functions and the
    keys (cached properties and per-item methods) of ShardKeys."""
    module = {
        name
        for name, value in vars(keys).items()
        if isinstance(value, types.FunctionType) and name.endswith(("_key", "_channel")) and name not in NOT_KEYS
    }
    shard = {
        f"ShardKeys.{name}"
        for name, value in vars(ShardKeys).items()
        if not name.startswith("_")
        and name not in {"tag", "all"}
        and isinstance(value, (cached_property, types.FunctionType))
    }
    return module | shard


def test_every_key_kind_has_a_hostile_write_case() -> None:
    kinds = key_kinds()
    assert kinds - COVERED.keys() == set(), "a key kind without a hostile-write case: add one to COVERED"
    assert COVERED.keys() - kinds == set(), "COVERED names a key kind keys.py no longer has"
    root = Path(__file__).parent.parent
    for where in COVERED.values():
        if where.startswith("tests/") and "::" in where:
            path, test = where.split("::")
            assert f"def {test}(" in (root / path).read_text(), f"{where} does not exist"


def body(tag: str) -> bytes:
    return RedisListTarget.envelope(OUT, tag.encode()).encode()


def schedule(store: DelayStore, n: int, *, at: float = 0, rate_key: str | None = None) -> set[str]:
    ids = {f"item-{k}" for k in range(n)}
    for item_id in ids:
        envelope = RedisListTarget.envelope(OUT, item_id.encode())
        store.schedule(item_id, at, with_rate_key(envelope, rate_key) if rate_key else envelope)
    return ids


def delivered(client: redis.Redis) -> set[str]:
    return {b.decode() for b in client.lrange(OUT, 0, -1)}


def forward(procs: Launcher, url: str, prefix: str, log: Path, *extra: str) -> Proc:
    args = ["forward", "--url", url, "--prefix", prefix, "--shards", str(SHARDS), "--poll", "0.2", *extra]
    return procs.delayq(*args, "--log-level", "info", log=log)


#: A hostile write to the meta hash: (field, value), value None deleting the field; field None
#: replaces the whole key (value None deletes it, else a string of that value).
META_GARBAGE: dict[str, tuple[str | None, str | None]] = {
    "layout=1": ("layout", "1"),
    "layout deleted": ("layout", None),
    "layout=x": ("layout", "x"),
    "layout=5": ("layout", "5"),
    "layout=1e400": ("layout", "1e400"),
    "shards=x": ("shards", "x"),
    "shards=5": ("shards", "5"),
    "shards=-1": ("shards", "-1"),
    "shards deleted": ("shards", None),
    "meta deleted": (None, None),
    "meta a string": (None, "junk"),
}


def tamper(client: redis.Redis, prefix: str, garbage: tuple[str | None, str | None]) -> None:
    key, (field, value) = meta_key(prefix), garbage
    if field is None:
        client.delete(key)
        if value is not None:
            client.set(key, value)
    elif value is None:
        client.hdel(key, field)
    else:
        client.hset(key, field, value)


def run_fix(client: redis.Redis, log: str) -> str:
    """Run the command in backticks the log line names (HSET/DEL of the meta key)."""
    found = re.search(r"`((?:HSET|DEL) [^`]+)`", log)
    assert found, f"no command to restore the key in:\n{log[-3000:]}"
    client.execute_command(*found.group(1).split())
    return found.group(1)


@pytest.mark.parametrize("garbage", META_GARBAGE.values(), ids=META_GARBAGE.keys())
def test_meta_garbage_at_start(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: tuple[str | None, str | None]
) -> None:
    """A forwarder (re)started on tampered metadata delivers every item, or exits non-zero
    naming the key and the fix; after the fix a new forwarder delivers every item."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    ids = schedule(store, ITEMS)
    tamper(client, prefix, garbage)
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log)
    wait_for(lambda: proc.poll() is not None or delivered(client) == ids, 60, lambda: procs.tail())
    if delivered(client) != ids:
        text = log.read_text()
        assert proc.returncode != 0 and meta_key(prefix) in text, text[-3000:]
        assert delivered(client) == set() and client.hlen(store.keys(0).items) + client.hlen(store.keys(1).items) > 0
        run_fix(client, text)
        proc = forward(procs, valkey_url, prefix, tmp_path / "after-fix.log")
        wait_for(lambda: delivered(client) == ids, 60, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}")
    procs.stop(proc)


@pytest.mark.parametrize("garbage", META_GARBAGE.values(), ids=META_GARBAGE.keys())
def test_meta_changed_under_a_running_forwarder(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: tuple[str | None, str | None]
) -> None:
    """A running forwarder keeps the layout it checked at start (every item is delivered) and
    says the metadata changed, naming the key and the fix."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    ids = schedule(store, ITEMS, at=store.server_time_ms() / 1000 + 3)  # due after the tamper
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log)
    wait_for(lambda: "started" in log.read_text(), 30, lambda: procs.tail())
    tamper(client, prefix, garbage)
    wait_for(lambda: delivered(client) == ids, 60, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}")
    if garbage[0] == "shards" and garbage[1] is None or garbage == (None, None):
        return  # a deleted count (or meta) is recorded again by the next client that writes: no alarm needed
    wait_for(lambda: "store metadata changed" in log.read_text(), 30, lambda: procs.tail())
    line = next(x for x in log.read_text().splitlines() if "store metadata changed" in x)
    assert meta_key(prefix) in line and "HSET" in line
    assert proc.poll() is None


#: Garbage in a rate bucket's fields (finding 2 of issue 21 and its neighbours).
BUCKET_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "tokens=-9007199254740000": lambda c, k: c.hset(k, mapping={"tokens": "-9007199254740000", "at": "0"}),
    "at=9.007e15": lambda c, k: c.hset(k, mapping={"tokens": "0", "at": "9.007e15"}),
    "horizon=9e15": lambda c, k: c.hset(k, mapping={"tokens": "0", "horizon": "9000000000000000"}),
    "tokens=1e300": lambda c, k: c.hset(k, "tokens", "1e300"),
    "tokens=nan": lambda c, k: c.hset(k, mapping={"tokens": "nan", "at": "inf", "horizon": "-inf"}),
    "garbage bytes": lambda c, k: c.hset(k, mapping={"tokens": b"\xff\x00", "at": b"\x1b[2J", "horizon": b"1:2"}),
    "wrong type": lambda c, k: c.set(k, "junk"),
    "deleted": lambda c, k: c.delete(k),
}


@pytest.mark.parametrize("garbage", BUCKET_GARBAGE)
def test_garbage_in_rate_buckets_is_reset_and_the_queue_flows(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: str
) -> None:
    """With --rate and --key-rate, garbage in the queue's bucket and a key's bucket is reset
    with a warning naming the key: all items go at the rate (1000/s: well within the deadline)."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    buckets = [rate_key(prefix, OUT), key_rate_key(prefix, OUT, "tenant")]
    for bucket in buckets:
        BUCKET_GARBAGE[garbage](client, bucket)
    ids = schedule(store, 100, rate_key="tenant")
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log, "--rate", f"{OUT}=1000/s", "--key-rate", f"{OUT}=1000/s")
    wait_for(lambda: delivered(client) == ids, 30, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}")
    if garbage != "deleted":
        lines = [f"({bucket}) held out-of-range values" for bucket in buckets]
        wait_for(lambda: all(line in log.read_text() for line in lines), 10, lambda: procs.tail())
    assert proc.poll() is None


def test_a_meta_change_under_a_running_forwarder_is_counted(valkey_url: str, prefix: str) -> None:
    """The alarm is a metric too, and the forwarder keeps forwarding with its checked layout."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    metrics = ForwarderMetrics()
    inbox = CollectingTarget("list")
    forwarder = Forwarder(store, [inbox], metrics=metrics, poll_interval=0.1)
    runner = threading.Thread(target=forwarder.run, kwargs={"install_signals": False})
    runner.start()
    try:
        wait_for(lambda: store.layout is not None, 10, "the forwarder to read the layout")
        store.client.hset(meta_key(prefix), "layout", "1")
        alarms = lambda: metrics.registry.get_sample_value("delayq_meta_alarms_total") or 0  # noqa: E731
        wait_for(lambda: alarms() >= 1, 20, "delayq_meta_alarms to count the change")
        schedule(store, 5)
        wait_for(lambda: len(inbox.ids) == 5, 20, lambda: f"{inbox.ids} delivered")
    finally:
        forwarder.stop()
        runner.join(10)
