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
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq_backends import DelayStore, Envelope, keys
from delayq_backends.celery import store_for
from delayq_backends.celery.periodic import sync
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import with_rate_key
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import ShardKeys, key_rate_key, meta_key, periodic_code_key, periodic_key, rate_key
from delayq_backends.metrics import ForwarderMetrics
from delayq_backends.rq import Queue
from delayq_backends.rq.registry import registry_key
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import Launcher, Proc, delete_prefix, make_store
from tests.helpers import wait_for
from tests.test_celery.harness import new_env

SHARDS = 4
ITEMS = 40
OUT = "out"

#: Every key kind -> where its hostile writes are tried ("here" or a test's node id).
COVERED = {
    "meta_key": "here: test_meta_garbage_at_start, test_meta_changed_under_a_running_forwarder",
    "rate_key": "here: test_garbage_in_rate_buckets_is_reset_and_the_queue_flows",
    "key_rate_key": "here: test_garbage_in_rate_buckets_is_reset_and_the_queue_flows",
    "wake_channel": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "periodic_key": "here: test_garbage_in_the_periodic_registry_never_stops_the_line",
    "periodic_code_key": "here: test_garbage_in_the_code_schedule_record_never_stops_the_line; each role: "
    "tests/test_rq/test_trust.py::test_the_code_schedule_record_is_the_operators_and_a_missing_one_lets_no_old_deploy_win",
    "periodic_trust_key": "tests/test_rq/test_trust.py::test_garbage_in_the_trusted_definitions_never_stops_the_line",
    "ShardKeys.due": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.items": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.tries": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.leased": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.ranked": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.dead": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.dead_items": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.dead_info": "tests/test_hostile.py::test_garbage_never_stops_the_line",
    "ShardKeys.calls": "here: test_garbage_in_call_counters_never_stops_the_line",
    "ShardKeys.started": "here: test_garbage_start_records_never_stop_the_line",
    "ShardKeys.parked": "here: test_garbage_in_the_parking_keys_never_stops_the_line; roles: "
    "tests/test_security.py::test_only_a_forwarder_parks_and_a_producer_or_worker_cannot_touch_the_parked_items",
    "ShardKeys.parked_why": "here: test_garbage_in_the_parking_keys_never_stops_the_line",
    "ShardKeys.gline": "tests/test_group_lines.py::test_garbage_in_group_lines_never_stops_a_group",
    "ShardKeys.gready": "tests/test_group_lines.py::test_garbage_in_group_lines_never_stops_a_group",
    "group_wake_channel": "tests/test_group_lines.py::test_garbage_on_the_groups_wake_channel_is_a_hint_at_most",
    "slot_holds_key": "tests/test_slots.py::test_garbage_in_slot_keys_never_stops_the_line",
    "slot_waiting_key": "tests/test_slots.py::test_garbage_in_slot_keys_never_stops_the_line",
    "slot_waits_key": "tests/test_slots.py::test_garbage_in_slot_keys_never_stops_the_line",
    "slot_limit_key": "tests/test_slots.py::test_garbage_in_slot_keys_never_stops_the_line",
    "slot_tokens_key": "tests/test_slots.py::test_garbage_in_slot_keys_never_stops_the_line",
    "slot_reports_key": "tests/test_slots.py::test_garbage_in_slot_keys_never_stops_the_line",
    "group_policy_key": "tests/test_group_policy.py::test_garbage_in_policy_and_bucket_is_dropped_and_reported",
    "group_bucket_key": "tests/test_group_policy.py::test_garbage_in_policy_and_bucket_is_dropped_and_reported",
    "ShardKeys.batch": "tests/test_batches.py::test_garbage_in_batch_keys_is_reported_never_raised",
    "ShardKeys.batch_members": "tests/test_batches.py::test_garbage_in_batch_keys_is_reported_never_raised",
    "ShardKeys.batch_done": "tests/test_batches.py::test_garbage_in_batch_keys_is_reported_never_raised",
    "ShardKeys.batch_failed": "tests/test_batches.py::test_garbage_in_batch_keys_is_reported_never_raised",
    "batch_channel": "tests/test_batches.py::test_a_batch_completes_once_when_closed_and_every_sub_job_finished",
    "ShardKeys.batch_fired": "tests/test_batch_forgery.py::"
    "test_a_completed_batch_never_fires_again_whatever_its_hash_says",
    "ShardKeys.batch_firing": "tests/test_batch_forgery.py::"
    "test_a_completed_batch_never_fires_again_whatever_its_hash_says",
    "ShardKeys.periodic_history": "tests/test_celery/test_periodic_history_processes.py::"
    "test_garbage_in_history_keys_never_stops_a_firing_or_a_worker",
    "ShardKeys.periodic_runs": "tests/test_celery/test_periodic_history_processes.py::"
    "test_garbage_in_history_keys_never_stops_a_firing_or_a_worker",
    "rq mirror": "here: test_garbage_in_the_rq_mirror_never_stops_the_line",
    "audit stream": "here: test_garbage_in_the_audit_stream_never_stops_the_line",
}
#: Key kinds the project writes that keys.py does not build: RQ's own ``rq:scheduled:<queue>``
#: (the mirror, :mod:`delayq_backends.rq.registry`) and the user-named ``--audit-stream``.
EXTRA_KINDS = {"rq mirror", "audit stream"}
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
    assert COVERED.keys() - kinds - EXTRA_KINDS == set(), "COVERED names a key kind keys.py no longer has"
    root = Path(__file__).parent.parent
    for where in COVERED.values():
        if where.startswith("tests/") and "::" in where:
            path, test = where.split("::")
            assert f"def {test}(" in (root / path).read_text(), f"{where} does not exist"


