"""RQ periodic entries listed by a plain ``delayq`` process, which imported no adapter: ``periodic
list|show`` load the RQ adapter to show the kind and function, ``delayq list`` shows the entry's
next run (job id, function) as it shows a Celery entry's; with RQ not installed, the listing
still works, without the function."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from delayq_backends import DelayStore
from delayq_backends.periodic import ops
from delayq_backends.periodic.schedules import run_task_id
from delayq_backends.periodic.writes import read_entry
from delayq_backends.rq.cron import entry as cron_entry
from tests.harness import make_store
from tests.harness.launch import checkout_env
from tests.test_first_contact import BLOCKER

FUNC = "tests.test_rq.jobs.record"


@pytest.fixture
def vstore(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    s = make_store(valkey_url, prefix, shards=4)
    ops.upsert(
        s, cron_entry("nightly", FUNC, "reports", cron="0 2 * * *", tz="UTC", args=("x",)).spec(source="runtime")
    )
    yield s
    s.client.close()


def _delayq(store: DelayStore, *args: str, block: str = "") -> subprocess.CompletedProcess[str]:
    """``delayq ARGS`` in a fresh process (nothing imported yet), ``block`` modules not installed."""
    env = checkout_env(DELAYQ_URL=store.config.url, DELAYQ_PREFIX=store.config.prefix, DELAYQ_SHARDS="4")
    if block:
        env.update(DELAYQ_TEST_BLOCK=block, PYTHONPATH=f"{BLOCKER}:{env['PYTHONPATH']}")
    done = subprocess.run(
        [sys.executable, "-m", "delayq_backends.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


def test_periodic_list_and_show_name_an_rq_entrys_kind_and_function(vstore: DelayStore) -> None:
    [listed] = json.loads(_delayq(vstore, "periodic", "list", "--json").stdout)
    assert (listed["name"], listed["kind"], listed["task"]) == ("nightly", "rq", FUNC)
    shown = json.loads(_delayq(vstore, "periodic", "show", "nightly", "--json").stdout)
    assert (shown["kind"], shown["task"]) == ("rq", FUNC)
    assert FUNC in _delayq(vstore, "periodic", "list").stdout


def test_delayq_list_shows_an_rq_entrys_next_run_as_a_celery_entrys(vstore: DelayStore) -> None:
    status = ops.get(vstore, "nightly")
    assert status is not None and status.next_run_ms is not None
    [item] = json.loads(_delayq(vstore, "list", "--json").stdout)
    slot = run_task_id("nightly", read_entry(vstore, "nightly").state.slot)  # type: ignore[union-attr]
    assert item["task"] == {
        "id": slot,
        "task": FUNC,
        "description": f"{FUNC}('x')",
        "queue": "reports",
        "periodic": "nightly",
    }
    assert FUNC in _delayq(vstore, "list").stdout  # the table's "runs" column


def test_without_rq_installed_the_listings_still_work_without_the_function(vstore: DelayStore) -> None:
    [listed] = json.loads(_delayq(vstore, "periodic", "list", "--json", block="rq").stdout)
    assert (listed["name"], listed["kind"], listed["task"], listed["state"]) == (
        "nightly",
        "rq-periodic",
        "",
        "scheduled",
    )
    [item] = json.loads(_delayq(vstore, "list", "--json", block="rq,celery").stdout)
    assert item["id"] == "periodic:nightly" and item["task"] is None
