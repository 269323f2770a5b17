"""The exactly-once hand-off to kombu's Redis transport on the delay store's own server.

The broker here is the store's server and database (the single-Redis deployment): the Celery
target pushes each message onto kombu's queue list and acks it in one MULTI/EXEC. The tests
compare the pushed bytes with kombu's own publish of the same message, break the transaction
before EXEC (a crash, a lost lease, a full server), and SIGKILL real forwarders while a real
worker runs the tasks.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Exchange, Producer, Queue

from delayq_backends import DelayStore
from delayq_backends.celery import CeleryTarget, StoredMessage, forget_store, store_for
from delayq_backends.celery.redis_handoff import RedisHandOff
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.models import Claim
from delayq_backends.store import Lease
from delayq_backends.targets import Delivery
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, new_env

#: kombu's Redis transport options the byte comparison runs under: its defaults, and a global
#: key prefix with ten priority sub-lists joined by ":" (what Celery's docs suggest for priorities).
OPTIONS = {
    "defaults": {},
    "prefix-priorities": {"global_keyprefix": "gk:", "priority_steps": list(range(10)), "sep": ":"},
}


def single_redis(valkey: EmbeddedServer, transport_options: dict[str, Any] | None = None) -> CeleryEnv:
    """A Celery setup whose broker is the store's own server and database."""
    env = new_env("redis", "", valkey)
    env.broker = env.store
    env.transport_options = dict(transport_options or {})
    return env


@pytest.fixture
def env(valkey_server: EmbeddedServer) -> Iterator[CeleryEnv]:
    yield single_redis(valkey_server)


@pytest.fixture
def app(env: CeleryEnv) -> Iterator[Celery]:
    app = env.app()
    yield app
    forget_store(app)


def stored(app: Celery, **options: Any) -> str:
    """A task stored for an hour ahead; returns its id."""
    result = app.send_task("dqt.record", args=["x"], countdown=3600, **options)
    assert store_for(app).get(result.id) is not None
    return str(result.id)


def make_due(app: Celery, task_id: str) -> None:
    assert store_for(app).reschedule(task_id, datetime.now(timezone.utc) - timedelta(seconds=1))


def lists(client: redis.Redis, pattern: str) -> dict[bytes, list[Any]]:
    """Every list whose key matches ``pattern``, with its contents."""
    return {key: client.lrange(key, 0, -1) for key in client.scan_iter(match=pattern) if client.type(key) == b"list"}


def without_tag(raw: bytes) -> tuple[bytes, str]:
    """The message with its delivery tag (kombu draws a uuid per publish) cut out, and the tag."""
    tag = json.loads(raw)["properties"]["delivery_tag"]
    return raw.replace(tag.encode(), b"<tag>"), tag


def claim_all(store: DelayStore, **kwargs: Any) -> list[Claim]:
    return [c for shard in range(store.config.shards) if (c := store.claim(shard, **kwargs)).items]


def deliveries(claim: Claim) -> list[Delivery]:
    return [Delivery(i.id, Envelope.decode(i.envelope), i.attempts, i.ready_ms) for i in claim.items]


