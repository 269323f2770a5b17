"""Debounce, throttle and rate keys of Celery sends, through a real forwarder to a real worker,
on RabbitMQ and a Redis broker: ``apply_async(eta=/countdown=, headers={"delayq_debounce": ...})``."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from delayq_backends import Envelope, InvalidDebounceError, InvalidRateKeyError
from delayq_backends.celery import store_for
from delayq_backends.envelope import rate_key_of
from delayq_backends.timeutil import to_ms
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv
from tests.test_celery.test_end_to_end import eta_ms, runs, wait_runs


def send_many(app: Celery, tag: str, n: int, window: float, header: Any) -> list[int]:
    """``n`` sends of dqt.record(tag, i), each due ``window`` s after it; their etas in ms."""
    etas = []
    for i in range(n):
        eta = datetime.now(timezone.utc) + timedelta(seconds=window)
        app.send_task("dqt.record", args=[tag, i], eta=eta, headers={"delayq_debounce": header})
        etas.append(to_ms(eta))
    return etas


@pytest.mark.parametrize("keep", ["last", "first"])
def test_1000_debounced_sends_of_one_key_run_once_at_the_last_eta(
    celery_env: CeleryEnv, app: Celery, keep: str
) -> None:
    tag = f"deb-{keep}-{uuid.uuid4().hex[:6]}"
    etas = send_many(app, tag, 1000, 3.0, {"key": tag, "keep": keep})
    store = store_for(app)
    item = store.get(f"debounce:{tag}")
    assert item is not None and item.calls == 1000 and item.ready_ms == etas[-1]
    [run] = wait_runs(celery_env, tag, 1, timeout=30)
    assert run["args"] == [tag, 999 if keep == "last" else 0]
    assert abs(eta_ms(run) - etas[-1]) <= 1  # the eta header follows the run's time
    assert etas[-1] - 1 <= run["started_ms"] <= etas[-1] + 2000
    wait_for(lambda: store.get(f"debounce:{tag}") is None, 10, "the run acked")
    assert len(runs(celery_env, tag)) == 1


def test_throttled_sends_run_once_at_the_first_eta_then_a_new_window_opens(celery_env: CeleryEnv, app: Celery) -> None:
    tag = f"thr-{uuid.uuid4().hex[:6]}"
    etas = send_many(app, tag, 1000, 4.0, {"key": tag, "mode": "throttle", "keep": "first"})
    item = store_for(app).get(f"throttle:{tag}")
    assert item is not None and (item.calls, item.ready_ms) == (1000, etas[0])
    [run] = wait_runs(celery_env, tag, 1, timeout=30)
    assert run["args"] == [tag, 0] and abs(eta_ms(run) - etas[0]) <= 1
    assert etas[0] - 1 <= run["started_ms"] <= etas[0] + 2000
    # a send after the run fired starts the next window, with its own arguments
    app.send_task(
        "dqt.record", args=[tag, "again"], countdown=1, headers={"delayq_debounce": {"key": tag, "mode": "throttle"}}
    )
    runs_now = wait_runs(celery_env, tag, 2, timeout=30)
    assert sorted(str(r["args"][1]) for r in runs_now) == ["0", "again"]


def test_bad_headers_are_refused_and_nothing_is_stored(celery_env: CeleryEnv, app: Celery) -> None:
    tag = f"bad-{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidDebounceError, match="needs countdown= or eta="):
        app.send_task("dqt.record", args=[tag], headers={"delayq_debounce": tag})
    for header, message in [
        ({"key": tag, "mode": "sometimes"}, "use 'debounce' or 'throttle'"),
        ({"key": tag, "keep": "middle"}, "use 'first' or 'last'"),
        ({"key": tag, "window": 3}, "pass a key"),
        (["k"], "pass a key"),
        ({"key": 5}, "is no text"),
    ]:
        with pytest.raises(InvalidDebounceError, match=message):
            app.send_task("dqt.record", args=[tag], countdown=5, headers={"delayq_debounce": header})
    with pytest.raises(InvalidRateKeyError):
        app.send_task("dqt.record", args=[tag], countdown=5, headers={"delayq_rate_key": {"tenant": 1}})
    assert all(tag.encode() not in i.envelope for i in store_for(app).scan())


def test_rate_key_header_is_stored_with_the_task(celery_env: CeleryEnv, app: Celery) -> None:
    result = app.send_task("dqt.record", args=["rk"], countdown=60, headers={"delayq_rate_key": "tenant-7"})
    store = store_for(app)
    item = store.get(result.id)
    assert item is not None and rate_key_of(Envelope.decode(item.envelope)) == "tenant-7"
    store.cancel(result.id)
