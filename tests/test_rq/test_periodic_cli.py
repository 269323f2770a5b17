"""``delayq periodic add|update --kind rq``: an RQ runtime entry from the command line, built as the
HTTP API builds one (no allowlist: an operator's command), fired by a forwarder with --rq-redis."""

from __future__ import annotations

import json
from collections.abc import Callable

import click
import pytest
import redis
from click.testing import CliRunner, Result
from rq import Queue as RQQueue
from rq.job import Job

from delayq_backends import DelayStore
from delayq_backends.assemble import ProcessSettings, build_forwarder
from delayq_backends.cli import main
from delayq_backends.cli.periodic import PeriodicAccess, _entry
from delayq_backends.periodic import ops
from delayq_backends.periodic.schedules import Every, Misfire
from delayq_backends.rq.cron import runtime_entry
from tests.helpers import wait_for

FUNC = "tests.test_rq.jobs.record"
Invoke = Callable[..., Result]


@pytest.fixture
def cli(valkey_url: str, prefix: str, vstore: DelayStore) -> Invoke:
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4", "DELAYQ_RQ_REDIS": valkey_url}

    def invoke(*args: str, **env_extra: str) -> Result:
        return CliRunner().invoke(main, ["periodic", *args], env={**env, **env_extra})

    return invoke


def test_add_update_and_fire_an_rq_entry(cli: Invoke, vstore: DelayStore, conn: redis.Redis, prefix: str) -> None:
    queue = f"{prefix}-q"
    added = cli("add", "nightly", "--kind", "rq", "--func", FUNC, "--queue", queue, "--every", "60",
                "--args", '["cli"]', "--misfire", "run_all", "--jitter", "2")  # fmt: skip
    assert added.exit_code == 0 and "added: nightly" in added.output, added.output
    assert f"no RQ worker listens on queue {queue!r}" in added.output  # stderr is mixed into output here
    shown = json.loads(cli("show", "nightly", "--json").output)
    assert (shown["kind"], shown["task"], shown["source"], shown["misfire"]) == (
        "rq",
        FUNC,
        "runtime",
        "run_all (max 100)",
    )
    # the same definition as the HTTP API's shared builder: the CLI adds nothing of its own
    same = runtime_entry("nightly", FUNC, queue=queue, schedule=Every(60_000), args=["cli"],
                         misfire=Misfire("run_all"), jitter_ms=2000)  # fmt: skip
    assert ops.upsert(vstore, same) == "unchanged"
    updated = cli("update", "nightly", "--kind", "rq", "--func", FUNC, "--queue", queue, "--every", "30",
                  "--args", '["cli2"]')  # fmt: skip
    assert updated.exit_code == 0 and "changed: nightly" in updated.output, updated.output
    ops.run_now(vstore, "nightly")
    settings = ProcessSettings(store=vstore.config, rq_redis=vstore.config.url, list_target=False, rq_adopt=False)
    with build_forwarder(settings, store=vstore) as forwarder:
        # due at the store's "now", rounded up to the next ms: not yet for a claim in the same ms
        # (the forwarder was built in 0.5-0.8 ms), so a single burst could find nothing
        wait_for(lambda: forwarder.run_until_idle().forwarded > 0, 5, "the manual run forwarded")
    [job_id] = RQQueue(queue, connection=conn).job_ids
    job = Job.fetch(job_id, connection=conn)
    assert (job.func_name, job.args) == (FUNC, ("cli2",))


def test_an_rq_cron_with_both_day_fields_runs_on_either_day(cli: Invoke, prefix: str) -> None:
    """As `rq cron` reads '0 9 1 * 1': the 1st and every Monday (a Celery entry: a Monday the 1st)."""
    added = cli("add", "either", "--kind", "rq", "--func", FUNC, "--queue", f"{prefix}-q", "--cron", "0 9 1 * 1")
    assert added.exit_code == 0, added.output
    shown = json.loads(cli("show", "either", "--json").output)
    assert shown["schedule"] == "crontab 0 9 1 * 1 (UTC, either day)"


def test_update_keeps_an_intervals_alignment_unless_told(cli: Invoke, prefix: str) -> None:
    rq = ["--kind", "rq", "--func", FUNC, "--queue", f"{prefix}-q"]

    def schedule_after(*args: str) -> str:
        result = cli(*args)
        assert result.exit_code == 0, result.output
        return str(json.loads(cli("show", "tick", "--json").output)["schedule"])

    assert schedule_after("add", "tick", *rq, "--every", "60", "--aligned") == "every 0:01:00 (aligned)"
    assert schedule_after("update", "tick", *rq, "--every", "120") == "every 0:02:00 (aligned)"
    assert schedule_after("update", "tick", *rq, "--every", "120", "--not-aligned") == "every 0:02:00"
    assert schedule_after("update", "tick", *rq, "--every", "60") == "every 0:01:00"
    refused = cli("update", "tick", *rq, "--cron", "* * * * *", "--aligned")
    assert refused.exit_code == 2 and "--every only" in refused.output, refused.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kind", "rq", "--func", FUNC, "--every", "5"], "--kind rq needs --func module.function and --queue"),
        (["--kind", "rq", "--task", "t", "--func", FUNC, "--queue", "q", "--every", "5"], "an RQ entry names"),
        (["--func", FUNC, "--queue", "q", "--every", "5"], "add --kind rq"),
        (["--every", "5"], "a Celery entry needs --task"),
        (["--kind", "rq", "--func", FUNC, "--queue", "q", "--every", "5", "--args", "{}"], "must be an array"),
    ],
)
def test_bad_rq_input_gets_one_clear_line(cli: Invoke, args: list[str], says: str) -> None:
    result = cli("add", "x", *args)
    assert result.exit_code == 2 and says in result.output, result.output


def test_an_rq_entry_needs_rq_redis(cli: Invoke) -> None:
    result = cli("add", "x", "--kind", "rq", "--func", FUNC, "--queue", "q", "--every", "5", DELAYQ_RQ_REDIS="")
    assert result.exit_code == 2 and "--kind rq needs --rq-redis URL" in result.output, result.output


def test_the_help_says_no_allowlist_applies(cli: Invoke) -> None:
    assert "Not checked against an allowlist" in " ".join(cli("add", "--help").output.split())


def test_the_celery_group_sends_rq_entries_to_delayq_periodic() -> None:
    """``celery -A proj delayq periodic add --kind rq`` has no RQ Redis: it names the command that has."""
    celery_group = PeriodicAccess(lambda c: c, lambda ctx, where: None, lambda ctx, where: None)  # type: ignore[arg-type,return-value]
    d = {"kind": "rq", "task": None, "func": FUNC, "queue": "q"}
    with pytest.raises(click.UsageError, match="delayq periodic add --kind rq --rq-redis"):
        _entry(celery_group, click.Context(click.Command("add")), {}, d, None)  # type: ignore[arg-type]
