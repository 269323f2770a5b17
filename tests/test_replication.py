"""Replicas and failover: the durable-write option (WAIT) and a primary killed mid-run on a
3-master, 3-replica Redis Cluster. Real servers only."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
import redis
from celery import Celery
from redis.exceptions import RedisClusterException

from delayq_backends import Config, DelayqError, DelayStore, NotDurableError
from delayq_backends.celery import forget_store, install, store_for
from delayq_backends.connection import connect
from delayq_backends.dedupe import RunGuard, Verdict
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness.servers import SYNC_AT_ONCE
from tests.helpers import wait_for


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    with EmbeddedServer(args=SYNC_AT_ONCE) as primary:
        replica = EmbeddedServer(args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
        try:
            info = redis.Redis(port=replica.port)
            wait_for(lambda: info.info("replication").get("master_link_status") == "up", 20, "the replica to sync")
            yield primary, replica
        finally:
            replica.stop()


def test_durable_writes_wait_for_the_replica(primary_and_replica: tuple[EmbeddedServer, EmbeddedServer]) -> None:
    primary, replica = primary_and_replica
    prefix = f"d{uuid.uuid4().hex[:8]}"
    store = DelayStore(
        connect(primary.url), Config(prefix=prefix, shards=4, durable_replicas=1, durable_timeout_ms=300)
    )
    store.schedule_many((f"i{n}", 60, RedisListTarget.envelope("out", b"x")) for n in range(100))
    on_replica = DelayStore(connect(replica.url), Config(prefix=prefix, shards=4))
    assert sum(s.scheduled for s in on_replica.stats()) == 100, "acknowledged means on the replica too"
    assert store.cancel("i0") and store.reschedule("i1", 120)

    replica.kill()
    started = time.monotonic()
    with pytest.raises(NotDurableError, match="confirmed by 0 of 1 replicas within 300 ms"):
        store.schedule("lonely", 60, RedisListTarget.envelope("out", b"x"))
    assert time.monotonic() - started < 3
    assert store.exists("lonely"), "it is on the primary: retrying is safe, scheduling is idempotent by id"
    envelope = RedisListTarget.envelope("out", b"x")
    item = store.get("i2")
    assert item is not None
    for write in (  # every other producer path waits too (issue 21, finding 5)
        lambda: store.debounce("k", 60, envelope),
        lambda: store.replace_if("i2", item.envelope, 90, envelope),  # a periodic sync
        lambda: store.schedule_many([("bulk", 60, envelope)]),  # the Spark loader's path
    ):
        with pytest.raises(NotDurableError):
            write()
    plain = DelayStore(connect(primary.url), Config(prefix=prefix, shards=4))
    plain.schedule("fast", 60, RedisListTarget.envelope("out", b"x"))  # without the option, no waiting


def test_a_start_record_waits_for_the_replica(primary_and_replica: tuple[EmbeddedServer, EmbeddedServer]) -> None:
    """Dedupe's start record under durable_replicas: written on the shard's node with a WAIT, so
    a run counted as started is on the replica; with the replica gone it is unchecked (runs,
    at-least-once), not falsely confirmed."""
    primary, replica = primary_and_replica
    prefix = f"d{uuid.uuid4().hex[:8]}"
    config = Config(prefix=prefix, shards=4, durable_replicas=1, durable_timeout_ms=300)
    guard = RunGuard(DelayStore(connect(primary.url), config), ttl_ms=60_000, wait_ms=800)
    on_replica = redis.Redis.from_url(replica.url)
    for n in range(20):
        decision = guard.start(f"task-{n}", 0)
        assert decision.verdict is Verdict.FIRST and on_replica.exists(decision.key), "started means replicated"
    replica.kill()
    started = time.monotonic()
    assert guard.start("lonely", 0).verdict is Verdict.UNCHECKED
    assert 0.7 < time.monotonic() - started < 5


def test_an_rq_workers_retry_waits_for_the_replica(
    primary_and_replica: tuple[EmbeddedServer, EmbeddedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job failing with Retry(interval=…) is scheduled on the pipeline RQ's worker executes:
    with durable_replicas a WAIT follows that EXEC (RQ's own SimpleWorker, its retry path)."""
    from rq import Retry, SimpleWorker

    from delayq_backends.rq import Queue

    primary, replica = primary_and_replica
    prefix = f"r{uuid.uuid4().hex[:8]}"
    for name, value in {"DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4", "DELAYQ_DURABLE_REPLICAS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    conn = redis.Redis.from_url(primary.url)
    queue = Queue(f"{prefix}-q", connection=conn)
    job = queue.enqueue("tests.test_rq.jobs.always_fails", "x", retry=Retry(max=1, interval=600))
    waits = lambda: int(conn.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))  # noqa: E731
    before = waits()
    SimpleWorker([queue], connection=conn, queue_class=Queue).work(burst=True)
    assert queue.delay_store.get(job.id) is not None, "the retry waits in the store"
    assert waits() > before, "a WAIT followed the worker's EXEC"
    on_replica = DelayStore(connect(replica.url), Config(prefix=prefix, shards=4))
    assert on_replica.get(job.id) is not None


