"""Groups with real ``celery worker`` and ``delayq forward`` processes on both brokers: a task
sent with the header ``delayq_group`` (a key, a dict, a list) is stored with its groups, arrives
at its worker with them, and the worker holds each of them while it runs (one token for all);
a bad header sends nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context
from celery.signals import task_revoked

from delayq_backends.celery import GROUP_HEADER, SLOT_HEADER, forget_store, store_for
from delayq_backends.envelope import Envelope, Group, groups_of
from delayq_backends.errors import InvalidGroupError
from delayq_backends.store import slot_member
from delayq_backends.targets import SLOT_TOKEN
from tests.helpers import group_running, hold_in_groups, wait_for
from tests.test_celery.harness import CeleryEnv
from tests.test_celery.tasks import make_app


def stored_groups(app: Celery, task_id: str) -> tuple[Group, ...]:
    item = store_for(app).get(task_id)
    assert item is not None, f"task {task_id} is not in the store"
    return groups_of(Envelope.decode(item.envelope))


def test_a_grouped_task_is_stored_with_its_groups_and_its_worker_gets_them(celery_env: CeleryEnv, app: Celery) -> None:
    listed = ["tenant-7", Group("api", weight=3, cost=5)]
    sent = {
        "key": ("tenant-7", None, [{"key": "tenant-7"}]),
        "dict": ({"key": "t-7", "limit": 2, "rate": "10/s"}, 0.5, [{"key": "t-7", "limit": 2, "rate": "10/s"}]),
        "list": (listed, 0.5, [{"key": "tenant-7"}, {"key": "api", "weight": 3.0, "cost": 5}]),
    }
    ids = {}
    for tag, (group, countdown, _) in sent.items():  # no countdown: a grouped task goes through the store too
        ids[tag] = app.send_task("dqt.record", args=[tag], countdown=countdown, headers={GROUP_HEADER: group}).id
    later = app.send_task("dqt.record", args=["later"], countdown=3600, headers={GROUP_HEADER: listed}).id
    assert stored_groups(app, later) == (Group("tenant-7"), Group("api", weight=3.0, cost=5))
    runs = lambda: {r["tag"]: r for r in celery_env.records() if r["id"] in ids.values()}  # noqa: E731
    wait_for(lambda: len(runs()) == len(ids), 60, lambda: f"ran {sorted(runs())}")
    assert {tag: r["group"] for tag, r in runs().items()} == {tag: stored for tag, (_, _, stored) in sent.items()}
    store = store_for(app)
    assert all(store.get(i) is None for i in ids.values())  # forwarded, not left behind
    # the forwarder took a slot of each group per item; the worker gives each back with the one
    # token the message carries, just after the task's own record: nothing stays held
    wait_for(
        lambda: group_running(store, "tenant-7") == 0 and group_running(store, "api") == 0,
        10,
        lambda: f"running: tenant-7 {group_running(store, 'tenant-7')}, api {group_running(store, 'api')}",
        interval=0.05,
    )
    app.control.revoke(later)


def test_a_worker_holds_each_group_with_the_one_token_and_gives_all_back(celery_env: CeleryEnv, app: Celery) -> None:
    """Slots taken in two groups for one task, as a forwarder releases it: the worker's start
    holds both with the message's token, its end gives both back (without it they would stay
    taken for the minute of the start window)."""
    store = store_for(app)
    store.check_meta()
    task_id, token = str(uuid.uuid4()), uuid.uuid4().hex
    keys = [f"g1-{task_id}", f"g2-{task_id}"]
    hold_in_groups(store, keys, slot_member(task_id, 0), token)
    assert [group_running(store, k) for k in keys] == [1, 1]
    app.send_task("dqt.hold", args=["held", 1.0], task_id=task_id, headers={GROUP_HEADER: keys, SLOT_TOKEN: token})
    wait_for(lambda: any(r["id"] == task_id for r in celery_env.records()), 60, "the task to run")
    wait_for(lambda: [group_running(store, k) for k in keys] == [0, 0], 10, "every group's slot given back")


def test_a_task_throttles_any_of_its_groups(celery_env: CeleryEnv, app: Celery) -> None:
    """``delayq_backends.celery.throttle`` from inside a task of two groups throttles the one it
    names (proven by the task's token), not the other."""
    store = store_for(app)
    task_id, token = str(uuid.uuid4()), uuid.uuid4().hex
    keys = [f"g1-{task_id}", f"g2-{task_id}"]
    hold_in_groups(store, keys, slot_member(task_id, 0), token)
    headers = {GROUP_HEADER: keys, SLOT_TOKEN: token}
    app.send_task("dqt.throttles", args=["t", keys[1], 60], task_id=task_id, headers=headers)
    wait_for(lambda: any(r["id"] == task_id for r in celery_env.records()), 60, "the task to run")
    group_running(store, keys[1])  # a take reads the report
    assert store.group_policy(keys[1]).throttled_until is not None
    assert store.group_policy(keys[0]).throttled_until is None


@pytest.fixture
def memory_app(valkey_url: str, prefix: str) -> Iterator[Celery]:
    app = make_app(
        broker="memory://", store=valkey_url, prefix=prefix, queue=f"{prefix}-q", sink="s", backend="cache+memory://",
        records=valkey_url,
    )  # fmt: skip
    yield app
    forget_store(app)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        ({"key": "t", "limit": 0}, "limit"),
        ({"key": "t", "rate": "10 per second"}, "'N/s', 'N/m' or 'N/h'"),
        (["a", "b", "c", "d"], "at most 3"),
        (["a", "a"], "named twice"),
        (42, "is a int"),
    ],
)
def test_a_bad_group_header_sends_nothing_and_says_why(memory_app: Celery, header: Any, says: str) -> None:
    store = store_for(memory_app)
    for countdown in (None, 60):
        with pytest.raises(InvalidGroupError) as raised:
            memory_app.send_task("dqt.record", args=["x"], countdown=countdown, headers={GROUP_HEADER: header})
        assert "was NOT sent" in str(raised.value) and says in str(raised.value)
    assert sum(s.scheduled for s in store.stats()) == 0
    memory_app.send_task("dqt.record", args=["plain"])  # published at once: the only message
    memory_app.send_task("dqt.record", args=["empty"], headers={GROUP_HEADER: []})  # an empty list is none: too
    with memory_app.connection_for_write() as conn:  # the bad ones were not published either
        queue = memory_app.conf.task_default_queue  # the test's own: the memory broker is the process's
        assert conn.default_channel.queue_declare(queue, passive=True).message_count == 2


