"""``delayq groups list|show|set|pause|resume`` and the busiest groups in ``delayq stats``, run in
process against a real server: what the commands write is the store's, what they print is the
store's, and bad input is one line naming the fix with nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.store import SlotAsk
from tests.harness import make_store

SHARDS = 4
HOLD = 600_000  # ms: no hold lapses while a test runs

Invoke = Callable[..., Result]


def expect(result: Result, code: int = 0) -> str:
    """The output of a run that ended with ``code`` by design, never by an uncaught exception."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.output


@pytest.fixture
def cli(valkey_url: str, prefix: str) -> Invoke:
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": str(SHARDS), "COLUMNS": "200"}

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), env=env)

    return invoke


@pytest.fixture
def store(valkey_url: str, prefix: str) -> DelayStore:
    made = make_store(valkey_url, prefix, shards=SHARDS)
    made.check_meta()
    return made


def run(store: DelayStore, key: str, running: int) -> None:
    """``running`` items of group ``key`` hold a place in its limit (taken as a forwarder takes them)."""
    store.take_slots({key: SlotAsk(running, [(f"{key}-{i}", i) for i in range(running)])}, hold_ms=HOLD, wait_ms=HOLD)


def test_set_pause_resume_write_the_store_and_show_and_list_read_it(cli: Invoke, store: DelayStore) -> None:
    assert "group 'tenant-7': limit 2, rate 10/s, weight 3.0" in expect(
        cli("groups", "set", "tenant-7", "--limit", "2", "--rate", "10/s", "--weight", "3")
    )
    policy = store.group_policy("tenant-7")
    assert (policy.limit, policy.rate, policy.weight) == (2, "10/s", 3)
    expect(cli("groups", "set", "tenant-7", "--rate", "none"))
    policy = store.group_policy("tenant-7")
    assert (policy.limit, policy.rate, policy.weight) == (2, None, 3), "only the part given changes"

    assert "paused by oncall" in expect(cli("groups", "pause", "tenant-7", "--by", "oncall"))
    assert store.group_policy("tenant-7").paused
    shown = json.loads(expect(cli("groups", "show", "tenant-7", "--json")))
    assert (shown["paused_by"], shown["held"], shown["limit"]) == ("oncall", "paused", 2)
    assert "paused by oncall" in expect(cli("groups", "show", "tenant-7"))
    expect(cli("groups", "resume", "tenant-7"))
    assert not store.group_policy("tenant-7").paused
    assert "releasing" in expect(cli("groups", "show", "tenant-7"))

    run(store, "busy", 3)
    listed = json.loads(expect(cli("groups", "list", "--json")))
    assert [g["key"] for g in listed["page"]] == ["busy", "tenant-7"]
    assert (listed["groups"], listed["running"], listed["paused"]) == (2, 3, 0)
    table = expect(cli("groups", "list"))
    assert "busy" in table and "tenant-7" in table and "releasing" in table
    paged = expect(cli("groups", "list", "--limit", "1"))
    assert "tenant-7" not in paged and "more follow: --offset 1" in paged


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--limit", "two"], 2, "use a whole number >= 1, or none"),
        (["--weight", "heavy"], 2, "use a number > 0"),
        ([], 2, "give at least one of --limit, --rate, --weight"),
        (["--limit", "0", "--rate", "5/s"], 1, "limit"),
        (["--rate", "10 per second"], 1, "rate"),
        (["--weight", "-2"], 1, "weight"),
    ],
)
def test_a_bad_policy_is_one_line_and_writes_nothing(
    cli: Invoke, store: DelayStore, args: list[str], code: int, words: str
) -> None:
    store.set_group("k", limit=3)
    before = store.group_policy("k")
    out = expect(cli("groups", "set", "k", *args), code=code)
    assert words in out and "Traceback" not in out
    assert store.group_policy("k") == before, "a refused policy changes nothing"


def test_stats_names_the_busiest_groups_and_counts_all(cli: Invoke, store: DelayStore) -> None:
    for i in range(8):
        run(store, f"t-{i}", 1)
    run(store, "big", 4)
    store.pause_group("t-5")
    shown = json.loads(expect(cli("stats", "--json", "--groups", "2")))
    groups = shown["groups"]
    assert [g["key"] for g in groups["page"]] == ["big", "t-0"]
    assert (groups["groups"], groups["running"], groups["paused"]) == (9, 12, 1)
    table = expect(cli("stats"))
    assert "9 groups: 1 paused, 0 throttled" in table and "big" in table
    assert "groups" not in json.loads(expect(cli("stats", "--json", "--groups", "0")))