@pytest.fixture(autouse=True)
def empty_out(valkey_url: str) -> None:
    """Every test delivers the same bodies to the same list: one left from an earlier test would
    pass the next without its forwarder delivering anything (the meta cases once did)."""
    client = redis.Redis.from_url(valkey_url)
    client.delete(OUT)
    client.close()


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
    says the metadata changed, naming the key and the fix (it looks every --meta-watch: 0.5 s
    here, 5 s by default)."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    ids = schedule(store, ITEMS, at=store.server_time_ms() / 1000 + 3)  # due after the tamper
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log, "--meta-watch", "0.5")
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
    forwarder = Forwarder(store, [inbox], metrics=metrics, poll_interval=0.1, meta_watch=0.2)
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


def test_extra_kinds_are_the_keys_written_outside_keys_py() -> None:
    """The kinds keys.py does not build (RQ's own key, a user-named stream) are listed too."""
    assert COVERED.keys() >= EXTRA_KINDS
    assert all(COVERED[kind].startswith("here: ") for kind in EXTRA_KINDS)


#: Hostile writes to the audit stream (``--audit-stream``): the forwarder only appends to it.
AUDIT_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "wrong type": lambda c, k: c.set(k, "junk"),
    "garbage bytes": lambda c, k: c.xadd(k, {b"\xff\x00": b"\x1b[2J", "at_ms": "nan"}),
    "largest id": lambda c, k: (
        c.delete(k),
        c.xadd(k, {"at_ms": "1e400"}, id="18446744073709551615-18446744073709551615"),
    ),
    "deleted": lambda c, k: c.delete(k),
}