def test_a_celery_app_asks_for_durable_writes_through_its_settings(
    primary_and_replica: tuple[EmbeddedServer, EmbeddedServer],
) -> None:
    primary, replica = primary_and_replica
    app = Celery("durable", broker=f"{primary.url.rsplit('/', 1)[0]}/1")
    app.conf.update(
        delayq_url=primary.url,
        delayq_prefix=f"c{uuid.uuid4().hex[:8]}",
        delayq_durable_replicas=1,
        delayq_durable_timeout_ms=300,
    )
    install(app)
    try:
        sent = app.send_task("t.later", countdown=60)
        assert DelayStore(connect(replica.url), store_for(app).config).exists(sent.id), "on the replica when sent"
        replica.kill()
        with pytest.raises(NotDurableError, match="confirmed by 0 of 1 replicas"):
            app.send_task("t.later", countdown=60)
    finally:
        forget_store(app)
        app.close()


def test_a_primary_killed_mid_run_loses_no_durable_schedule() -> None:
    """Producers retry what fails; forwarders ride out MOVED, NOSCRIPT and connection errors."""
    prefix = f"f{uuid.uuid4().hex[:8]}"
    with EmbeddedCluster(masters=3, replicas=1, args=SYNC_AT_ONCE) as cluster:
        config = Config(prefix=prefix, shards=16, durable_replicas=1, durable_timeout_ms=2000, lease_seconds=3)
        producer = DelayStore(connect(cluster.url), config)
        confirmed: set[str] = set()
        retries = Counter[str]()
        inboxes = [CollectingTarget("list") for _ in range(2)]
        forwarders = [
            Forwarder(DelayStore(connect(cluster.url), config), [inbox], poll_interval=0.2, max_outage_backoff=0.5)
            for inbox in inboxes
        ]
        threads = [threading.Thread(target=f.run, kwargs={"install_signals": False}, daemon=True) for f in forwarders]
        for t in threads:
            t.start()

        def produce() -> None:
            """40 batches of 50, one every 0.2 s (so writes span the failover), each due 1 s later."""
            for chunk in range(40):
                paced = time.monotonic() + 0.2
                due = producer.server_time_ms() / 1000 + 1
                batch = [(f"c{chunk}-{n}", due, RedisListTarget.envelope("o", b"x")) for n in range(50)]
                deadline = time.monotonic() + 60
                while True:  # what an application does with a failed write: try again (idempotent)
                    try:
                        producer.schedule_many(batch)
                        break
                    except (redis.RedisError, RedisClusterException, DelayqError) as exc:
                        retries[type(exc).__name__] += 1
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                confirmed.update(item_id for item_id, _, _ in batch)
                time.sleep(max(0.0, paced - time.monotonic()))

        writer = threading.Thread(target=produce, daemon=True)
        writer.start()
        wait_for(lambda: len(confirmed) >= 500 and sum(len(i.ids) for i in inboxes) > 0, 30, "the run to be under way")
        victim, victim_shards = busiest_primary(producer, cluster)
        victim.kill()  # SIGKILL: no shutdown, no last sync
        survivor = redis.Redis(port=next(n for n in cluster.nodes if n is not victim).port)
        wait_for(lambda: failed_over(survivor, victim.port), 30, "the victim to be failed over to its replica")
        before_failover = {i for inbox in inboxes for i in inbox.ids}
        # Until the dead node is back, its promoted replica has no replica of its own, so durable
        # writes to its shards are refused (NotDurableError) and retried. The operator restarts it:
        victim.start()  # it rejoins as a replica of the new primary
        writer.join(90)
        assert not writer.is_alive() and len(confirmed) == 2000

        def delivered() -> Counter[str]:
            return Counter(i for inbox in inboxes for i in inbox.ids)

        def missing() -> str:
            store_state = [(s.scheduled, s.leased) for s in producer.stats()]
            gone, stats = len(confirmed - set(delivered())), [f.stats for f in forwarders]
            return f"every confirmed schedule to be forwarded: {gone} missing, store {store_state}, {stats}"

        wait_for(lambda: confirmed <= set(delivered()), 90, missing)
        for f, t in zip(forwarders, threads):
            assert t.is_alive(), "a forwarder died in the failover"
            f.stop()
        for t in threads:
            t.join(15)
        counts = delivered()
        lost = confirmed - set(counts)
        assert lost == set()
        # the failover really happened mid-run: writes failed and were retried, and the forwarders
        # forwarded items of the victim's shards from its promoted replica. Whether a forwarder
        # sees the dead node as errors of its own is redis-py's to decide: up to 8.1 the cluster
        # client raises ConnectionError, 8.2 retries inside (refreshing the topology) until the
        # replica is promoted, so the forwarders' outage count is reported, not asserted.
        assert sum(retries.values()) > 0
        promoted = {i for i in counts if producer.shard_of(i) in victim_shards} - before_failover
        assert promoted, "no item of the victim's shards was forwarded after the failover"
        duplicates = sum(counts.values()) - len(counts)
        met = sum(f.stats.outages + f.stats.errors for f in forwarders)
        print(
            f"failover run: {len(confirmed)} scheduled, 0 lost, {duplicates} duplicates, retries {dict(retries)}, "
            f"{len(promoted)} forwarded from the promoted replica, forwarder outages+errors {met}"
        )


