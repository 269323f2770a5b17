"""Prometheus metrics: a real `delayq forward --metrics-port` and a real `delayq exporter`,
scraped over HTTP after a known run; the counters' attribution and back-pressure in process."""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from delayq_backends import DelayStore, Envelope
from delayq_backends.acl import acl_setuser
from delayq_backends.cli import main
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer, free_port
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import slot_holds_key, slot_limit_key, slot_waiting_key
from delayq_backends.metrics import (
    OTHER,
    UNATTRIBUTED,
    ForwarderMetrics,
    GroupCollector,
    LabelBounds,
    SlotCollector,
    StoreCollector,
    attribute,
)
from delayq_backends.store import SlotAsk
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, Proc, make_store
from tests.helpers import wait_for

CORRUPT = b"DQ\x00garbage"  # starts like an envelope, so the store accepts it; no format 0 exists
FAR = 4_000_000_000  # epoch seconds in 2096: never due during a test
SHARDS = 4
GAUGES = {
    "delayq_scheduled": "scheduled",
    "delayq_due": "due",
    "delayq_leased": "leased",
    "delayq_dead": "dead",
    "delayq_parked": "parked",
}


# -- helpers ----------------------------------------------------------------------------------


def scrape(port: int, timeout: float = 5) -> list[Sample] | None:
    """Every sample at the endpoint, or None while nothing listens there yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The one sample named ``name`` whose labels are exactly ``labels``."""
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) <= 1, f"{name}{labels} appears {len(found)} times"
    return found[0] if found else None


def total(samples: list[Sample], name: str) -> float:
    return sum(s.value for s in samples if s.name == name)


def by_label(samples: list[Sample], name: str) -> dict[tuple[str, str], float]:
    return {(s.labels["target"], s.labels["queue"]): s.value for s in samples if s.name == name}


def assert_gauges_match(samples: list[Sample], store: DelayStore, prefix: str) -> None:
    """Per-shard gauges equal the store's own counts (read just after, on a store at rest)."""
    for s in store.stats():
        shard = {"prefix": prefix, "shard": str(s.shard)}
        for gauge, attr in GAUGES.items():
            assert value(samples, gauge, **shard) == getattr(s, attr), (gauge, s)


def scraped_forwarder(
    procs: Launcher, args: list[str], acked: int, dead: int, timeout: float, no_target: int = 0
) -> list[Sample]:
    """Run ``delayq forward ARGS --metrics-port P`` and scrape it until it has acked,
    dead-lettered and deferred for want of a target at least that many items; the samples of
    that scrape."""
    port = free_port()
    proc = procs.delayq("forward", *args, "--metrics-port", str(port))
    listening(proc, port)
    samples: list[Sample] = []

    def settled() -> bool:
        samples[:] = scrape(port) or []
        return (
            total(samples, "delayq_acked_total") >= acked
            and total(samples, "delayq_dead_lettered_total") >= dead
            and total(samples, "delayq_no_target_total") >= no_target
        )

    wait_for(settled, timeout, lambda: f"{acked} acked, {dead} dead, have {by_label(samples, 'delayq_acked_total')}")
    return samples


def listening(proc: Proc, port: int) -> list[Sample]:
    """Wait for ``proc`` to serve its metrics; fail with its stderr if it died first."""
    found: list[list[Sample]] = []

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "died"
        samples = scrape(port)
        if samples is not None:
            found.append(samples)
        return samples is not None

    wait_for(up, 20, f"metrics on port {port}", interval=0.05)
    return found[-1]


def stop(procs: Launcher, proc: Proc) -> None:
    """SIGTERM: the process must exit cleanly."""
    assert procs.stop(proc) == 0, Launcher.output(proc)


# -- the forwarder's endpoint -----------------------------------------------------------------


