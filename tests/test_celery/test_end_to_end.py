"""Delayed Celery tasks through the delay store to a real worker, on RabbitMQ and a Redis broker.

Each module-scoped environment runs a real ``celery worker`` and a real forwarder subprocess
(``delayq forward --celery-broker`` for RabbitMQ, ``celery -A … delayq forward`` for Redis). The
Redis broker runs twice: in another database (kombu's publish, then the ack) and in the store's
own (the exactly-once hand-off, which encodes kombu's messages itself: priorities, ``expires``,
eta rewrites and custom headers reach the worker as kombu's publish would send them).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, group

from delayq_backends.celery import get, reschedule, store_for
from delayq_backends.celery.message import parse_time
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, HANDOFF
from tests.test_celery.harness import CeleryEnv, delayq_cli

pytestmark = pytest.mark.parametrize("celery_env", [*BROKERS, HANDOFF], indirect=True, scope="module")


def runs(env: CeleryEnv, tag: str) -> list[dict[str, Any]]:
    return [r for r in env.records() if r["tag"] == tag]


def wait_runs(env: CeleryEnv, tag: str, count: int, timeout: float) -> list[dict[str, Any]]:
    wait_for(lambda: len(runs(env, tag)) >= count, timeout, f"{count} runs of {tag!r}:\n{env.tail()}")
    return runs(env, tag)


def eta_ms(record: dict[str, Any]) -> int:
    eta = parse_time(record["eta"])
    assert eta is not None, record
    return int(eta.timestamp() * 1000)


@pytest.mark.alone  # lateness bounds: a busy core makes tasks late
def test_500_countdowns_and_etas_run_once_on_time(celery_env: CeleryEnv, app: Celery) -> None:
    tag = f"bulk-{uuid.uuid4().hex[:6]}"
    rng = random.Random(7)
    # task id -> (earliest and latest possible eta in epoch ms, args, kwargs)
    sent: dict[str, tuple[float, float, list[Any], dict[str, Any]]] = {}
    for i in range(500):
        countdown = rng.uniform(2, 8)
        args, kwargs = [tag, i, "ü"], {"n": i, "nested": {"x": [1, 2]}}
        before = time.time()
        result = app.send_task(
            "dqt.record", args=args, kwargs=kwargs, countdown=countdown, headers={"x_custom": f"h{i}"}
        )
        sent[result.id] = ((before + countdown) * 1000, (time.time() + countdown) * 1000, args, kwargs)
    for i in range(20):
        eta = datetime.now(timezone.utc) + timedelta(seconds=rng.uniform(2, 8))
        result = app.send_task("dqt.record", args=[tag, 1000 + i], eta=eta)
        sent[result.id] = (eta.timestamp() * 1000, eta.timestamp() * 1000, [tag, 1000 + i], {})
    # nothing reached the broker: every task waits in the store
    assert sum(1 for task_id in sent if get(app, task_id) is not None) == len(sent)

    done = wait_runs(celery_env, tag, len(sent), timeout=60)
    counts = Counter(r["id"] for r in done)
    assert set(counts) == set(sent) and max(counts.values()) == 1, "each task runs exactly once"
    for r in done:
        earliest, latest, args, kwargs = sent[r["id"]]
        assert r["started_ms"] >= eta_ms(r) - 1, f"{r['id']} started before its eta"
        assert earliest - 1 <= eta_ms(r) <= latest + 1, "the eta header is the one apply_async set"
        assert r["args"] == args and r["kwargs"] == kwargs
    custom = {r["id"]: r["custom"] for r in done if r["args"][1] < 500}
    assert all(custom[i] == f"h{sent[i][2][1]}" for i in custom), "custom headers survive"
    assert all(get(app, task_id) is None for task_id in sent), "forwarded tasks are acked"


def test_chain_with_countdown_runs_in_order(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    step = app.signature("dqt.step")
    started = time.time()
    chain(
        step.clone(args=([], f"{tag}-a")), step.clone(args=(f"{tag}-b",)), step.clone(args=(f"{tag}-c",))
    ).apply_async(countdown=2)
    (c,) = wait_runs(celery_env, f"{tag}-c", 1, timeout=30)
    (a,) = runs(celery_env, f"{tag}-a")
    (b,) = runs(celery_env, f"{tag}-b")
    assert a["started_ms"] >= started * 1000 + 1900
    assert a["started_ms"] <= b["started_ms"] <= c["started_ms"]
    assert c["previous"] == [f"{tag}-a", f"{tag}-b"]


def test_group_with_countdown_runs_every_member(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    started = time.time()
    group(app.signature("dqt.record", args=(tag, i)) for i in range(5)).apply_async(countdown=2)
    done = wait_runs(celery_env, tag, 5, timeout=30)
    assert sorted(r["args"][1] for r in done) == [0, 1, 2, 3, 4]
    assert min(r["started_ms"] for r in done) >= started * 1000 + 1900


def test_link_and_link_error_fire(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    app.signature("dqt.record", args=(f"{tag}-ok",)).apply_async(
        countdown=1, link=app.signature("dqt.step", args=(f"{tag}-then",))
    )
    failing = app.signature("dqt.fail", args=(f"{tag}-bad",)).apply_async(
        countdown=1, link_error=app.signature("dqt.on_error", kwargs={"tag": f"{tag}-caught"})
    )
    (then,) = wait_runs(celery_env, f"{tag}-then", 1, timeout=30)
    (caught,) = wait_runs(celery_env, f"{tag}-caught", 1, timeout=30)
    assert then["previous"] == f"{tag}-ok"
    assert caught["failed"] == failing.id


def test_priority_survives(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    app.send_task("dqt.record", args=[tag], countdown=1, priority=7)
    (run,) = wait_runs(celery_env, tag, 1, timeout=30)
    assert run["priority"] == 7


def test_expired_before_due_is_revoked_by_the_worker(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    result = app.send_task("dqt.record", args=[tag], countdown=2, expires=1)
    wait_for(lambda: result.state == "REVOKED", 30, f"task {result.id} to be marked REVOKED:\n{celery_env.tail()}")
    assert runs(celery_env, tag) == []


def test_revoked_task_never_runs(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    doomed = app.send_task("dqt.record", args=[f"{tag}-doomed"], countdown=2)
    by_control = app.send_task("dqt.record", args=[f"{tag}-doomed"], countdown=2)
    app.send_task("dqt.record", args=[f"{tag}-sentinel"], countdown=3)
    assert get(app, doomed.id) is not None
    doomed.revoke()  # AsyncResult.revoke, as users call it
    app.control.revoke([by_control.id])
    assert get(app, doomed.id) is None and get(app, by_control.id) is None
    wait_runs(celery_env, f"{tag}-sentinel", 1, timeout=30)  # due after the revoked ones
    assert runs(celery_env, f"{tag}-doomed") == []


def test_reschedule_moves_a_task_earlier_and_later(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    early = app.send_task("dqt.record", args=[f"{tag}-early"], countdown=3600)
    late = app.send_task("dqt.record", args=[f"{tag}-late"], countdown=1)
    new_early = datetime.now(timezone.utc) + timedelta(seconds=2)
    new_late = datetime.now(timezone.utc) + timedelta(seconds=4)
    assert reschedule(app, early.id, new_early) and reschedule(app, late.id, new_late)
    assert not reschedule(app, "no-such-task", new_early)
    (e,) = wait_runs(celery_env, f"{tag}-early", 1, timeout=30)
    (lt,) = wait_runs(celery_env, f"{tag}-late", 1, timeout=30)
    assert e["started_ms"] >= new_early.timestamp() * 1000 - 1
    assert abs(eta_ms(e) - new_early.timestamp() * 1000) <= 1, "the eta header follows the reschedule"
    assert lt["started_ms"] >= new_late.timestamp() * 1000 - 1


def test_retry_with_countdown_waits_in_the_store(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    result = app.send_task("dqt.flaky", args=[tag, 2, 1.5], countdown=1)
    done = wait_runs(celery_env, tag, 3, timeout=30)
    assert [r["retries"] for r in done] == [0, 1, 2]
    assert all(r["id"] == result.id for r in done)
    for before, after in zip(done, done[1:]):
        assert after["started_ms"] - before["started_ms"] >= 1500 - 5
    wait_for(lambda: result.state == "SUCCESS", 10, "the last retry to succeed")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc (Linux)")
def test_worker_holds_no_eta_tasks(celery_env: CeleryEnv, app: Celery) -> None:
    worker = celery_env.launcher.procs[0]
    inspect = celery_env.inspect(app)
    before = rss_kb(worker.pid)
    tag = uuid.uuid4().hex[:6]
    ids = [app.send_task("dqt.record", args=[tag, i], countdown=3 * 3600).id for i in range(10_000)]
    assert inspect.scheduled() and all(v == [] for v in inspect.scheduled().values())
    assert all(v == [] for v in (inspect.reserved() or {}).values())
    grown_mb = (rss_kb(worker.pid) - before) / 1024
    assert grown_mb < 8, f"worker RSS grew {grown_mb:.1f} MB with 10,000 tasks scheduled"
    assert get(app, ids[-1]) is not None

    # The control: the same check sees tasks that Celery's native ETA handling parks in the worker.
    native = celery_env.native_app()
    parked = [native.send_task("dqt.record", args=[f"{tag}-native"], countdown=3 * 3600).id for _ in range(20)]
    wait_for(
        lambda: sum(len(v) for v in (inspect.scheduled() or {}).values()) == 20, 15, "the native ETA tasks to park"
    )
    native.control.revoke(parked)


def test_celery_delayq_stats_reads_the_apps_store(celery_env: CeleryEnv, app: Celery) -> None:
    before = sum(s.scheduled for s in store_for(app).stats())
    for i in range(3):
        app.send_task("dqt.record", args=["stats", i], countdown=3600)
    shown = delayq_cli(celery_env, "stats", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["totals"]["scheduled"] == before + 3