def no_ack_outside(store: DelayStore, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Records the ids of every ack the forwarder itself makes (not inside the target's EXEC)."""
    acks: list[list[str]] = []
    real = store.ack_many

    def ack_many(pairs: list[tuple[Claim, list[str]]]) -> list[int | Exception]:
        acks.extend(list(ids) for _, ids in pairs)  # the target's, inside its EXEC, go through ack
        return real(pairs)

    monkeypatch.setattr(store, "ack_many", ack_many)
    return acks


# -- kombu's own publish, byte for byte ---------------------------------------------------------


@pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
@pytest.mark.parametrize("route", ["default", "topic", "expiring"])
def test_the_handoff_pushes_what_kombus_own_publish_pushes(
    valkey_server: EmbeddedServer, options: dict[str, Any], route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's default routing (a direct exchange), a topic exchange, and a queue with
    ``x-expires`` (kombu adds a PEXPIRE of its lists to the push)."""
    env = single_redis(valkey_server, options)
    app = env.app()
    routes: dict[str, dict[str, Any]] = {
        "default": {},
        "topic": dict(
            queue=Queue(env.queue, Exchange(f"{env.queue}-x", type="topic"), routing_key=f"{env.queue}.#"),
            routing_key=f"{env.queue}.a",
        ),
        "expiring": dict(queue=Queue(env.queue, Exchange(env.queue), env.queue, expires=600)),
    }
    client = redis.Redis.from_url(env.store)
    pattern = f"{options.get('global_keyprefix', '')}{env.queue}*"
    try:
        task_id = stored(app, priority=6, headers={"x_custom": "v"}, reply_to="replies", **routes[route])
        make_due(app, task_id)
        item = store_for(app).get(task_id)
        assert item is not None
        kwargs = StoredMessage.from_envelope(Envelope.decode(item.envelope)).publish_kwargs(ready_ms=item.ready_ms)
        with Connection(env.broker, transport_options=options) as conn:
            Producer(conn.channel(), auto_declare=False).publish(**kwargs)
        native = lists(client, pattern)
        native_ttls = {key: client.pttl(key) > 0 for key in native}
        for key in native:
            client.delete(key)

        acks = no_ack_outside(store_for(app), monkeypatch)
        forwarder = Forwarder(store_for(app), [CeleryTarget.from_url(env.broker, transport_options=options)])
        assert forwarder.run_once() == 1
        assert acks == [[]], "acked inside the hand-off's transaction, not after it"
        handed = lists(client, pattern)
        handed_ttls = {key: client.pttl(key) > 0 for key in handed}
    finally:
        forget_store(app)
        for key in client.scan_iter(match=pattern):
            client.delete(key)
        client.close()
    assert list(native) == list(handed) and len(native) == 1, "the same priority sub-list, same key prefix"
    assert native_ttls == handed_ttls == {key: route == "expiring" for key in native}, "kombu's PEXPIRE, or none"
    if options:
        (key,) = native
        assert key.startswith(b"gk:") and key != b"gk:" + env.queue.encode(), "a prefixed priority sub-list"
    ((ours,),) = handed.values()
    ((theirs,),) = native.values()
    (ours_rest, our_tag), (their_rest, their_tag) = without_tag(ours), without_tag(theirs)
    assert ours_rest == their_rest, "byte for byte, but for the delivery tag"
    assert our_tag != their_tag, "kombu draws a new delivery tag per publish"


def test_a_batch_for_one_queue_is_one_lpush_in_due_order(app: Celery, env: CeleryEnv) -> None:
    """30 tasks of one queue claimed together: the hand-off's MULTI/EXEC holds one LPUSH of all
    30 (not 30 commands and 30 replies), and a worker popping the list gets them in due order."""
    app.conf.delayq_shards = 1  # one claim takes the whole batch
    ids = [stored(app) for _ in range(30)]
    for n, task_id in enumerate(ids):
        assert store_for(app).reschedule(task_id, datetime.now(timezone.utc) - timedelta(seconds=10 - n / 100))
    client = redis.Redis.from_url(env.store)

    def calls(command: str) -> int:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    before = calls("lpush")
    try:
        assert Forwarder(store_for(app), [CeleryTarget.from_url(env.broker)]).run_once() == 30
        assert calls("lpush") - before == 1
        popped = [json.loads(raw)["headers"]["id"] for raw in reversed(client.lrange(env.queue, 0, -1))]
        assert popped == ids, "the worker's BRPOP order is the due order"
    finally:
        client.delete(env.queue)
        client.close()


def test_a_broker_elsewhere_keeps_publish_then_ack(
    app: Celery, env: CeleryEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another database is another broker: published by kombu, then acked by the forwarder."""
    broker = env.store.rsplit("/", 1)[0] + "/1"
    task_id = stored(app)
    make_due(app, task_id)
    acks = no_ack_outside(store_for(app), monkeypatch)
    forwarder = Forwarder(store_for(app), [CeleryTarget.from_url(broker)])
    assert forwarder.run_once() == 1
    assert acks == [[task_id]]
    client = redis.Redis.from_url(broker)
    assert client.llen(env.queue) == 1
    client.delete(env.queue)
    client.close()


def test_a_broker_elsewhere_gets_kombus_commands_in_one_pipeline(
    app: Celery, env: CeleryEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's messages are encoded without kombu's publish and go out as kombu's batch sends
    them: one LPUSH for the queue, in due order, each message what kombu's publish pushes."""
    broker = env.store.rsplit("/", 1)[0] + "/1"
    app.conf.delayq_shards = 1  # one claim takes the whole batch
    ids = [stored(app, headers={"x_custom": "v"}, reply_to="replies") for _ in range(20)]
    for n, task_id in enumerate(ids):
        assert store_for(app).reschedule(task_id, datetime.now(timezone.utc) - timedelta(seconds=10 - n / 100))
    item = store_for(app).get(ids[0])
    assert item is not None
    kwargs = StoredMessage.from_envelope(Envelope.decode(item.envelope)).publish_kwargs(ready_ms=item.ready_ms)
    client = redis.Redis.from_url(broker)
    try:
        with Connection(broker) as conn:
            Producer(conn.channel(), auto_declare=False).publish(**kwargs)
        (native,) = client.lrange(env.queue, 0, -1)
        client.delete(env.queue)
        before = int(client.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))

        def no_kombu(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("went through kombu's Producer.publish")

        monkeypatch.setattr(Producer, "publish", no_kombu)
        assert Forwarder(store_for(app), [CeleryTarget.from_url(broker)]).run_once() == 20
        assert int(client.info("commandstats")["cmdstat_lpush"]["calls"]) - before == 1
        pushed = list(reversed(client.lrange(env.queue, 0, -1)))
    finally:
        client.delete(env.queue)
        client.close()
    assert [json.loads(raw)["headers"]["id"] for raw in pushed] == ids, "the worker's BRPOP order is the due order"
    assert without_tag(pushed[0])[0] == without_tag(native)[0], "byte for byte, but for the delivery tag"


def test_a_failed_pipeline_to_a_broker_elsewhere_releases_the_batch(app: Celery, env: CeleryEnv) -> None:
    """A pipeline that fails (here a WRONGTYPE: the queue's key holds a string) leaves delivery
    uncertain, as kombu's own batch says: released with no attempt counted, sent once it works."""
    broker = env.store.rsplit("/", 1)[0] + "/1"
    task_id = stored(app)
    make_due(app, task_id)
    client = redis.Redis.from_url(broker)
    client.set(env.queue, "not a list")
    forwarder = Forwarder(store_for(app), [CeleryTarget.from_url(broker)])
    try:
        forwarder.run_once()
        item = store_for(app).get(task_id)
        assert item is not None and item.attempts == 0, "released, not failed"
        client.delete(env.queue)
        make_due(app, task_id)
        wait_for(lambda: forwarder.run_once() == 1, 10, "the released task to be sent")
        assert client.llen(env.queue) == 1 and store_for(app).get(task_id) is None
    finally:
        client.delete(env.queue)
        client.close()


def test_a_kombu_without_the_publish_hook_keeps_publish_then_ack(
    app: Celery, env: CeleryEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu < 5.7 (no publish batches, so no hook to collect its commands): publish, then ack."""
    from kombu.transport.redis import Channel

    monkeypatch.delattr(Channel, "create_publish_batch")
    task_id = stored(app)
    make_due(app, task_id)
    acks = no_ack_outside(store_for(app), monkeypatch)
    assert Forwarder(store_for(app), [CeleryTarget.from_url(env.broker)]).run_once() == 1
    assert acks == [[task_id]]
    client = redis.Redis.from_url(env.broker)
    assert client.llen(env.queue) == 1
    client.delete(env.queue)
    client.close()


def test_no_handoff_for_amqp(rabbitmq_url: str) -> None:
    with Connection(rabbitmq_url) as conn:
        assert RedisHandOff.for_channel(conn.channel()) is None


# -- both or neither ----------------------------------------------------------------------------


def test_a_crash_before_exec_publishes_nothing(app: Celery, env: CeleryEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forwarder dies with the ack queued and EXEC not sent: no message, the item still
    leased; once the lease runs out it is claimed again and handed off once."""
    store = store_for(app)
    task_id = stored(app)
    make_due(app, task_id)
    client = redis.Redis.from_url(env.broker)
    (claim,) = claim_all(store, lease_ms=300)
    real_ack = Lease.ack

    def ack_then_die(self: Lease, ids: Any = None, *, pipeline: Any = None) -> int:
        real_ack(self, ids, pipeline=pipeline)
        raise KeyboardInterrupt("killed before EXEC")

    monkeypatch.setattr(Lease, "ack", ack_then_die)
    target = CeleryTarget.from_url(env.broker)
    with pytest.raises(KeyboardInterrupt):
        target.publish_claimed(deliveries(claim), Lease(store, claim))
    assert client.llen(env.queue) == 0 and store.get(task_id) is not None
    monkeypatch.undo()
    forwarder = Forwarder(store, [CeleryTarget.from_url(env.broker)])
    wait_for(lambda: forwarder.run_once() == 1, 5, "the lease to run out and the task to be handed off")
    assert client.llen(env.queue) == 1 and store.get(task_id) is None
    client.delete(env.queue)


def test_a_crash_after_exec_leaves_it_published_and_acked(
    app: Celery, env: CeleryEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forwarder dies right after EXEC, before its own bookkeeping: the task is in the broker
    once and gone from the store, so no later forwarder sends it again."""
    store = store_for(app)
    task_id = stored(app)
    make_due(app, task_id)
    client = redis.Redis.from_url(env.broker)
    real_send = RedisHandOff.send

    def send_then_die(self: RedisHandOff, *args: Any) -> None:
        real_send(self, *args)
        raise KeyboardInterrupt("killed after EXEC")

    monkeypatch.setattr(RedisHandOff, "send", send_then_die)
    with pytest.raises(KeyboardInterrupt):
        Forwarder(store, [CeleryTarget.from_url(env.broker)]).run_once()
    monkeypatch.undo()
    assert client.llen(env.queue) == 1 and store.get(task_id) is None
    assert sum(s.scheduled for s in store.stats()) == 0, "nothing left to claim again"
    client.delete(env.queue)


def test_a_lost_lease_publishes_nothing(app: Celery, env: CeleryEnv) -> None:
    """A forwarder that stalled past its lease while another claimed the item publishes nothing."""
    store = store_for(app)
    task_id = stored(app)
    make_due(app, task_id)
    client = redis.Redis.from_url(env.broker)
    (stale,) = claim_all(store, lease_ms=50)
    fresh: list[Claim] = []

    def claimed_again() -> bool:
        fresh.extend(claim_all(store))
        return bool(fresh)

    wait_for(claimed_again, 5, "a second claim")
    target = CeleryTarget.from_url(env.broker)
    report = target.publish_claimed(deliveries(stale), Lease(store, stale))
    assert report.published == report.acked == [] and client.llen(env.queue) == 0
    report = target.publish_claimed(deliveries(fresh[0]), Lease(store, fresh[0]))
    assert report.acked == [task_id] and client.llen(env.queue) == 1 and store.get(task_id) is None
    client.delete(env.queue)


def test_a_lease_change_before_exec_retries_then_gives_up(
    app: Celery, env: CeleryEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another claim on the shard between the read and EXEC (any write to the WATCHed leases)
    aborts the transaction: tried again, and after ``max_watch_retries`` left for a later retry."""
    store = store_for(app)
    task_id = stored(app)
    make_due(app, task_id)
    client = redis.Redis.from_url(env.broker)
    (claim,) = claim_all(store)
    lease = Lease(store, claim)
    real_held = Lease.held
    reads = 0

    def held_then_touched(self: Lease, watching: Any, ids: Any) -> list[str]:
        nonlocal reads
        reads += 1
        client.hset(self.watch_key, "touch", b"x")  # as another forwarder's claim would
        client.hdel(self.watch_key, "touch")
        return real_held(self, watching, ids)

    monkeypatch.setattr(Lease, "held", held_then_touched)
    report = CeleryTarget.from_url(env.broker, max_watch_retries=3).publish_claimed(deliveries(claim), lease)
    assert reads == 3 and report.published == [] and client.llen(env.queue) == 0
    assert [(f.id, f.permanent) for f in report.failed] == [(task_id, False)], "retried later"
    monkeypatch.undo()
    report = CeleryTarget.from_url(env.broker).publish_claimed(deliveries(claim), lease)
    assert report.acked == [task_id] and client.llen(env.queue) == 1
    client.delete(env.queue)


def test_a_full_server_releases_the_batch_then_delivers_it_once() -> None:
    """At maxmemory the LPUSH is refused (OOM): nothing is published or acked, the batch is
    released (attempt not counted), and handed off once memory is back."""
    with EmbeddedServer() as server:
        env = single_redis(server)
        app = env.app()
        store = store_for(app)
        client = redis.Redis.from_url(env.broker)
        target = CeleryTarget.from_url(env.broker)
        try:
            warm = stored(app)  # the target declares its queue (kombu's binding table) once, before the fill
            make_due(app, warm)
            assert Forwarder(store, [target]).run_once() == 1 and client.delete(env.queue) == 1
            ids = [stored(app) for _ in range(5)]
            for task_id in ids:
                make_due(app, task_id)
            claims = claim_all(store)
            client.set("filler", b"x" * 8_000_000)
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 3_000_000)
            for n, claim in enumerate(claims):
                report = target.publish_claimed(deliveries(claim), Lease(store, claim))
                assert report.published == [] and sorted(report.unsent) == sorted(i.id for i in claim.items)
                assert isinstance(report.broker_error, redis.exceptions.OutOfMemoryError)
                if n == 0:  # later ones fail at the declaration, on the new connection
                    assert "LPUSH" in str(report.broker_error), "refused inside the MULTI"
                assert store.release(claim, report.unsent) == len(claim.items)
            assert client.llen(env.queue) == 0
            items = [store.get(task_id) for task_id in ids]
            assert all(i is not None and i.attempts == 0 and i.leased_until_ms is None for i in items), "released"
            client.config_set("maxmemory", 0)
            assert Forwarder(store, [target]).run_once() == 5
            pushed = Counter(json.loads(m)["headers"]["id"] for m in client.lrange(env.queue, 0, -1))
            assert pushed == Counter(ids)
        finally:
            forget_store(app)
            client.close()


# -- real forwarders SIGKILLed, a real worker --------------------------------------------------


@pytest.mark.alone  # SIGKILLs at random points of a timed run
def test_forwarders_killed_at_random_points_run_every_task_once(env: CeleryEnv, app: Celery, tmp_path: Path) -> None:
    count = 600
    at = datetime.now(timezone.utc) + timedelta(seconds=2)
    ids = [app.send_task("dqt.record", args=[f"t{n}"], eta=at).id for n in range(count)]
    store = store_for(app)
    args = [sys.executable, "-m", "delayq_backends.cli", "forward", "--url", env.store, "--prefix", env.prefix]
    args += ["--shards", "4", "--celery-broker", env.broker, "--lease", "1", "--batch", "20", "--poll", "0.1"]
    rng = random.Random(11)
    kills = 0
    try:
        env.start_worker(tmp_path)
        time.sleep(max(0.0, (at - datetime.now(timezone.utc)).total_seconds()))  # all due: work for the forwarder

        def remaining() -> int:
            return sum(s.scheduled for s in store.stats())

        deadline = time.monotonic() + 120
        while (left := remaining()) and time.monotonic() < deadline:
            proc = env.start(args, f"forwarder-{kills}", tmp_path)
            wait_for(lambda n=left, p=proc: remaining() < n or p.poll() is not None, 60, "the forwarder at work")
            time.sleep(rng.uniform(0, 0.05))
            proc.kill()
            proc.wait()
            kills += 1
        assert remaining() == 0, "the forwarders did not finish"
        broker = redis.Redis.from_url(env.broker)
        wait_for(lambda: len(env.records()) >= count, 60, "the worker to run every task")
        # a duplicate would still wait in the queue or sit prefetched (kombu's unacked hash)
        wait_for(lambda: broker.llen(env.queue) == 0 and broker.hlen("unacked") == 0, 30, "the queue to drain")
        runs = Counter(r["id"] for r in env.records())
    except BaseException:
        print(env.tail())
        raise
    finally:
        env.stop()
    assert set(runs) == set(ids), "every task ran"
    assert max(runs.values()) == 1, f"duplicates after {kills} kills: {[i for i, n in runs.items() if n > 1]}"
    assert kills >= 3, "too few kills to mean anything"