def test_forwarder_counters_after_a_known_run(valkey_url: str, prefix: str, procs: Launcher) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    client = connect(valkey_url)
    list_a, list_b = f"{prefix}:a", f"{prefix}:b"
    now = store.server_time_ms() / 1000
    store.schedule_many(
        [(f"a-{i}", now - 1 + i / 100, RedisListTarget.envelope(list_a, b"x")) for i in range(30)]
        + [(f"b-{i}", now - 1, RedisListTarget.envelope(list_b, b"y")) for i in range(20)]
        # no celery target in this forwarder: parked for one that has it, never an attempt
        + [(f"c-{i}", now - 1, Envelope("celery", "celery-q", b"z")) for i in range(5)]
        + [(f"bad-{i}", now - 1, CORRUPT) for i in range(3)]  # dead at once
        + [(f"far-{i}", FAR + i, RedisListTarget.envelope(list_a, b"later")) for i in range(7)]
    )
    samples = scraped_forwarder(
        procs,
        ["--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--max-attempts", "2",
         "--log-level", "error", "--metrics-queue", list_a, "--metrics-queue", list_b],
        acked=50, dead=3, timeout=30, no_target=5,
    )  # fmt: skip

    list_a_, list_b_ = ("list", list_a), ("list", list_b)
    assert by_label(samples, "delayq_forwarded_total") == {list_a_: 30, list_b_: 20}
    assert by_label(samples, "delayq_acked_total") == {list_a_: 30, list_b_: 20}
    # neither a celery target nor the queue celery-q is configured here: both are labelled "other"
    assert value(samples, "delayq_no_target_total", target="other") == 5
    assert by_label(samples, "delayq_parked_total") == {("other", "other"): 5}
    assert by_label(samples, "delayq_deferred_total") == {}
    assert total(samples, "delayq_retried_total") == 0
    assert by_label(samples, "delayq_dead_lettered_total") == {("(corrupt)", "(corrupt)"): 3}
    assert total(samples, "delayq_released_total") == 0
    assert by_label(samples, "delayq_lateness_seconds_count") == {list_a_: 30, list_b_: 20}
    assert value(samples, "delayq_lateness_seconds_bucket", target="list", queue=list_b, le="+Inf") == 20
    # ready 1 s ago at scheduling: each was at least that late (minus the clock's ms rounding)
    assert value(samples, "delayq_lateness_seconds_sum", target="list", queue=list_b) >= 20 * 0.99
    assert value(samples, "delayq_claim_seconds_count") >= 1
    assert value(samples, "delayq_store_up", prefix=prefix) == 1
    assert client.llen(list_a) == 30 and client.llen(list_b) == 20
    assert_gauges_match(samples, store, prefix)
    assert sum(s.dead for s in store.stats()) == 3 and sum(s.scheduled for s in store.stats()) == 12
    stop(procs, procs.procs[-1])


def test_item_data_cannot_grow_the_series(valkey_url: str, prefix: str, procs: Launcher) -> None:
    """500 distinct queues written straight into the store: the forwarder's counters keep one
    series per configured queue plus "other", which holds the sum of the rest."""
    store = make_store(valkey_url, prefix, shards=SHARDS)
    known, rated = f"{prefix}:known", f"{prefix}:rated"
    now = store.server_time_ms() / 1000
    store.schedule_many(
        [(f"x-{i}", now - 1, RedisListTarget.envelope(f"{prefix}:q{i}", b"x")) for i in range(500)]
        + [(f"k-{i}", now - 1, RedisListTarget.envelope(known, b"k")) for i in range(7)]
        + [(f"r-{i}", now - 1, RedisListTarget.envelope(rated, b"r")) for i in range(3)]
        + [(f"t-{i}", now - 1, Envelope(f"target-{i}", known, b"t")) for i in range(20)]  # 20 unknown targets
    )
    samples = scraped_forwarder(
        procs,
        ["--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--max-attempts", "1",
         "--log-level", "error", "--metrics-queue", known, "--rate", f"{rated}=1000/s"],
        acked=510, dead=0, timeout=60, no_target=20,
    )  # fmt: skip
    assert by_label(samples, "delayq_forwarded_total") == {("list", OTHER): 500, ("list", known): 7, ("list", rated): 3}
    assert by_label(samples, "delayq_acked_total") == {("list", OTHER): 500, ("list", known): 7, ("list", rated): 3}
    assert by_label(samples, "delayq_parked_total") == {(OTHER, known): 20}
    assert by_label(samples, "delayq_deferred_total") == {}
    assert {s.labels["target"] for s in samples if s.name == "delayq_no_target_total"} == {OTHER}
    labelled = {(s.labels["target"], s.labels["queue"]) for s in samples if "queue" in s.labels}
    assert labelled <= {("list", OTHER), ("list", known), ("list", rated), (OTHER, known)}
    assert len(samples) < 200  # was one series per queue and metric: thousands
    stop(procs, procs.procs[-1])