@pytest.mark.parametrize("garbage", AUDIT_GARBAGE)
def test_garbage_in_the_audit_stream_never_stops_the_line(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: str
) -> None:
    """Garbage in the audit stream, before and under a running forwarder: every item is
    delivered; records that cannot be written are dropped with a warning naming the stream."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client, stream = store.client, f"{prefix}:audit"
    AUDIT_GARBAGE[garbage](client, stream)
    first = schedule(store, ITEMS // 2)
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log, "--audit-stream", stream)
    wait_for(lambda: delivered(client) == first, 30, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}")
    AUDIT_GARBAGE[garbage](client, stream)
    ids = {f"late-{k}" for k in range(ITEMS // 2)}
    store.schedule_many([(i, 0, RedisListTarget.envelope(OUT, i.encode())) for i in ids])
    wait_for(
        lambda: delivered(client) == first | ids, 30, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}"
    )
    if garbage != "deleted":
        wait_for(lambda: f"stream={stream!r}" in log.read_text(), 10, lambda: procs.tail())
    assert proc.poll() is None


def _rq_jobs(client: redis.Redis, store: DelayStore, queue_name: str, n: int, delay: float) -> set[str]:
    queue = Queue(queue_name, connection=client, delay_store=store)
    return {queue.enqueue_in(timedelta(seconds=delay), "builtins.print", k).id for k in range(n)}


#: Hostile writes to RQ's ``rq:scheduled:<queue>`` (the mirror rq-dashboard reads, and where the
#: forwarder adopts jobs a plain rq.Queue scheduled).
MIRROR_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "wrong type": lambda c, k: (c.delete(k), c.set(k, "junk")),
    "garbage members": lambda c, k: c.zadd(k, {b"\xff\xfe": 0, "no-such-job": 1, "x" * 600: 2}),
    "extreme scores": lambda c, k: c.zadd(k, {"inf-job": "inf", "-inf-job": "-inf", "big": 1e308, "neg": -1e308}),
    "deleted": lambda c, k: c.delete(k),
}


@pytest.mark.parametrize("garbage", MIRROR_GARBAGE)
def test_garbage_in_the_rq_mirror_never_stops_the_line(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: str
) -> None:
    """Garbage in rq:scheduled:<queue>, before and under a real RQ-target forwarder (adopting
    stray entries every second): every job reaches its RQ queue; garbage entries are skipped
    with a line naming the key."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client, queue_name = store.client, f"{prefix}-q"
    key = registry_key(queue_name)
    jobs = _rq_jobs(client, store, queue_name, ITEMS // 2, 1)
    MIRROR_GARBAGE[garbage](client, key)
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log, "--rq-redis", valkey_url)
    queued = lambda: {b.decode() for b in client.lrange(f"rq:queue:{queue_name}", 0, -1)}  # noqa: E731
    wait_for(lambda: queued() >= jobs, 30, lambda: f"{len(queued())} queued\n{procs.tail()}")
    client.delete(key)  # producers met no garbage: what they write is another matter (README Security)
    more = _rq_jobs(client, store, queue_name, ITEMS // 2, 2)
    MIRROR_GARBAGE[garbage](client, key)  # under a running forwarder, before they are due
    wait_for(lambda: queued() >= jobs | more, 30, lambda: f"{len(queued())} queued\n{procs.tail()}")
    if garbage in ("wrong type", "garbage members"):
        wait_for(lambda: key in log.read_text(), 10, lambda: procs.tail())
    assert proc.poll() is None


def _debounced(store: DelayStore, n: int, delay: float) -> set[str]:
    now = store.server_time_ms() / 1000
    for k in range(n):
        store.debounce(f"k{k}", now + delay, RedisListTarget.envelope(OUT, f"debounce:k{k}".encode()))
    return {f"debounce:k{k}" for k in range(n)}


#: Hostile writes to a debounced item's call counter (``ShardKeys.calls``).
CALLS_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "wrong type": lambda c, k: (c.delete(k), c.set(k, "junk")),
    "garbage bytes": lambda c, k: c.hset(k, mapping={"calls": b"\xff\x00", b"\x1b[2J": b"x"}),
    "extreme numbers": lambda c, k: c.hset(k, "calls", "1e400"),
    "negative": lambda c, k: c.hset(k, "calls", "-9223372036854775808"),
    "deleted": lambda c, k: c.delete(k),
}


