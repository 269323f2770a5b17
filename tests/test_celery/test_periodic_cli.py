"""``delayq periodic add|update|show|list|pause|resume|run|backfill|remove`` in process, against
a real server (the store options from DELAYQ_* variables, as deployed); bad input gets one
clear line naming the fix."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.envelope import Envelope
from delayq_backends.periodic import ops
from delayq_backends.periodic.schedules import Cron, Every, Once
from delayq_backends.periodic.state import state_of

Invoke = Callable[..., Result]


@pytest.fixture
def cli(valkey_url: str, prefix: str, vstore: DelayStore) -> Invoke:
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4"}

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, ["periodic", *args], env=env)

    return invoke


def _state(store: DelayStore, name: str) -> object:
    item = store.get(ops.item_id(name))
    assert item is not None
    return state_of(Envelope.decode(item.envelope))


def test_add_show_list_update_and_remove(cli: Invoke, vstore: DelayStore) -> None:
    added = cli("add", "report", "--task", "app.report", "--cron", "30 2 * * 1-5", "--tz", "Europe/Berlin",
                "--args", '[1, "x"]', "--kwargs", '{"k": 2}', "--queue", "reports", "--jitter", "5",
                "--max-runs", "3", "--misfire", "skip", "--overlap", "skip")  # fmt: skip
    assert added.exit_code == 0 and added.output.strip() == "added: report", added.output
    state = _state(vstore, "report")
    assert state.schedule == Cron("30 2 * * 1-5", "Europe/Berlin")  # type: ignore[attr-defined]
    assert (state.jitter_ms, state.max_runs, state.misfire.policy, state.overlap) == (5000, 3, "skip", "skip")  # type: ignore[attr-defined]
    shown = json.loads(cli("show", "report", "--json").output)
    assert (shown["task"], shown["source"], shown["tz"], shown["kind"]) == (
        "app.report",
        "runtime",
        "Europe/Berlin",
        "celery",
    )
    listed = cli("list")
    assert listed.exit_code == 0 and "app.report" in listed.output and "runtime" in listed.output
    assert cli("add", "report", "--task", "x", "--every", "5").exit_code == 1  # exists: use update
    updated = cli("update", "report", "--task", "app.report", "--every", "30", "--paused")
    assert updated.output.strip() == "changed: report", updated.output
    assert _state(vstore, "report").schedule == Every(30_000) and not _state(vstore, "report").enabled  # type: ignore[attr-defined]
    assert cli("remove", "report").output.strip() == "removed: report" and ops.get(vstore, "report") is None


def test_pause_resume_run_and_backfill(cli: Invoke, vstore: DelayStore) -> None:
    assert cli("add", "tick", "--task", "t", "--every", "60").exit_code == 0
    paused = cli("pause", "tick")
    assert paused.exit_code == 0 and "pause: tick (paused" in paused.output and "next run -" in paused.output
    resumed = cli("resume", "tick")
    assert "resume: tick (scheduled" in resumed.output
    assert "1 run(s) asked" in cli("run", "tick").output
    backfilled = cli("backfill", "tick", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T00:10:00Z")
    assert backfilled.exit_code == 0 and "1 backfill(s) asked" in backfilled.output, backfilled.output
    assert len(_state(vstore, "tick").backfill) == 1  # type: ignore[attr-defined]


def test_a_one_off_entry(cli: Invoke, vstore: DelayStore) -> None:
    assert cli("add", "once", "--task", "t", "--at", "2030-01-01T09:00:00+01:00").exit_code == 0
    assert _state(vstore, "once").schedule == Once(1893484800000)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add", "x", "--task", "t"], "exactly one of --every"),
        (["add", "x", "--task", "t", "--every", "5", "--cron", "* * * * *"], "exactly one of --every"),
        (["add", "x", "--task", "t", "--every", "5", "--tz", "Europe/Berlin"], "--tz applies to --cron only"),
        (["add", "x", "--task", "t", "--cron", "61 * * *"], "five fields"),
        (  # the zone is blamed, not the crontab, with what to give
            ["add", "x", "--task", "t", "--cron", "0 * * * *", "--tz", "Mars/Base"],
            "Invalid value for --tz: time zone 'Mars/Base' is unknown: use an IANA name such as 'Europe/Berlin', UTC",
        ),
        (["add", "x", "--task", "t", "--every", "5", "--args", "{"], "not JSON"),
        (["add", "x", "--task", "t", "--every", "5", "--args", '{"a": 1}'], "must be an array"),
        (["add", "x", "--task", "t", "--every", "5", "--kwargs", "[1]"], "must be an object"),
        (["add", "x", "--task", "t", "--at", "2030-01-01T09:00:00"], "zone"),
        (["add", "x", "--task", "t", "--every", "0"], "at least 1 ms"),
        (
            ["add", "x", "--task", "t", "--every", "5", "--start", "2030-02-01T00:00Z", "--end", "2030-01-01T00:00Z"],
            "end is before its start",
        ),  # fmt: skip
        (["update", "ghost", "--task", "t", "--every", "5"], "periodic list"),
        (["pause", "ghost"], "no periodic entry 'ghost'"),
        (["show", "ghost"], "no periodic entry 'ghost'"),
        (["backfill", "ghost", "--from", "yesterday", "--to", "2030-01-01T00:00Z"], "cannot parse 'yesterday'"),
    ],
)
def test_bad_input_gets_one_clear_line(cli: Invoke, args: list[str], says: str) -> None:
    result = cli(*args)
    assert result.exit_code in (1, 2) and says in result.output, result.output
    assert "Traceback" not in result.output