def test_label_bounds() -> None:
    fixed = LabelBounds(["a", "b"], ["list", "rq"])
    assert fixed(("list", "a")) == ("list", "a")
    assert fixed(("celery", "zzz")) == (OTHER, OTHER)
    assert fixed(("(corrupt)", "(corrupt)")) == ("(corrupt)", "(corrupt)") and fixed(UNATTRIBUTED) == UNATTRIBUTED
    capped = LabelBounds(max_queues=2, max_targets=1)  # library use without configured queues
    assert [capped(("list", q)) for q in ("a", "b", "c", "a")] == [("list", "a"), ("list", "b"), ("list", OTHER),
                                                                     ("list", "a")]  # fmt: skip
    assert capped(("rq", "a")) == (OTHER, "a")


def test_a_taken_metrics_port_is_one_clean_error(valkey_url: str, prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main, ["exporter", "--url", valkey_url, "--prefix", prefix, "--shards", "4", "--port", str(port)]
        )
    assert result.exit_code == 1, result.output
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.output and "Traceback" not in result.output


# -- the standalone exporter ------------------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, so the test may kill it."""
    with EmbeddedServer() as server:
        yield server


def test_exporter_serves_the_gauges_and_outlives_its_store(
    own_server: EmbeddedServer, prefix: str, procs: Launcher
) -> None:
    url = own_server.url
    store = make_store(url, prefix, shards=SHARDS, max_attempts=1)
    now = store.server_time_ms() / 1000
    store.schedule_many(
        [(f"due-{i}", now - 5, RedisListTarget.envelope("out", b"x")) for i in range(10)]
        + [(f"far-{i}", FAR, RedisListTarget.envelope("out", b"x")) for i in range(6)]
        + [(f"bad-{i}", now - 5, CORRUPT) for i in range(3)]
    )
    # one dead letter: bad-0 sorts first among its shard's items due at the same time
    Forwarder(store, [], batch=1).deliver(store.claim(store.shard_of("bad-0"), limit=1))
    store.claim(store.shard_of("due-0"), limit=2)  # two leased, never acked
    port = free_port()
    proc = procs.delayq("exporter", "--url", url, "--prefix", prefix, "--shards", str(SHARDS), "--port", str(port))
    samples = listening(proc, port)
    assert_gauges_match(samples, store, prefix)
    counts = store.stats()
    assert (sum(s.dead for s in counts), sum(s.due for s in counts), sum(s.leased for s in counts)) == (1, 10, 2)
    overdue = max(value(samples, "delayq_oldest_overdue_seconds", prefix=prefix, shard=str(k)) or 0 for k in range(4))
    assert 4.5 <= overdue < 60
    assert value(samples, "delayq_store_up", prefix=prefix) == 1
    assert value(samples, "delayq_store_scrape_errors_total", prefix=prefix) == 0
    assert total(samples, "delayq_forwarded_total") == 0, "the exporter serves gauges only"

    assert own_server.process is not None
    own_server.process.send_signal(signal.SIGSTOP)  # a store that hangs instead of refusing
    try:
        started = time.monotonic()
        hung = scrape(port, timeout=30)
        assert hung is not None and value(hung, "delayq_store_up", prefix=prefix) == 0
        assert time.monotonic() - started < 9, "a hung store must not stall a scrape past Prometheus's 10 s"
    finally:
        own_server.process.send_signal(signal.SIGCONT)
    back = scrape(port)
    assert back is not None and value(back, "delayq_store_up", prefix=prefix) == 1

    own_server.kill()
    for errors in (2, 3):  # it keeps serving, and says so on every scrape
        down = scrape(port)
        assert down is not None and proc.poll() is None
        assert value(down, "delayq_store_up", prefix=prefix) == 0
        assert value(down, "delayq_store_scrape_errors_total", prefix=prefix) == errors
        assert [s for s in down if s.name in GAUGES] == []
    stop(procs, proc)


