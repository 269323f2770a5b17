"""The Celery worker's history hooks in process: they act only on runs that carry the
``delayq_periodic`` header, map Celery's states to outcomes, and a store that cannot be reached
costs a log line, never the task."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

from delayq_backends.celery import install, store_for
from delayq_backends.celery.history import _ended, _revoked, _started
from delayq_backends.periodic.history import RUN_HEADER, RunMark, read_history
from tests.harness import make_store

DUE = 1_800_000_000_000


def app_on(url: str, prefix: str) -> Celery:
    app = Celery("history", broker="memory://")
    app.conf.update(delayq_url=url, delayq_prefix=prefix, delayq_shards=4)
    install(app)
    return app


def test_the_hooks_record_a_runs_start_and_outcome(valkey_url: str, prefix: str) -> None:
    make_store(valkey_url, prefix, shards=4).check_meta()  # as a forwarder's start does
    app = app_on(valkey_url, prefix)

    @app.task(name="t.tick")
    def task() -> None:
        pass

    header = RunMark("tick", DUE).header()
    for task_id, state in (("a", "SUCCESS"), ("b", "FAILURE"), ("c", "RETRY"), ("d", "IGNORED")):
        task.push_request(id=task_id, **{RUN_HEADER: header})
        _started(task=task, task_id=task_id)
        _ended(task=task, task_id=task_id, state=state)
        task.pop_request()
    task.push_request(id="plain")  # no header: not a periodic run
    _started(task=task, task_id="plain")
    task.pop_request()
    _revoked(sender=task, request=type("Request", (), {"id": "e", RUN_HEADER: header})())
    found = read_history(store_for(app), "tick")
    outcomes = {r.run_id: r.outcome for r in found.runs}
    assert outcomes == {"a": "success", "b": "failure", "c": "retry", "d": None, "e": "revoked"}


def test_an_unreachable_store_costs_a_log_line_not_the_task(caplog: pytest.LogCaptureFixture) -> None:
    app = app_on("redis://127.0.0.1:1/0", "nowhere")
    ran = []

    @app.task(name="t.tick")
    def task() -> None:
        ran.append(1)

    task.push_request(id="a", **{RUN_HEADER: RunMark("tick", DUE).header()})
    with caplog.at_level(logging.WARNING, "delayq.periodic.history"):
        _started(task=task, task_id="a")
        task.run()
        _ended(task=task, task_id="a", state="SUCCESS")
    assert ran == [1]
    assert "start of run a of 'tick' not recorded" in caplog.text
    assert "end of run a of 'tick' not recorded" in caplog.text
