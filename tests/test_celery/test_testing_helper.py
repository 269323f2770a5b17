"""The Celery testing helper: an in-process store on a fake clock, no Redis, no broker, no worker.

Tasks run through the real message path: the stored bytes, decoded as a worker decodes them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from delayq_backends.celery import install
from delayq_backends.celery.settings import attached_store
from delayq_backends.celery.testing import DelayedTasks, delayed_tasks
from delayq_backends.celery.testing import delayq_tasks as delayq_tasks  # noqa: F401 (the fixture)
from delayq_backends.testing import FakeClock

NOON = datetime(2030, 1, 1, 12, tzinfo=timezone.utc)
NINE_TOMORROW = datetime(2030, 1, 2, 9, tzinfo=timezone.utc)


def shop_app(log: list[Any]) -> Celery:
    """An app as a user's test suite has it: a memory:// broker and no delayq_url."""
    app = Celery("shop", broker="memory://")
    install(app)

    @app.task(name="billing.charge", shared=False)
    def charge(order: int, amount: str = "0") -> str:
        log.append(("charge", order, amount))
        return f"charged {order}"

    @app.task(name="billing.flaky", bind=True, max_retries=2, shared=False)
    def flaky(self: Any, order: int) -> str:
        log.append(("flaky", order, self.request.retries))
        if self.request.retries < 2:
            raise self.retry(countdown=60)
        return "done"

    @app.task(name="billing.pickled", serializer="pickle", shared=False)
    def pickled(value: Any) -> None:
        log.append(("pickled", value))

    app.conf.accept_content = ["json", "pickle"]
    return app


def test_this_call_scheduled_billing_charge_for_nine_tomorrow() -> None:
    log: list[Any] = []
    app = shop_app(log)
    with delayed_tasks(app, clock=FakeClock(NOON)) as delayed:
        app.tasks["billing.charge"].apply_async((42,), {"amount": "9.90"}, eta=NINE_TOMORROW)
        [task] = delayed.scheduled("billing.charge")
        assert (task.name, task.args, task.kwargs, task.eta) == (
            "billing.charge",
            [42],
            {"amount": "9.90"},
            NINE_TOMORROW,
        )
        assert task.queue == "celery" and task.priority is None
        assert delayed.advance(timedelta(hours=20)) == [] and log == [], "08:00: not due yet"
        [ran] = delayed.advance(timedelta(hours=1))
        assert (ran.state, ran.result, ran.task.id, ran.task.ready) == ("SUCCESS", "charged 42", task.id, NINE_TOMORROW)
        assert log == [("charge", 42, "9.90")] and delayed.scheduled() == []
        assert delayed.advance(timedelta(days=1)) == [], "ran once"
    assert attached_store(app) is None, "detached after the block"


def test_countdowns_and_retries_follow_the_fake_clock() -> None:
    log: list[Any] = []
    app = shop_app(log)
    with delayed_tasks(app, clock=FakeClock(NOON)) as delayed:
        app.tasks["billing.flaky"].apply_async((7,), countdown=3600)
        [task] = delayed.scheduled()
        assert task.eta == NOON + timedelta(hours=1), "countdown from the fake clock"
        [first] = delayed.advance(timedelta(hours=1))
        assert first.state == "RETRY"
        [again] = delayed.scheduled("billing.flaky")
        assert again.id == task.id and again.eta == NOON + timedelta(hours=1, seconds=60)
        assert [r.state for r in delayed.advance(60)] == ["RETRY"]
        assert [r.state for r in delayed.advance(60)] == ["SUCCESS"]
        assert [entry[2] for entry in log] == [0, 1, 2]


def test_other_serializers_run_but_are_never_shown_decoded() -> None:
    log: list[Any] = []
    app = shop_app(log)
    with delayed_tasks(app, clock=FakeClock(NOON)) as delayed:
        app.tasks["billing.pickled"].apply_async(({"a": {1, 2}},), countdown=10)
        [task] = delayed.scheduled()
        assert task.args is None and task.argsrepr == "({'a': {1, 2}},)"
        [ran] = delayed.advance(10)
        assert ran.state == "SUCCESS" and log == [("pickled", {"a": {1, 2}})]


def test_expired_task_is_revoked_not_run() -> None:
    log: list[Any] = []
    app = shop_app(log)
    with delayed_tasks(app, clock=FakeClock(NOON)) as delayed:
        app.tasks["billing.charge"].apply_async((1,), countdown=600, expires=NOON + timedelta(seconds=300))
        [ran] = delayed.advance(600)
        assert ran.state == "REVOKED" and log == []


def test_revoke_removes_the_task_from_the_attached_store() -> None:
    app = shop_app([])
    with delayed_tasks(app, clock=FakeClock(NOON)) as delayed:
        result = app.tasks["billing.charge"].apply_async((1,), countdown=600)
        result.revoke()
        assert delayed.scheduled() == [] and delayed.advance(600) == []


def test_pytest_fixture(delayq_tasks: Callable[..., DelayedTasks]) -> None:
    app = shop_app([])
    delayed = delayq_tasks(app, clock=FakeClock(NOON))
    app.tasks["billing.charge"].apply_async((3,), countdown=5)
    assert [t.args for t in delayed.scheduled()] == [[3]]
    assert [r.result for r in delayed.advance(5)] == ["charged 3"]


@pytest.mark.parametrize("mode", ["replace", "keep", "error"])
def test_same_task_id_twice(mode: str) -> None:
    """Native Celery would run both sends; the plugin does as delayq_duplicate_id says."""
    from delayq_backends.celery.settings import DuplicateTaskIdError

    log: list[Any] = []
    app = shop_app(log)
    app.conf.delayq_duplicate_id = mode
    charge = app.tasks["billing.charge"]
    with delayed_tasks(app, clock=FakeClock(NOON)) as delayed:
        charge.apply_async((1,), task_id="order-1", countdown=60)
        if mode == "error":
            with pytest.raises(DuplicateTaskIdError, match="order-1.*NOT scheduled"):
                charge.apply_async((2,), task_id="order-1", countdown=120)
        else:
            charge.apply_async((2,), task_id="order-1", countdown=120)
        [task] = delayed.scheduled()
        expected = {"replace": ([2], 120), "keep": ([1], 60), "error": ([1], 60)}[mode]
        assert (task.args, task.eta) == (expected[0], NOON + timedelta(seconds=expected[1]))
        assert [r.state for r in delayed.advance(120)] == ["SUCCESS"]
        assert log == [("charge", expected[0][0], "0")]