# -- in process -------------------------------------------------------------------------------


def test_set_backpressure_shows_paused_and_resumed_per_queue() -> None:
    metrics = ForwarderMetrics()
    get = metrics.registry.get_sample_value
    celery_default = {"target": "celery", "queue": "default"}
    metrics.set_backpressure("celery", "default", True)
    metrics.set_backpressure("rq", "low", False)
    assert get("delayq_backpressure", celery_default) == 1
    assert get("delayq_backpressure", {"target": "rq", "queue": "low"}) == 0
    metrics.set_backpressure("celery", "default", False)
    assert get("delayq_backpressure", celery_default) == 0
    other = ForwarderMetrics().registry.get_sample_value("delayq_backpressure", celery_default)
    assert other is None, "two ForwarderMetrics share a registry"


def test_released_items_are_counted_by_queue(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=1)
    now = store.server_time_ms() / 1000
    store.schedule_many([(f"r-{i}", now - 1, RedisListTarget.envelope("q:r", b"x")) for i in range(4)])
    broker = redis.Redis(port=free_port(), socket_connect_timeout=0.2)  # nothing listens: an outage
    metrics = ForwarderMetrics()
    forwarder = Forwarder(store, [RedisListTarget(broker)], metrics=metrics, max_outage_backoff=0.01)
    forwarder.deliver(store.claim(0, limit=10))
    get = metrics.registry.get_sample_value
    assert get("delayq_released_total", {"target": "list", "queue": "q:r"}) == 4
    assert get("delayq_forwarded_total", {"target": "list", "queue": "q:r"}) is None
    assert store.stats()[0].leased == 0 and store.stats()[0].due == 4


def test_a_shortfall_is_pinned_on_a_queue_only_when_there_is_one() -> None:
    a, b = ("list", "a"), ("list", "b")
    assert attribute([a, a, b], 3) == {a: 2, b: 1}
    assert attribute([a, a], 1) == {a: 1}
    assert attribute([a, b], 1) == {UNATTRIBUTED: 1}
    assert attribute([a, b], 0) == {}


def test_celery_delayq_forward_takes_the_metrics_options_too() -> None:
    from delayq_backends.cli.celery import delayq as celery_delayq

    flags = {flag for p in celery_delayq.commands["forward"].params for flag in p.opts}
    assert {"--metrics-port", "--metrics-host"} <= flags


# -- concurrency slots ------------------------------------------------------------------------


def parsed(registry: CollectorRegistry) -> list[Sample]:
    """One scrape of ``registry``, as Prometheus would parse it."""
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def fill_slots(store: DelayStore) -> None:
    """Slot keys of known counts, and garbage in others' keys (a hand write of each kind).

    busy: limit 2, 2 running and 4 waiting; k}odd: 1 and 2; limited: a runtime limit only;
    one-0..one-4: 1 running each; a key whose name holds a quote and a backslash (hand-made,
    1 running); junk-*: holds, line and limit of the wrong type or value.
    """
    asks = {
        "busy": SlotAsk(2, [(f"b{i}", i) for i in range(6)]),
        "k}odd": SlotAsk(1, [("a", 0), ("b", 1), ("c", 2)]),
        **{f"one-{i}": SlotAsk(1, [("x", 0)]) for i in range(5)},
    }
    store.take_slots(asks, hold_ms=600_000, wait_ms=600_000)
    store.set_slot_limit("limited", 7)
    prefix, client = store.config.prefix, store.client
    client.zadd(slot_holds_key(prefix, 'we"ird\\key'), {"m": store.server_time_ms() + 600_000})
    client.set(slot_holds_key(prefix, "junk-holds"), "not a sorted set")
    client.hset(slot_waiting_key(prefix, "junk-line"), "a", "1")
    client.set(slot_limit_key(prefix, "junk-limit"), "lots")


