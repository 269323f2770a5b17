"""Concurrency slots with real ``celery worker`` (prefork, 4 processes) and ``delayq forward``
processes on both brokers: the tasks of a key with limit 2 never run more than 2 at once, by
the start-end intervals the tasks record themselves, and every task runs once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.app.task import Context
from celery.signals import task_revoked

from delayq_backends.celery import SLOT_HEADER, CelerySettings, forget_store, store_for
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope, Slot, slot_of
from delayq_backends.errors import ConfigError, InvalidSlotError
from delayq_backends.store import SlotAsk
from delayq_backends.targets import SLOT_TOKEN
from tests.helpers import max_overlap, wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, watched
from tests.test_celery.tasks import make_app

LIMITED = 10
TASK_SECONDS = 0.6


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path) -> Iterator[CeleryEnv]:
    kind = request.param
    with watched(new_env(kind, broker_url_for(kind, request, valkey_server), valkey_server)) as env:
        env.start_worker(tmp_path, pool="prefork")
        env.start_forwarder(tmp_path)
        yield env


def test_a_key_with_limit_2_never_runs_more_than_2_and_every_task_runs(env: CeleryEnv) -> None:
    app = env.app()
    try:
        slot = {"key": "customer-42", "limit": 2}
        limited = [
            app.send_task("dqt.hold", args=[f"k{i}", TASK_SECONDS], headers={"delayq_slot": slot}).id
            for i in range(LIMITED)
        ]  # no eta: slotted tasks wait in the store all the same
        others = [
            app.send_task("dqt.hold", args=[f"o{i}", TASK_SECONDS], headers={"delayq_slot": "other"}).id
            for i in range(3)
        ]
        done = lambda: {r["id"] for r in env.records()}  # noqa: E731
        wait_for(lambda: done() >= set(limited + others), 90, lambda: f"{len(done())} tasks done")
        records = env.records()
        by_tag: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            by_tag.setdefault(r["tag"], []).append(r)
        assert all(len(runs) == 1 for runs in by_tag.values()), "a task ran twice"
        spans = {r["id"]: (r["began_ms"], r["ended_ms"]) for r in records}
        assert max_overlap([spans[i] for i in limited]) == 2  # 4 worker processes, 2 at once: the limit
        # the other key was not held up behind customer-42's line: it ran beside its first tasks
        last_other_start = max(spans[i][0] for i in others)
        assert last_other_start < sorted(end for _, end in (spans[i] for i in limited))[LIMITED // 2]
        store = store_for(app)
        wait_for(lambda: store.slot_status("customer-42").running == 0, 10, "every slot given back")
        assert store.slot_status("customer-42").waiting == 0
    finally:
        forget_store(app)


def test_a_retry_keeps_its_slot_and_every_slot_comes_back(env: CeleryEnv) -> None:
    """A task that fails twice and retries runs three times, each run under the slot (the retry
    is sent with the task's headers), and the key's slot is free again at the end."""
    app = env.app()
    try:
        slot = {"key": "flaky", "limit": 1}
        task_id = app.send_task("dqt.flaky", args=["f", 2, 0.2], headers={"delayq_slot": slot}).id
        runs = lambda: [r for r in env.records() if r["id"] == task_id]  # noqa: E731
        wait_for(lambda: len(runs()) == 3, 60, lambda: f"{len(runs())} runs")
        assert [r["retries"] for r in runs()] == [0, 1, 2]
        assert all(r["slot"] == slot for r in runs())
        store = store_for(app)
        wait_for(lambda: store.slot_status("flaky").running == 0, 10, "the slot given back")
    finally:
        forget_store(app)


def test_a_slot_header_without_a_limit_takes_its_patterns_and_is_stored_without_eta(
    valkey_url: str, prefix: str
) -> None:
    app = make_app(
        broker="memory://", store=valkey_url, prefix=prefix, queue="q", sink="s", backend="cache+memory://",
        records=valkey_url,
    )  # fmt: skip
    app.conf.delayq_slot_limits = {"customer-*": 2, "*": 9}
    try:
        settings = CelerySettings.of(app)
        assert settings.slot("customer-7") == Slot("customer-7", 2)
        assert settings.slot({"key": "customer-7", "limit": 5}) == Slot("customer-7", 5)  # its own wins
        assert settings.slot("other") == Slot("other", 9)
        sent = app.send_task("dqt.record", args=["x"], headers={"delayq_slot": "customer-7"})
        stored = store_for(app).get(sent.id)  # no eta, stored all the same: it waits for its slot
        assert stored is not None and slot_of(Envelope.decode(stored.envelope)) == (Slot("customer-7", 2), 0)
        with pytest.raises(InvalidSlotError):
            app.send_task("dqt.record", args=["x"], headers={"delayq_slot": {"key": "k", "limit": 0}})
        assert settings.slot_hold_ms == 60_000
        app.conf.delayq_slot_hold = 0
        with pytest.raises(ConfigError, match="delayq_slot_hold"):
            CelerySettings.of(app)
        app.conf.delayq_slot_hold = 5
        app.conf.delayq_slot_limits = {"k": "two"}
        with pytest.raises(ConfigError, match="delayq_slot_limits"):
            CelerySettings.of(app)
    finally:
        forget_store(app)


def test_a_revoked_task_gives_its_slot_back(valkey_url: str, prefix: str) -> None:
    """``task_revoked`` (a task revoked or expired before or while it ran: no ``task_postrun``)
    ends the hold the release took, with the member the forwarder named (id and retries) and the
    token it came with (read by the next take)."""
    app = make_app(
        broker="memory://", store=valkey_url, prefix=prefix, queue="q", sink="s", backend="cache+memory://",
        records=valkey_url,
    )  # fmt: skip
    try:
        store = store_for(app)
        store.check_meta()
        grant = store.take_slots({"k": SlotAsk(1, [("t1#2", 0)])}, hold_ms=60_000, wait_ms=60_000)["k"]
        assert not isinstance(grant, Exception) and grant.places == (-1,)
        headers = {SLOT_HEADER: {"key": "k", "limit": 1}, SLOT_TOKEN: grant.tokens[0]}
        request = Context({"id": "t1", "retries": 2, **headers})
        task_revoked.send(sender=app.tasks["dqt.record"], request=request, terminated=False, signum=None, expired=True)
        after = store.take_slots({"k": SlotAsk(1, [("t2", 1)])}, hold_ms=60_000, wait_ms=60_000)["k"]
        assert not isinstance(after, Exception) and after.places == (-1,) and after.running == 1
    finally:
        forget_store(app)
