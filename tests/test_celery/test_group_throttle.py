"""A worker throttles its group (issue 31): real ``celery worker`` processes (prefork, both
brokers) and a real ``delayq forward``; a task of a group at limit 1 calls
``delayq_backends.celery.throttle``: the group's next task starts only when the throttle ends,
another group runs meanwhile, every task runs once (no attempt counted), and a task throttling
a group it is not of is refused (nothing reported). tests/test_rq/test_group_throttle.py: RQ."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq_backends.embedded import EmbeddedServer
from tests.helpers import wait_for
from tests.test_celery.conftest import BROKERS, broker_url_for
from tests.test_celery.harness import CeleryEnv, new_env, watched

THROTTLE_S = 2.0
API = {"key": "api", "limit": 1}


def check_runs(runs_by_tag: dict[str, dict[str, Any]], at: str, scale: float) -> None:
    """The throttling run throttled; the group's next run started when the throttle ended (not
    before, within 1.5 s after); the other group's ran meanwhile; the stranger was refused."""
    first, second, other = runs_by_tag["first"], runs_by_tag["second"], runs_by_tag["other"]
    assert first["outcome"] == "throttled", first
    waited = (second[at] - first[at]) / scale
    assert THROTTLE_S <= waited < THROTTLE_S + 1.5, f"the group's next run started {waited:.2f} s after the throttle"
    assert other[at] / scale < first[at] / scale + THROTTLE_S, "the other group ran while api was throttled"
    assert runs_by_tag["stranger"]["outcome"].startswith("refused: throttle('api') in "), runs_by_tag["stranger"]


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest, valkey_server: EmbeddedServer, tmp_path: Path) -> Iterator[CeleryEnv]:
    kind = request.param
    with watched(new_env(kind, broker_url_for(kind, request, valkey_server), valkey_server)) as env:
        env.start_worker(tmp_path, pool="prefork")
        env.start_forwarder(tmp_path)
        yield env


def test_a_celery_task_throttles_its_group_at_every_release(env: CeleryEnv) -> None:
    app = env.app()
    try:
        send = lambda task, args, slot: app.send_task(task, args=args, headers={"delayq_slot": slot})  # noqa: E731
        send("dqt.throttle", ["first", "api", THROTTLE_S], API)
        wait_for(lambda: any(r["tag"] == "first" for r in env.records()), 60, "the first task to run")
        send("dqt.record", ["second"], API)
        send("dqt.throttle", ["stranger", "api", THROTTLE_S], "other")
        send("dqt.hold", ["other", 0.01], "other")
        wait_for(lambda: len(env.records()) == 4, 60, lambda: f"runs {[r['tag'] for r in env.records()]}")
        by_tag = {r["tag"]: r for r in env.records()}
        by_tag["first"]["at"], by_tag["second"]["at"] = by_tag["first"]["at_ms"], by_tag["second"]["started_ms"]
        by_tag["other"]["at"] = by_tag["other"]["began_ms"]
        check_runs(by_tag, "at", 1000)
        assert all(r["retries"] == 0 for r in env.records()), "no run counted as an attempt"
    finally:
        app.close()