def test_exporter_serves_the_busiest_slot_keys_and_totals_over_all(
    valkey_url: str, prefix: str, procs: Launcher
) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    store.check_meta()
    fill_slots(store)
    port = free_port()
    args = ("--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--port", str(port), "--slot-keys", "3")
    samples = listening(procs.delayq("exporter", *args), port)

    named = {s.labels["key"]: s.value for s in samples if s.name == "delayq_slots_in_use"}
    waiting = {s.labels["key"]: s.value for s in samples if s.name == "delayq_slot_waiting"}
    # the 3 busiest by running + waiting: busy (6), k}odd (3), then the first by name of those with 1
    assert named == {"busy": 2, "k}odd": 1, "one-0": 1}
    assert waiting == {"busy": 4, "k}odd": 2, "one-0": 0}
    assert value(samples, "delayq_slot_limit", prefix=prefix, key="busy") is None, "the items' own limit is not set"
    # busy, k}odd, limited, one-0..4, we"ird\key and the 3 junk keys (junk reads as empty)
    assert value(samples, "delayq_slot_keys", prefix=prefix) == 12
    assert value(samples, "delayq_slots_in_use_all_keys", prefix=prefix) == 2 + 1 + 5 + 1
    assert value(samples, "delayq_slot_waiting_all_keys", prefix=prefix) == 4 + 2
    assert value(samples, "delayq_slots_up", prefix=prefix) == 1
    assert value(samples, "delayq_store_up", prefix=prefix) == 1

    off = free_port()
    args = ("--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--port", str(off), "--slot-keys", "0")
    without = listening(procs.delayq("exporter", *args), off)
    assert value(without, "delayq_store_up", prefix=prefix) == 1
    assert [s.name for s in without if "slot" in s.name] == [], "--slot-keys 0: no slot gauges"