@pytest.mark.parametrize("garbage", CALLS_GARBAGE)
def test_garbage_in_call_counters_never_stops_the_line(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: str
) -> None:
    """Garbage in debounced items' call counters under a running forwarder: every run is
    delivered, listing works; a call on a counter of another type is refused naming the key."""

    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    ids = _debounced(store, ITEMS, 2)
    for item_id in ids:
        CALLS_GARBAGE[garbage](client, store.keys(store.shard_of(item_id)).calls(item_id))
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log)
    assert len(store.scheduled(count=ITEMS)) == ITEMS  # `delayq list` reads the counters
    if garbage == "wrong type":
        with pytest.raises(
            redis.ResponseError, match=re.escape(store.keys(store.shard_of("debounce:k0")).calls("debounce:k0"))
        ):
            _debounced(store, 1, 2)
    else:
        _debounced(store, ITEMS, 2)  # a call on the garbage counter
    wait_for(lambda: delivered(client) == ids, 30, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}")
    assert proc.poll() is None


#: Hostile writes to a shard's parking keys (ShardKeys.parked, parked_why), given the shard's
#: keys and the ids of its good items: entries for items that are not parked, or do not exist.
PARKING_GARBAGE: dict[str, Callable[[redis.Redis, ShardKeys, list[str]], object]] = {
    "wrong type": lambda c, k, good: (c.set(k.parked, "junk"), c.rpush(k.parked_why, "junk")),
    "entries of no parked item": lambda c, k, good: (
        c.zadd(k.parked, {"ghost": "-inf", b"\xff\xfe": 0, "far": 1e300, **dict.fromkeys(good, 0)}),
        c.hset(k.parked_why, mapping={"ghost": "target:list", b"\xff": b"\x00", **dict.fromkeys(good, "format:1e400")}),
    ),
    "garbage reasons": lambda c, k, good: c.hset(k.parked_why, mapping=dict.fromkeys(good, b"\x1b[2J\xff")),
}


def set_aside(store: DelayStore, item_id: str) -> bool:
    """Whether ``item_id`` was given back for long (not leased): parked, or deferred for the parking time."""
    item, held = store.get(item_id), store.client.hget(store.keys(store.shard_of(item_id)).leased, item_id)
    late = item is not None and (item.leased_until_ms or 0) > store.server_time_ms() + 20_000
    return late and held is not None and b":deferred:" in held


