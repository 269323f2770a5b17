"""Batches with real ``celery worker`` and ``delayq forward`` processes on both brokers: a batch
of 30 sub-jobs (some failing, some retrying, some with a countdown) completes once, after its
last sub-job, with the right counts in the summary its on_complete gets and in the notice."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
from celery import Celery
from celery.app.task import Context
from celery.signals import task_revoked
from redis import Redis

from delayq_backends.celery import BATCH_HEADER, Batch, StoredMessage, forget_store, store_for
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.errors import BatchClosedError, BatchError, ConfigError
from delayq_backends.keys import batch_channel, batch_item_id
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, watched
from tests.test_celery.tasks import make_app


def test_a_batch_of_30_completes_once_with_the_right_summary(celery_env: CeleryEnv, app: Celery) -> None:
    store = store_for(app)
    notices = store.client.pubsub()
    notices.subscribe(batch_channel(store.config.prefix, "order-30"))
    with Batch(app, "order-30", on_complete=app.signature("dqt.batch_done", args=("done",))) as batch:
        ok = [batch.add(app.signature("dqt.record", args=(f"ok{i}",))).id for i in range(14)]
        later = [batch.add(app.signature("dqt.record", args=(f"later{i}",)), countdown=2).id for i in range(6)]
        failing = [batch.add(app.signature("dqt.fail", args=(f"bad{i}",))).id for i in range(6)]
        # each fails once, then succeeds: a retry is not the end, and counts once
        flaky = [batch.add(app.signature("dqt.flaky", args=(f"flaky{i}", 1, 0.5))).id for i in range(4)]
    with pytest.raises(BatchClosedError):
        batch.add(app.signature("dqt.record", args=("late",)))
    done = lambda: [r for r in celery_env.records() if r["tag"] == "done"]  # noqa: E731
    wait_for(lambda: done(), 90, lambda: f"{store.batch_status('order-30')}")
    (record,) = done()
    summary = record["summary"]
    assert summary["batch"] == "order-30"
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (30, 24, 6)
    assert sorted(summary["failed_ids"]) == sorted(failing)
    assert record["id"] == batch_item_id("order-30")
    subs = [r for r in celery_env.records() if r["id"] in {*ok, *later, *failing, *flaky}]
    assert {r["id"] for r in subs} == {*ok, *later, *failing, *flaky}
    assert record["started_ms"] >= max(r["started_ms"] for r in subs)  # after the last sub-job
    status = store.batch_status("order-30")
    assert status is not None and status.completed and (status.total, status.failed) == (30, 6)
    messages = []
    while (m := notices.get_message(timeout=1)) is not None:
        if m["type"] == "message":
            messages.append(json.loads(m["data"]))
    assert messages == [summary]
    assert len(subs) == 30 + 4  # flaky's failed first runs too
    wait_for(lambda: store.get(batch_item_id("order-30")) is None, 10, "on_complete acked")
    assert len(done()) == 1


def test_a_sub_job_is_stored_without_eta_and_a_revoke_counts_as_failed(valkey_url: str, prefix: str) -> None:
    """A sub-job is counted and stored before it can run, with its header; ``task_revoked`` (a
    task revoked or expired: no ``task_postrun``) reports it failed."""
    app = make_app(
        broker="memory://", store=valkey_url, prefix=prefix, queue="q", sink="s", backend="cache+memory://",
        records=valkey_url,
    )  # fmt: skip
    try:
        store = store_for(app)
        batch = Batch(app, "stored")
        sent = batch.add(app.signature("dqt.record", args=("x",)))  # no eta: stored all the same
        stored = store.get(sent.id)
        assert stored is not None
        assert StoredMessage.from_envelope(Envelope.decode(stored.envelope)).headers[BATCH_HEADER] == "stored"
        status = store.batch_status("stored")
        assert status is not None and (status.total, status.done) == (1, 0)
        assert not batch.close()
        request = Context({"id": sent.id, BATCH_HEADER: "stored"})
        task_revoked.send(sender=app.tasks["dqt.record"], request=request, terminated=False, signum=None, expired=True)
        status = store.batch_status("stored")
        assert status is not None and status.completed and status.failed_ids == (sent.id,)
        with pytest.raises(BatchError, match="cannot go with delayq_debounce"):
            headers = {BATCH_HEADER: "stored", "delayq_debounce": "k"}
            app.send_task("dqt.record", args=["y"], countdown=5, headers=headers)
    finally:
        forget_store(app)


def test_a_batch_needs_the_plugin_on(celery_env: CeleryEnv) -> None:
    with pytest.raises(ConfigError, match="call delayq_backends.celery.install"):
        Batch(celery_env.native_app(), "native")


def test_on_complete_must_take_the_summary_as_json(app: Celery) -> None:
    with pytest.raises(ConfigError, match="not sent as JSON without compression"):
        Batch(app, "pickled", on_complete=app.signature("dqt.batch_done", args=("x",), serializer="pickle"))
    Batch(app, "immutable", on_complete=app.signature("dqt.batch_done", args=({}, "x"), immutable=True)).close()


def _whole_worker_killed(
    kind: str, request: pytest.FixtureRequest, valkey: EmbeddedServer, tmp: Path, beat: float | None
) -> float:
    """A prefork worker (acks_late) SIGKILLed whole (its process group: the worker and its pool)
    while it runs a sub-job, beside a live worker: no hook runs, nothing acks or rejects the
    message. On RabbitMQ it comes back when the dead connection closes; on Redis kombu's own sweep
    would restore it after ``visibility_timeout`` (an hour here), and the live worker's watch
    restores it two beats after the death. It runs again there; the batch completes with both
    sub-jobs succeeded. Returns the seconds from the kill to the sub-job's second start."""
    env = new_env(kind, broker_url_for(kind, request, valkey), valkey)
    env.acks_late = True
    # one message at a time each: the doomed worker, busy, prefetches nothing the live one waits for
    env.conf = {"worker_prefetch_multiplier": 1, **({} if beat is None else {"delayq_worker_beat": beat})}
    with watched(env):
        doomed = env.start_worker(tmp, name="doomed", pool="prefork", concurrency=1, group=True)
        env.start_forwarder(tmp)
        app = env.app()
        store = store_for(app)
        with Batch(app, "orphan", on_complete=app.signature("dqt.batch_done", args=("done",))) as batch:
            slow = batch.add(app.signature("dqt.stall", args=("slow", 600))).id
            ok = batch.add(app.signature("dqt.record", args=("ok",))).id
        starts = lambda: [r for r in env.records() if r["tag"] == "slow"]  # noqa: E731
        wait_for(lambda: bool(starts()), 60, "the sub-job to start on the doomed worker")
        env.start_worker(tmp, name="live")
        env.launcher.kill_group(doomed)
        killed = time.time()
        done = lambda: [r for r in env.records() if r["tag"] == "done"]  # noqa: E731
        wait_for(lambda: done(), 120, lambda: f"{store.batch_status('orphan')}")
        (record,) = done()
        summary = record["summary"]
        assert (summary["total"], summary["succeeded"], summary["failed"]) == (2, 2, 0)
        first, again = starts()  # the killed run, then the run after the give-back
        assert first["first"] and not again["first"] and again["id"] == slow
        assert ok in {r["id"] for r in env.records()}
        return float(again["started_ms"]) / 1000 - killed