def test_slot_gauges_name_a_limit_and_odd_keys_and_list_keys_once_per_ttl(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    fill_slots(store)
    collector = SlotCollector(store, max_keys=50, key_ttl=3600)
    registry = CollectorRegistry()
    registry.register(collector)
    samples = parsed(registry)
    assert value(samples, "delayq_slot_limit", prefix=prefix, key="limited") == 7
    assert value(samples, "delayq_slots_in_use", prefix=prefix, key='we"ird\\key') == 1, "escaped and parsed back"
    for junk in ("junk-holds", "junk-line", "junk-limit"):
        assert value(samples, "delayq_slots_in_use", prefix=prefix, key=junk) == 0
        assert value(samples, "delayq_slot_limit", prefix=prefix, key=junk) is None

    store.take_slots({"new": SlotAsk(1, [("n", 0)])}, hold_ms=600_000, wait_ms=600_000)
    store.give_back_slots({"one-0": ["x"]})  # a key with no line: its slot is free again
    get = registry.get_sample_value
    assert get("delayq_slots_in_use", {"prefix": prefix, "key": "one-0"}) == 0, "counts are read on every scrape"
    assert get("delayq_slots_in_use", {"prefix": prefix, "key": "new"}) is None, "the key list waits for its ttl"
    collector.keys.forget()
    assert get("delayq_slots_in_use", {"prefix": prefix, "key": "new"}) == 1


def test_a_user_without_scan_gets_no_slot_gauges_and_the_store_gauges_still(valkey_url: str, prefix: str) -> None:
    """A user with the ``reader`` role's rules but no SCAN or GET (the role before they were
    added): the slot gauges say so (``delayq_slots_up 0``, an error counted) and the shard
    gauges are served as before. The ``reader`` role itself serves them (``delayq_slots_up 1``)."""
    admin = connect(valkey_url)
    name, password = f"reader-{prefix[-8:]}", "pw-0123456789"
    rules = [r for r in acl_setuser(name, prefix, "reader", password=password) if not r.startswith("(")]
    admin.execute_command(*rules, "-scan")
    role = f"role-{prefix[-8:]}"
    admin.execute_command(*acl_setuser(role, prefix, "reader", password=password))
    try:
        port = connect(valkey_url).connection_pool.connection_kwargs["port"]
        as_role = CollectorRegistry()
        as_role.register(
            SlotCollector(make_store(f"redis://{role}:{password}@127.0.0.1:{port}/0", prefix, shards=SHARDS))
        )
        assert value(parsed(as_role), "delayq_slots_up", prefix=prefix) == 1
        make_store(valkey_url, prefix, shards=SHARDS).check_meta()
        reader = make_store(f"redis://{name}:{password}@127.0.0.1:{port}/0", prefix, shards=SHARDS)
        registry = CollectorRegistry()
        registry.register(StoreCollector(reader))
        registry.register(SlotCollector(reader))
        for scrapes in (1, 2):
            samples = parsed(registry)
            assert value(samples, "delayq_store_up", prefix=prefix) == 1
            assert value(samples, "delayq_scheduled", prefix=prefix, shard="0") == 0
            assert value(samples, "delayq_slots_up", prefix=prefix) == 0
            assert value(samples, "delayq_slot_scrape_errors_total", prefix=prefix) == scrapes
            assert [s for s in samples if s.name.startswith(("delayq_slots_in_use", "delayq_slot_keys"))] == []
        with pytest.raises(redis.exceptions.NoPermissionError):  # no GET: the limit is unknown, not "none"
            reader.slot_status("k")
    finally:
        admin.execute_command("ACL", "DELUSER", name, role)


# -- groups -----------------------------------------------------------------------------------


def fill_groups(store: DelayStore) -> None:
    """55 groups with items running and a policy or two, and groups with a policy only.

    big: 5 running, limit 5, rate 600/m, weight 3; mid: 3 running, paused; "(other)": 2 running
    (a group named like the sums); t-00..t-52: 1 running each, t-01 throttled by a worker, t-02
    limit 4 and rate 2/s; quiet: a limit of 2 only.
    """
    asks = {
        "big": SlotAsk(5, [(f"b{i}", i) for i in range(5)]),
        "mid": SlotAsk(3, [(f"m{i}", i) for i in range(3)]),
        "(other)": SlotAsk(2, [("o1", 0), ("o2", 1)]),
        **{f"t-{i:02d}": SlotAsk(1, [("x", 0)]) for i in range(53)},
    }
    store.take_slots(asks, hold_ms=600_000, wait_ms=600_000)
    store.set_group("big", limit=5, rate="600/m", weight=3)
    store.pause_group("mid")
    store.throttle_group("t-01", 60, by="429")
    store.set_group("t-02", limit=4, rate="2/s")
    store.set_group("quiet", limit=2)


def test_exporter_names_the_busiest_groups_and_sums_the_rest_under_other(
    valkey_url: str, prefix: str, procs: Launcher
) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    store.check_meta()
    fill_groups(store)
    port = free_port()
    args = ("--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--port", str(port), "--groups", "3")
    samples = listening(procs.delayq("exporter", *args), port)

    def series(name: str) -> dict[str, float]:
        return {s.labels["group"]: s.value for s in samples if s.name == name}

    # the 3 busiest by running + parked: big (5), mid (3), then ("(other)" is never named) the
    # first by name of those with 1; the group named "(other)" counts in the sums
    assert series("delayq_group_running") == {"big": 5, "mid": 3, "t-00": 1, "(other)": 52 + 2}
    assert series("delayq_group_parked") == {"big": 0, "mid": 0, "t-00": 0, "(other)": 0}
    assert series("delayq_group_limit") == {"big": 5, "(other)": 4 + 2}, "summed over the others that have one"
    assert series("delayq_group_rate") == {"big": 10, "(other)": 2}, "items per second"
    assert series("delayq_group_weight") == {"big": 3}, "no other group has a weight: no (other) series"
    assert series("delayq_group_paused") == {"big": 0, "mid": 1, "t-00": 0, "(other)": 0}
    assert series("delayq_group_throttled") == {"big": 0, "mid": 0, "t-00": 0, "(other)": 1}
    assert value(samples, "delayq_groups", prefix=prefix) == 3 + 53 + 1
    assert value(samples, "delayq_groups_up", prefix=prefix) == 1
    assert sum(series("delayq_group_running").values()) == 5 + 3 + 2 + 53, "the series sum to the store's total"

    off = free_port()
    args = ("--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--port", str(off), "--groups", "0")
    without = listening(procs.delayq("exporter", *args), off)
    assert value(without, "delayq_store_up", prefix=prefix) == 1
    assert [s.name for s in without if "group" in s.name] == [], "--groups 0: no group gauges"


def test_group_gauges_read_counts_every_scrape_and_list_groups_once_per_ttl(valkey_url: str, prefix: str) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    store.take_slots({"a": SlotAsk(2, [("x", 0), ("y", 1)])}, hold_ms=600_000, wait_ms=600_000)
    collector = GroupCollector(store, max_groups=50, key_ttl=3600)
    registry = CollectorRegistry()
    registry.register(collector)
    get = registry.get_sample_value
    assert get("delayq_group_running", {"prefix": prefix, "group": "a"}) == 2
    assert get("delayq_group_running", {"prefix": prefix, "group": "(other)"}) is None, "no others: no sums"
    store.give_back_slots({"a": ["x"]})
    store.pause_group("a")
    store.set_group("new", limit=1)
    assert get("delayq_group_running", {"prefix": prefix, "group": "a"}) == 1, "counts are read on every scrape"
    assert get("delayq_group_paused", {"prefix": prefix, "group": "a"}) == 1
    assert get("delayq_group_limit", {"prefix": prefix, "group": "new"}) is None, "the group list waits for its ttl"
    collector.keys.forget()
    assert get("delayq_group_limit", {"prefix": prefix, "group": "new"}) == 1


def test_a_user_without_scan_gets_no_group_gauges_and_the_store_gauges_still(valkey_url: str, prefix: str) -> None:
    admin = connect(valkey_url)
    name, password = f"noscan-{prefix[-8:]}", "pw-0123456789"
    admin.execute_command(*acl_setuser(name, prefix, "reader", password=password), "-scan")
    try:
        make_store(valkey_url, prefix, shards=SHARDS).check_meta()
        port = connect(valkey_url).connection_pool.connection_kwargs["port"]
        reader = make_store(f"redis://{name}:{password}@127.0.0.1:{port}/0", prefix, shards=SHARDS)
        registry = CollectorRegistry()
        registry.register(StoreCollector(reader))
        registry.register(GroupCollector(reader))
        for scrapes in (1, 2):
            samples = parsed(registry)
            assert value(samples, "delayq_store_up", prefix=prefix) == 1
            assert value(samples, "delayq_groups_up", prefix=prefix) == 0
            assert value(samples, "delayq_group_scrape_errors_total", prefix=prefix) == scrapes
            assert [s for s in samples if s.name.startswith(("delayq_group_running", "delayq_groups"))] == [
                s for s in samples if s.name == "delayq_groups_up"
            ]
    finally:
        admin.execute_command("ACL", "DELUSER", name)