@pytest.mark.parametrize("garbage", PARKING_GARBAGE)
def test_garbage_in_the_parking_keys_never_stops_the_line(
    valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path, garbage: str
) -> None:
    """Garbage in the parking keys under a real forwarder (only a forwarder role may write
    them): every good item is delivered, items it cannot release are neither delivered nor
    dead-lettered nor counted as attempts, listings work; a key of another type is named in an
    error line with the fix (its items are deferred instead of parked), and entries of items
    that are not parked are dropped at the forwarder's first look."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = store.client
    ids = schedule(store, ITEMS)
    held = [f"rq-{n}" for n in range(SHARDS * 2)]
    store.schedule_many((i, 0, Envelope("rq", "default", b"{}")) for i in held)  # no rq target here
    for shard in range(SHARDS):
        PARKING_GARBAGE[garbage](client, store.keys(shard), [i for i in ids if store.shard_of(i) == shard])
    log = tmp_path / "forwarder.log"
    proc = forward(procs, valkey_url, prefix, log)
    wait_for(lambda: delivered(client) == ids, 30, lambda: f"{len(delivered(client))} delivered\n{procs.tail()}")
    wait_for(lambda: all(set_aside(store, h) for h in held), 30, procs.tail)
    assert proc.poll() is None and store.dead_letters() == []
    assert all((item := store.get(h)) is not None and item.attempts == 0 for h in held), [store.get(h) for h in held]
    assert len(store.scheduled(count=100)) == len(held)  # `delayq list` reads the reasons
    assert sum(s.parked for s in store.stats()) >= 0
    if garbage == "wrong type":
        text = log.read_text(errors="replace")
        wait_for(lambda: f"{store.keys(0).parked} holds another type" in log.read_text(errors="replace"), 10, text)
        assert "RENAME" in log.read_text(errors="replace")
        assert all(store.get(h).parked is None for h in held)  # type: ignore[union-attr]
        return
    parked_ids = {h for h in held if (item := store.get(h)) is not None and item.parked == "target:rq"}
    assert parked_ids == set(held), "items with no target here are parked, whatever else the keys hold"

    def leftovers() -> set[bytes]:
        return {m for s in range(SHARDS) for m in client.zrange(store.keys(s).parked, 0, -1)} - {
            h.encode() for h in held
        }

    kept = {b"far"} if garbage == "entries of no parked item" else set()  # "far": not yet looked at
    wait_for(lambda: leftovers() == kept, 30, lambda: f"stale parked entries left: {leftovers()}")


#: Hostile writes to the periodic registry (entry name -> item id), read by each sync.
PERIODIC_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "wrong type": lambda c, k: (c.delete(k), c.set(k, "junk")),
    "garbage bytes": lambda c, k: c.hset(k, mapping={b"\xff\xfe": b"\x00", "tick": b"\xff\x1b[2J"}),
    "extreme numbers": lambda c, k: c.hset(k, mapping={"1e400": "-inf", "tick": "nan"}),
    "deleted": lambda c, k: c.delete(k),
}


@pytest.mark.parametrize("garbage", PERIODIC_GARBAGE)
def test_garbage_in_the_periodic_registry_never_stops_the_line(
    valkey_server: EmbeddedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    garbage: str,
) -> None:
    """Garbage in the registry, then `celery -A app delayq forward` (which syncs at start) on a
    Redis broker: the entry keeps firing; what sync cannot read is said, naming the key."""
    with _entry_firing_through(valkey_server, tmp_path, monkeypatch, PERIODIC_GARBAGE[garbage], periodic_key) as (
        env,
        store,
    ):
        key = periodic_key(env.prefix)
        if garbage == "extreme numbers":  # a name not in the config: removed by the sync, as any
            assert store.client.hkeys(key) == [b"tick"] and "1 removed" in env.tail()
        elif garbage != "deleted":
            wait_for(lambda: key in env.tail(), 10, env.tail)


@contextmanager
def _entry_firing_through(
    valkey_server: EmbeddedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    write: Callable[[redis.Redis, str], object],
    key_of: Callable[[str], str],
) -> Iterator[tuple[Any, DelayStore]]:
    """An every-second entry synced from `beat_schedule`, ``write`` of garbage into the key
    ``key_of(prefix)``, then `celery -A app delayq forward` (which syncs at start) on a Redis
    broker: yields once the entry has run three times, and checks the forwarder still runs after
    the caller's checks."""
    monkeypatch.setenv("DQT_EVERY", "1")
    env = new_env("redis", f"{valkey_server.url.rsplit('/', 1)[0]}/1", valkey_server)
    env.app_module = "tests.test_celery.periodic_app"
    broker = redis.Redis.from_url(env.broker)
    try:
        app = env.app()
        app.conf.beat_schedule = {"tick": {"task": "dqt.record", "schedule": 1.0, "args": ["tick"]}}
        store = store_for(app)
        sync(app, store)
        write(store.client, key_of(env.prefix))
        env.start_forwarder(tmp_path, via_celery=True)
        wait_for(lambda: broker.llen(env.queue) >= 3, 30, lambda: f"{broker.llen(env.queue)} runs\n{env.tail()}")
        yield env, store
        assert env.launcher.procs[-1].poll() is None
    finally:
        env.stop()
        broker.delete(env.queue)
        delete_prefix(redis.Redis.from_url(env.store), env.prefix)