def failed_over(client: redis.Redis, port: int) -> bool:
    """The node on ``port`` is marked failed and three other primaries serve every slot.

    Restarting a master without persistence *before* this would bring it back empty as the
    owner of its slots, and its replica would resync from it and be wiped: Redis's documented
    pitfall, and the reason the store should run with AOF.
    """
    nodes = client.cluster("nodes")
    dead = [n for address, n in nodes.items() if address.split("@")[0].endswith(f":{port}")]
    serving = [n for n in nodes.values() if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]]
    return bool(dead) and "fail" in dead[0]["flags"].split(",") and len(serving) == 3


def busiest_primary(store: DelayStore, cluster: EmbeddedCluster) -> tuple[EmbeddedServer, set[int]]:
    """The primary holding the most shards (killing it hurts the most), and those shards."""
    ports = {s: store._node_client(s).connection_pool.connection_kwargs["port"] for s in range(store.shards)}
    port = Counter(ports.values()).most_common(1)[0][0]
    return next(node for node in cluster.nodes if node.port == port), {s for s, p in ports.items() if p == port}


@pytest.mark.cluster
def test_sixteen_shards_spread_five_five_six(redis_cluster: EmbeddedCluster) -> None:
    store = DelayStore(connect(redis_cluster.url), Config(prefix=f"s{uuid.uuid4().hex[:8]}", shards=16))
    owners = Counter(store.client.get_node_from_key(store.keys(k).due).name for k in range(16))  # type: ignore[union-attr]
    assert sorted(owners.values()) == [5, 5, 6]