@pytest.mark.parametrize("kind", BROKERS)
def test_a_whole_worker_killed_mid_task_gives_it_back_within_two_beats(
    kind: str, request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    """With a 1 s beat: the sub-job starts again within 2 beats + a sweep's beat + a trip through
    the broker (kombu's own sweep: an hour)."""
    took = _whole_worker_killed(kind, request, valkey_server, tmp_path, beat=1)
    assert took < 8, f"the killed sub-job started again {took:.1f} s after the worker's death"


@pytest.mark.slow
@pytest.mark.parametrize("kind", BROKERS)
def test_a_whole_worker_killed_costs_a_batch_two_default_beats(
    kind: str, request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    """The figure of docs/batches.md, with the defaults (a 5 s beat; visibility_timeout an hour):
    the seconds from the SIGKILL of a whole worker to its sub-job's start on a live worker."""
    took = _whole_worker_killed(kind, request, valkey_server, tmp_path, beat=None)
    load = os.getloadavg()[0]
    print(f"Celery on {kind}: the sub-job started again {took:.1f} s after its worker's SIGKILL (load {load:.2f})")
    assert took < 20


@pytest.mark.slow
@pytest.mark.parametrize("kind", BROKERS)
def test_a_batch_of_1000_completes_once_under_worker_and_forwarder_kills(
    kind: str, request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    """4 worker processes (acks_late, dedupe) and a forwarder, SIGKILLed and restarted while a
    batch of 1,000 sub-jobs (100 failing, 300 with a countdown) runs: on_complete runs exactly
    once, after every sub-job's first end, with the right counts. A killed worker's tasks come
    back from the broker (acks_late; the Redis transport's after its visibility timeout, 10 s
    here) and run again; their second end counts nothing."""
    env = new_env(kind, broker_url_for(kind, request, valkey_server), valkey_server)
    env.dedupe, env.acks_late = True, True
    if kind == "redis":
        env.transport_options = {"visibility_timeout": 10}
    rng = random.Random(7)
    with watched(env):
        workers = [env.start_worker(tmp_path, name=f"w{i}") for i in range(4)]
        forwarder = env.start_forwarder(tmp_path)
        app = env.app()
        store = store_for(app)
        ids: dict[str, str] = {}
        with Batch(app, "big", on_complete=app.signature("dqt.batch_done", args=("done",))) as batch:
            for i in range(1000):
                name, args = ("dqt.fail", (f"f{i}",)) if i % 10 == 0 else ("dqt.hold", (f"h{i}", 0.4))
                countdown = rng.uniform(0, 8) if i % 10 in (1, 2, 3) else None
                ids[batch.add(app.signature(name, args=args), countdown=countdown).id] = name
        kills = {"worker": 0, "forwarder": 0}
        deadline = time.monotonic() + 240
        while not (status := store.batch_status("big")) or not status.completed:
            assert time.monotonic() < deadline, f"not completed: {status}\n{env.tail()}"
            time.sleep(3)  # a restarted worker consumes again after about 2 s
            victim = rng.randrange(4)
            env.launcher.kill(workers[victim])
            kills["worker"] += 1
            workers[victim] = env.start_worker(tmp_path, name=f"w{victim}-{kills['worker']}", wait=False)
            if kills["worker"] % 2 == 0:
                env.launcher.kill(forwarder)
                kills["forwarder"] += 1
                forwarder = env.start_forwarder(tmp_path)
        assert kills["worker"] >= 6 and kills["forwarder"] >= 3, kills
        done = lambda: [r for r in env.records() if r["tag"] == "done"]  # noqa: E731
        wait_for(lambda: len(done()) >= 1, 120, "on_complete to run")
        env.launcher.kill(forwarder)  # one more forwarder crash after the release: no second run
        forwarder = env.start_forwarder(tmp_path)
        wait_for(lambda: store.get(batch_item_id("big")) is None, 60, "on_complete acked")
        (record,) = done()
        summary = record["summary"]
        failing = sorted(i for i, name in ids.items() if name == "dqt.fail")
        assert (summary["total"], summary["succeeded"], summary["failed"]) == (1000, 900, 100)
        assert sorted(summary["failed_ids"]) == failing
        first_end: dict[str, int] = {}
        for r in env.records():
            if r["id"] in ids:
                first_end[r["id"]] = min(first_end.get(r["id"], r["started_ms"]), r["started_ms"])
        assert first_end.keys() == ids.keys(), "every sub-job ran"
        assert record["started_ms"] >= max(first_end.values())
        print(f"batch of 1000: kills {kills}, runs {sum(1 for r in env.records() if r['id'] in ids)}")
        forget_store(app)


def test_a_key_in_use_is_refused_at_open_not_at_the_first_add(valkey_url: str, prefix: str) -> None:
    """Issue 30, finding 8: a batch key whose batch completed (kept 7 days) or is closed is
    refused by ``Batch(...)`` itself, with the fix; an open batch is taken up again."""
    app = make_app(
        broker="memory://", store=valkey_url, prefix=prefix, queue="q", sink="s", backend="cache+memory://",
        records=valkey_url,
    )  # fmt: skip
    try:
        Batch(app, "used").close()  # empty: completed at close
        with pytest.raises(BatchClosedError, match="in use.*new key"):
            Batch(app, "used", on_complete=app.signature("dqt.batch_done", args=("x",)))
        Batch(app, "still-open").add(app.signature("dqt.record", args=("x",)), countdown=600)
        again = Batch(app, "still-open")  # a producer starting again: the same batch
        again.add(app.signature("dqt.record", args=("y",)), countdown=600)
        status = store_for(app).batch_status("still-open")
        assert status is not None and status.total == 2
        again.close()
        with pytest.raises(BatchClosedError, match="in use"):
            Batch(app, "still-open")
    finally:
        forget_store(app)


def test_a_batch_runs_eagerly_under_task_always_eager(valkey_url: str, prefix: str) -> None:
    """Issue 30, finding 8: under ``task_always_eager`` each sub-job runs in ``add`` and
    on_complete runs at close with the summary (it failed with "pass a signature")."""
    sink = f"{prefix}:eager"
    app = make_app(
        broker="memory://", store=valkey_url, prefix=prefix, queue="q", sink=sink, backend="cache+memory://",
        records=valkey_url,
    )  # fmt: skip
    app.conf.task_always_eager = True
    records = Redis.from_url(valkey_url)
    try:
        with Batch(app, "eager", on_complete=app.signature("dqt.batch_done", args=("done",))) as batch:
            batch.add(app.signature("dqt.record", args=("a",)))
            failed = batch.add(app.signature("dqt.fail", args=("b",)))
            batch.add(app.signature("dqt.record", args=("c",)), countdown=60)
        runs = [json.loads(r) for r in records.lrange(sink, 0, -1)]
        assert [r["tag"] for r in runs] == ["a", "b", "c", "done"]
        summary = {"batch": "eager", "total": 3, "succeeded": 2, "failed": 1, "failed_ids": [failed.id]}
        assert runs[-1]["summary"] == summary and runs[-1]["id"] == batch_item_id("eager")
        with pytest.raises(BatchClosedError):
            batch.add(app.signature("dqt.record", args=("late",)))
    finally:
        records.delete(sink)
        records.close()
        forget_store(app)