#: Hostile writes to the code schedule's record (per kind of entry: version, fingerprint, synced_at,
#: host), read by each sync.
_CELERY = "celery-periodic"
CODE_RECORD_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "wrong type": lambda c, k: (c.delete(k), c.set(k, "junk")),
    "garbage bytes": lambda c, k: c.hset(
        k, mapping={f"{_CELERY}:version": b"\xff\x00", f"{_CELERY}:fp": b"\x1b[2J", f"{_CELERY}:host": b"\xfe"}
    ),
    "extreme numbers": lambda c, k: c.hset(k, mapping={f"{_CELERY}:version": "1e400", f"{_CELERY}:synced_at": "-inf"}),
    "deleted": lambda c, k: c.delete(k),
}


@pytest.mark.parametrize("garbage", CODE_RECORD_GARBAGE)
def test_garbage_in_the_code_schedule_record_never_stops_the_line(
    valkey_server: EmbeddedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    garbage: str,
) -> None:
    """Garbage in the record of the code schedule synced last, then `celery -A app delayq forward`
    (which syncs at start) on a Redis broker: the sync is refused naming the key and its fix, the
    entries already stored keep firing. A deleted record is no "any version wins": the
    forwarder's schedule differs from the stored one (its misfire policy), so its sync is refused
    naming the record to restore (one that changes nothing records itself again:
    tests/test_rq/test_trust.py)."""
    with _entry_firing_through(
        valkey_server, tmp_path, monkeypatch, CODE_RECORD_GARBAGE[garbage], periodic_code_key
    ) as (env, store):
        key = periodic_code_key(env.prefix)
        if garbage == "deleted":
            wait_for(
                lambda: f"the record of the code schedule synced last ({key}) is missing" in env.tail(), 10, env.tail
            )
        else:
            wait_for(lambda: f"redis-cli DEL {key}" in env.tail(), 10, env.tail)


#: Hostile writes to the start records of tasks waiting in the store (``ShardKeys.started``):
#: none is a worker's record, so each task still runs, once.
STARTED_GARBAGE: dict[str, Callable[[redis.Redis, str], object]] = {
    "wrong type": lambda c, k: c.hset(k, "x", "y"),
    "garbage bytes": lambda c, k: c.set(k, b"\xff\x00\x1b[2J"),
    "extreme numbers": lambda c, k: c.set(k, "host:1 1e400 -9223372036854775809"),
    "empty": lambda c, k: c.set(k, ""),
}


@pytest.mark.parametrize("garbage", STARTED_GARBAGE)
def test_garbage_start_records_never_stop_the_line(valkey_server: EmbeddedServer, tmp_path: Path, garbage: str) -> None:
    """Garbage planted as the start records of waiting tasks, under a lossless forwarder and a
    worker with dedupe on (kombu's Redis transport): every task runs once; the worker names
    each replaced key. (A deleted record is what a task that never started has.)"""
    env = new_env("redis", f"{valkey_server.url.rsplit('/', 1)[0]}/1", valkey_server)
    env.dedupe = True
    try:
        store = DelayStore.from_url(env.store, prefix=env.prefix, shards=4)
        env.start_worker(tmp_path)
        env.start_forwarder(tmp_path, extra=["--lossless", "--lossless-window", "2"])
        app = env.app()
        ids = [app.send_task("dqt.record", args=[f"t{k}"], countdown=2, queue=env.queue).id for k in range(10)]
        keys_ = [store.keys(store.shard_of(i)).started(i, 0) for i in ids]
        for key in keys_:
            STARTED_GARBAGE[garbage](store.client, key)
        ran = lambda: Counter(r["id"] for r in env.records() if r["tag"].startswith("t"))  # noqa: E731
        wait_for(lambda: set(ran()) == set(ids), 60, lambda: f"{len(ran())} ran\n{env.tail()}")
        wait_for(lambda: all(store.get(i) is None for i in ids), 30, "the forwarder to find them started")
        assert set(ran().values()) == {1}, ran()
        logs = "".join(log.read_text(errors="replace") for log in env.launcher.logs)
        assert all(key in logs for key in keys_), env.tail()
    finally:
        env.stop()
        delete_prefix(redis.Redis.from_url(env.store), env.prefix)