#: Each producer path: a function that schedules one item id (due in a minute) durably on the
#: primary at ``url`` and returns the id, and the store config it wrote with.
Writer = Callable[[str], str]


def _core_writer(url: str, prefix: str) -> tuple[Writer, Config]:
    store = DelayStore(connect(url), Config(prefix=prefix, shards=4, durable_replicas=1, durable_timeout_ms=200))

    def write(item_id: str) -> str:
        store.schedule(item_id, 60, RedisListTarget.envelope("out", b"x"))
        return item_id

    return write, store.config


def _pipeline_writer(url: str, prefix: str) -> tuple[Writer, Config]:
    store = DelayStore(connect(url), Config(prefix=prefix, shards=4, durable_replicas=1, durable_timeout_ms=200))

    def write(item_id: str) -> str:
        with store.client.pipeline(transaction=True) as pipe:  # an adapter's own transaction
            pipe.set(f"{prefix}-job:{item_id}", "x")
            store.schedule(item_id, 60, RedisListTarget.envelope("out", b"x"), pipeline=pipe)
            pipe.execute()
        store.confirm_durable()
        return item_id

    return write, store.config


def _rq_writer(url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Writer, Config]:
    """RQ on the store's own Redis: its enqueue_in writes the job and our entry in one transaction."""
    from delayq_backends.rq import Queue

    for name, value in {"DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4", "DELAYQ_DURABLE_REPLICAS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DELAYQ_DURABLE_TIMEOUT_MS", "200")
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    queue = Queue(f"{prefix}-q", connection=redis.Redis.from_url(url))
    assert queue.delay_store.config.durable_replicas == 1
    return (lambda _: queue.enqueue_in(timedelta(minutes=1), "builtins.print").id), queue.delay_store.config


def _celery_writer(url: str, prefix: str) -> tuple[Writer, Config]:
    app = Celery("durable", broker=f"{url.rsplit('/', 1)[0]}/1")
    app.conf.update(delayq_url=url, delayq_prefix=prefix, delayq_durable_replicas=1, delayq_durable_timeout_ms=200)
    install(app)
    return (lambda _: app.send_task("t.later", countdown=60).id), store_for(app).config


@pytest.mark.parametrize("path", ["core", "pipeline", "rq", "celery"])
def test_a_failover_to_a_replica_cut_off_mid_run_loses_no_acknowledged_write(
    primary_and_replica: tuple[EmbeddedServer, EmbeddedServer], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21, finding 5: with durable_replicas=1, on every producer path, a write either
    returns once the replica has it or raises. The replica is cut off after 30 writes
    (REPLICAOF NO ONE: it keeps what it had, and later writes reach only the primary) and then
    taken as the new primary: every write acknowledged is on it."""
    primary, replica = primary_and_replica
    prefix = f"v{uuid.uuid4().hex[:8]}"
    if path == "rq":
        write, config = _rq_writer(primary.url, prefix, monkeypatch)
    else:
        write, config = {"core": _core_writer, "pipeline": _pipeline_writer, "celery": _celery_writer}[path](
            primary.url, prefix
        )
    acknowledged, refused = [], 0
    for n in range(60):
        if n == 30:
            redis.Redis(port=replica.port).replicaof("NO", "ONE")  # cut off: the failover's new primary
        try:
            acknowledged.append(write(f"w{n}"))
        except NotDurableError:
            refused += 1
    primary.kill()
    promoted = DelayStore(connect(replica.url), replace(config, url=replica.url))
    lost = [item_id for item_id in acknowledged if not promoted.exists(item_id)]
    assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged writes lost"
    assert len(acknowledged) >= 30 and refused >= 25, (len(acknowledged), refused)  # the cut was real