def test_group_goes_with_slot_rate_key_and_debounce(memory_app: Celery) -> None:
    """The slot and rate key headers are groups too (aliases): they count towards the 3 and name
    a key once; a debounced send keeps its groups."""
    eta = datetime.now(timezone.utc) + timedelta(hours=1)
    headers = {
        GROUP_HEADER: {"key": "t-7", "rate": "5/s"},
        SLOT_HEADER: {"key": "t-7", "limit": 2},
        "delayq_rate_key": "r",
    }
    both = memory_app.send_task("dqt.record", args=["x"], eta=eta, headers=headers).id
    assert stored_groups(memory_app, both) == (Group("t-7", 2, "5/s"), Group("r"))
    with pytest.raises(InvalidGroupError, match="at most 3 groups"):
        memory_app.send_task("dqt.record", args=["x"], eta=eta, headers={**headers, GROUP_HEADER: ["a", "b", "c"]})
    debounced = {GROUP_HEADER: ["t-7", "doc"], "delayq_debounce": "doc-1"}
    memory_app.send_task("dqt.record", args=["x"], countdown=30, headers=debounced)
    assert stored_groups(memory_app, "debounce:doc-1") == (Group("t-7"), Group("doc"))


def test_a_revoked_task_gives_back_every_group(memory_app: Celery) -> None:
    """``task_revoked`` (no ``task_postrun``) ends the holds of each of the task's groups, its
    slot's among them."""
    store = store_for(memory_app)
    store.check_meta()
    hold_in_groups(store, ["a", "b", "s"], slot_member("t1", 2), "tok")
    headers = {GROUP_HEADER: [{"key": "a"}, {"key": "b", "limit": 1}], SLOT_HEADER: "s", SLOT_TOKEN: "tok"}
    request = Context({"id": "t1", "retries": 2, **headers})
    task_revoked.send(
        sender=memory_app.tasks["dqt.record"], request=request, terminated=False, signum=None, expired=True
    )
    assert [group_running(store, k) for k in ("a", "b", "s")] == [0, 0, 0]
