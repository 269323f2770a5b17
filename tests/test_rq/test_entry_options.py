"""An RQ periodic entry's run options (``periodic/options.py``) reach a real ``rq worker``: timeout,
result_ttl, ttl, meta, retry and the success/failure callbacks, set with ``delayq periodic add
--kind rq``; an every-second entry with ``ttl`` queues no stale runs while the worker is down
(7 s); and a function that is no import path is refused when the entry is added, saying what to
give (RQ would take it, and fail at every run)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner, Result
from rq.job import Job

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.periodic import ops
from delayq_backends.periodic.options import RunOptions
from delayq_backends.periodic.registry import PeriodicError
from delayq_backends.periodic.schedules import Every
from delayq_backends.rq.cron import runtime_entry
from delayq_backends.timeutil import now_ms
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for

JOBS = "tests.test_rq.jobs"
Invoke = Callable[..., Result]


@pytest.fixture
def cli(valkey_url: str, prefix: str, vstore: DelayStore) -> Invoke:
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4", "DELAYQ_RQ_REDIS": valkey_url}

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, ["periodic", *args], env=env)

    return invoke


def test_a_runs_job_options_reach_a_real_worker(
    cli: Invoke, vstore: DelayStore, processes: Processes, conn: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}-opt"
    processes.worker(queue)
    processes.forwarder("--poll", "0.2")
    added = cli(
        "add", "probe", "--kind", "rq", "--func", f"{JOBS}.probe", "--queue", queue, "--every", "3600",
        "--args", '["p"]', "--timeout", "77", "--result-ttl", "123", "--ttl", "45", "--meta", '{"owner": "ops"}',
        "--retry-max", "2", "--retry-intervals", "0", "--on-success", f"{JOBS}.on_success",
        "--on-failure", f"{JOBS}.on_failure",
    )  # fmt: skip
    assert added.exit_code == 0 and "added: probe" in added.output, added.output
    shown = json.loads(cli("show", "probe", "--json").output)
    assert shown["options"] == {
        "timeout": 77, "result_ttl": 123, "ttl": 45, "meta": {"owner": "ops"}, "retry_max": 2,
        "retry_intervals": [0], "on_success": f"{JOBS}.on_success", "on_failure": f"{JOBS}.on_failure",
    }  # fmt: skip
    ops.run_now(vstore, "probe")
    wait_for(lambda: any(r["tag"] == "success" for r in runs(conn, queue)), 30, "the run, retried, then its callback")
    recorded = runs(conn, queue)
    tries = [r for r in recorded if r["tag"] == "p"]
    assert len(tries) == 2 and tries[0]["id"] == tries[1]["id"], "the failed try was retried (retry_max)"
    first = tries[0]
    assert (first["timeout"], first["result_ttl"], first["ttl"]) == (77, 123, 45)
    assert first["meta"]["owner"] == "ops" and first["meta"]["delayq_periodic"]["name"] == "probe"
    assert (first["retries_left"], first["retry_intervals"], tries[1]["retries_left"]) == (2, [0], 1)
    assert [r["tag"] for r in recorded if r["tag"] in ("failure", "success")] == ["failure", "success"]
    assert [r["result"] for r in recorded if r["tag"] == "success"] == ["p done"]
    assert 0 < conn.ttl(Job.key_for(first["id"])) <= 123, "the result is kept result_ttl seconds"


def test_an_every_second_entry_with_ttl_queues_no_stale_runs_while_the_worker_is_down(
    cli: Invoke, processes: Processes, conn: redis.Redis, prefix: str
) -> None:
    queue = f"{prefix}-tick"
    worker = processes.worker(queue)
    processes.forwarder("--poll", "0.2")
    added = cli("add", "tick", "--kind", "rq", "--func", f"{JOBS}.record", "--queue", queue, "--every", "1",
                "--args", '["tick"]', "--ttl", "2")  # fmt: skip
    assert added.exit_code == 0, added.output
    wait_for(lambda: len(runs(conn, queue)) >= 2, 30, "runs while the worker is up")
    processes.launcher.stop(worker, timeout=30)
    down = now_ms()
    time.sleep(7.0)  # the outage: seven runs are enqueued meanwhile
    up = now_ms()
    processes.worker(queue)
    wait_for(lambda: any(r["periodic"]["due"] > up for r in runs(conn, queue)), 30, "a run after the restart")
    time.sleep(1.0)  # the runs queued during the outage have been dequeued by now (and run, had they lived)
    stale = [r for r in runs(conn, queue) if down + 500 < r["periodic"]["due"] < up - 3000]
    assert stale == [], f"{len(stale)} runs enqueued during the outage ran late: {stale}"


@pytest.mark.parametrize("func", ["not a path", "report", "myapp.", "1app.report"])
def test_a_function_that_is_no_import_path_is_refused_when_added(cli: Invoke, prefix: str, func: str) -> None:
    result = cli("add", "x", "--kind", "rq", "--func", func, "--queue", f"{prefix}-q", "--every", "5")
    assert result.exit_code == 2, result.output
    assert f"--func {func!r} is not an import path: give the function as module.function" in result.output
    with pytest.raises(PeriodicError, match="is not an import path"):  # the Python API's (and the HTTP API's) too
        runtime_entry("x", func, queue="q", schedule=Every(5000))


def test_options_of_the_other_kind_or_bad_values_get_one_clear_line(cli: Invoke, prefix: str) -> None:
    rq = ["--kind", "rq", "--func", f"{JOBS}.record", "--queue", f"{prefix}-q", "--every", "5"]
    for extra, says in (
        (["--priority", "3"], "--priority: priority is an option of celery entries, not rq ones"),
        (["--timeout", "soon"], "--timeout: timeout='soon': give a whole number"),
        (["--meta", "[1]"], "--meta: meta=[1]: give a JSON object"),
        (["--retry-intervals", "5"], "retry_intervals need retry_max"),
        (["--on-failure", "print"], "on_failure 'print' is not an import path"),
    ):
        result = cli("add", "x", *rq, *extra)
        assert result.exit_code == 2 and says in result.output, (extra, result.output)
    with pytest.raises(PeriodicError, match="expires is an option of celery entries"):
        RunOptions.parse({"expires": 5}, "rq")
