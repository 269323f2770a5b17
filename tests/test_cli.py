"""The ``delayq`` command line on a real server: what each command shows and changes, clean
one-line errors (never a traceback), no password ever printed, and ``forward`` as a process."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.embedded import free_port
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import meta_key
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, make_store
from tests.helpers import wait_for

PASSWORD = "s3cret-pw"
CORRUPT = b"DQ\x00garbage"  # starts like an envelope, so the store accepts it; no format 0 exists
FAR = 4_000_000_000  # epoch seconds in 2096: never due during a test

Invoke = Callable[..., Result]


def expect(result: Result, code: int = 0) -> str:
    """The output of a run that ended with ``code`` by design, never by an uncaught exception."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.output


@pytest.fixture
def cli(valkey_url: str, prefix: str) -> Invoke:
    """Run ``delayq`` in process, configured through the DELAYQ_* env vars like a deployment."""
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4"}

    def invoke(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, list(args), env=env, input=input)

    return invoke


@pytest.fixture
def secret_url(valkey_url: str) -> Iterator[str]:
    """A URL with a user and password (an ACL user on the test server, removed afterwards)."""
    user = f"u{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(valkey_url)
    admin.acl_setuser(user, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], channels=["*"], commands=["+@all"])
    yield valkey_url.replace("redis://", f"redis://{user}:{PASSWORD}@")
    admin.acl_deluser(user)
    admin.close()


def envelope(key: str = "out", body: bytes = b"{}") -> bytes:
    return RedisListTarget.envelope(key, body).encode()


def bury(store: DelayStore, item_id: str) -> None:
    """Make ``item_id`` a dead letter the way production does: a forwarder that cannot read it."""
    store.schedule(item_id, time.time() - 1, CORRUPT)
    Forwarder(store, [RedisListTarget(store.client)]).run_once()  # type: ignore[arg-type]
    assert [d.id for d in store.dead_letters()] == [item_id]


# -- stats ------------------------------------------------------------------------------------


def test_stats_json_totals_match_what_was_scheduled(cli: Invoke, vstore: DelayStore) -> None:
    now = time.time()
    vstore.schedule_many([(f"due{i}", now - 60 - i, envelope()) for i in range(7)])
    vstore.schedule_many([(f"later{i}", now + 3600, envelope()) for i in range(5)])
    report = json.loads(expect(cli("stats", "--json")))
    assert report["totals"] == {
        "shard": "total",
        "scheduled": 12,
        "due": 7,
        "leased": 0,
        "dead": 0,
        "parked": 0,
        "next_due": report["totals"]["next_due"],
        "oldest_overdue_ms": report["totals"]["oldest_overdue_ms"],
    }
    assert [s["shard"] for s in report["shards"]] == [0, 1, 2, 3]
    for key in ("scheduled", "due", "leased", "dead"):
        assert sum(s[key] for s in report["shards"]) == report["totals"][key]
    earliest = datetime.fromisoformat(report["totals"]["next_due"].replace("Z", "+00:00"))
    assert abs(earliest.timestamp() - (now - 66)) < 0.01
    assert 66_000 <= report["totals"]["oldest_overdue_ms"] < 76_000


def test_stats_table_has_a_row_per_shard_and_totals(cli: Invoke, vstore: DelayStore) -> None:
    vstore.schedule_many([(f"due{i}", time.time() - 125.5, envelope()) for i in range(3)])
    out = expect(cli("stats"))
    assert len(re.findall(r"^│\s+[0-3] │", out, re.MULTILINE)) == 4
    assert re.search(r"total\s*│\s*3\s*│\s*3\s*│\s*0\s*│\s*0\s*│\s*0\s*│ \S+Z\s*│\s*2m 05s │", out), out


# -- list -------------------------------------------------------------------------------------


@pytest.fixture
def ten(vstore: DelayStore) -> list[str]:
    """Ten items a minute apart from FAR, scheduled out of order."""
    ids = [f"item-{i:02d}" for i in range(10)]
    vstore.schedule_many([(ids[i], FAR + 60 * i, envelope("q:out")) for i in (7, 2, 9, 0, 5, 1, 8, 3, 6, 4)])
    return ids


def listed(cli: Invoke, *args: str) -> list[str]:
    return [item["id"] for item in json.loads(expect(cli("list", "--json", *args)))]


def test_list_pages_items_in_ready_time_order(cli: Invoke, ten: list[str]) -> None:
    assert listed(cli) == ten
    assert listed(cli, "--offset", "3", "--limit", "4") == ten[3:7]
    table = expect(cli("list", "--limit", "4"))
    assert [table.index(i) for i in ten[:4]] == sorted(table.index(i) for i in ten[:4])
    assert ten[4] not in table and "--offset 4" in table


def test_list_window_takes_iso_times_with_a_zone_or_epoch_seconds(cli: Invoke, ten: list[str]) -> None:
    start = datetime.fromtimestamp(FAR + 120, timezone.utc)
    assert listed(cli, "--from", start.isoformat(), "--to", str(FAR + 300)) == ten[2:6]
    assert listed(cli, "--from", start.strftime("%Y-%m-%dT%H:%M:%SZ"), "--limit", "1") == ten[2:3]


def test_list_refuses_a_time_without_zone_and_names_the_fix(cli: Invoke, ten: list[str]) -> None:
    out = expect(cli("list", "--from", "2096-01-01T00:00:00"), code=2)
    assert "no time zone" in out and "2096-01-01T00:00:00Z" in out


def test_list_shows_destination_and_flags_corrupt_envelopes(cli: Invoke, vstore: DelayStore) -> None:
    vstore.schedule("good", FAR, envelope("q:out"))
    vstore.schedule("bad", FAR + 1, CORRUPT)
    good, bad = json.loads(expect(cli("list", "--json")))
    assert (good["target"], good["destination"], good["corrupt"], good["attempts"]) == ("list", "q:out", None, 0)
    assert good["ready"] == "2096-10-02T07:06:40.000Z" and good["size"] == len(envelope("q:out"))
    assert bad["target"] is None and "format version 0" in bad["corrupt"]
    table = expect(cli("list"))
    assert "list/q:out" in table and "<corrupt: envelope format version 0" in table


def test_list_names_a_newer_format_as_newer_not_corrupt(cli: Invoke, vstore: DelayStore) -> None:
    """A newer release's item (a rolling upgrade) is fine, only not readable by this reader."""
    newer = bytearray(envelope("q:out"))
    newer[2] = 99  # format version byte
    vstore.schedule("newer", FAR, bytes(newer))
    [entry] = json.loads(expect(cli("list", "--json")))
    assert entry["corrupt"] is None and entry["newer_format"] == 99
    table = expect(cli("list"))
    assert "<newer format 99: upgrade this reader>" in table and "corrupt" not in table


def test_list_shows_an_item_awaiting_its_start(cli: Invoke, vstore: DelayStore) -> None:
    """Lossless mode: a published item kept until a worker records its start says so."""
    vstore.schedule("kept", 1.0, envelope("q:out"))  # long due
    claim = vstore.claim(vstore.shard_of("kept"))
    assert vstore.keep(claim, {"kept": 60_000}) == 1
    [entry] = json.loads(expect(cli("list", "--json")))
    assert entry["awaiting_start"] is True and entry["leased_until"] is not None
    assert "(awaiting start)" in expect(cli("list"))


def test_list_refuses_a_shard_outside_the_layout(cli: Invoke) -> None:
    assert "use 0..3" in expect(cli("list", "--shard", "4"), code=2)


# -- cancel -----------------------------------------------------------------------------------


def test_why_says_it_in_one_line_or_as_json_and_exits_1_for_an_unknown_id(cli: Invoke, vstore: DelayStore) -> None:
    vstore.schedule("later", FAR, envelope())
    assert expect(cli("why", "later")) == "later: not due until 2096-10-02T07:06:40.000Z\n"
    answer = json.loads(expect(cli("why", "later", "--json")))
    assert (answer["state"], answer["until"], answer["ready"]) == (
        "scheduled",
        "2096-10-02T07:06:40.000Z",
        answer["until"],
    )
    bury(vstore, "broken")
    assert expect(cli("why", "broken")).startswith("broken: dead since ")
    assert "not scheduled and no dead letter" in expect(cli("why", "nope"), code=1)
    assert "U+0007" in expect(cli("why", "bell\x07"), code=1)


def test_cancel_removes_items_and_a_second_cancel_exits_1(cli: Invoke, vstore: DelayStore) -> None:
    vstore.schedule_many([("a", FAR, envelope()), ("b", FAR, envelope()), ("c", FAR, envelope())])
    out = expect(cli("cancel", "a", "b"))
    assert "cancelled a" in out and "cancelled b" in out
    assert not vstore.exists("a") and not vstore.exists("b") and vstore.exists("c")
    out = expect(cli("cancel", "c", "a"), code=1)
    assert "cancelled c" in out and "not found a" in out


# -- dead letters -----------------------------------------------------------------------------


def test_dlq_list_shows_a_dead_letter_and_requeue_puts_it_back(cli: Invoke, vstore: DelayStore) -> None:
    bury(vstore, "dead-1")
    (dead,) = json.loads(expect(cli("dlq", "list", "--json")))
    assert (dead["id"], dead["attempts"]) == ("dead-1", 1)
    assert "corrupt envelope" in dead["error"] and dead["died_at"].endswith("Z")
    assert "dead-1" in expect(cli("dlq", "list"))
    assert "requeued 1" in expect(cli("dlq", "requeue", "dead-1"))
    item = vstore.get("dead-1")
    assert item is not None and item.envelope == CORRUPT and item.attempts == 0
    assert json.loads(expect(cli("dlq", "list", "--json"))) == []
    assert "not dead letters" in expect(cli("dlq", "requeue", "dead-1"), code=1)


def test_dlq_purge_asks_first_and_refuses_to_guess(cli: Invoke, vstore: DelayStore) -> None:
    bury(vstore, "dead-2")
    assert "--all" in expect(cli("dlq", "purge"), code=2)
    assert "not both" in expect(cli("dlq", "purge", "dead-2", "--all"), code=2)
    assert "for good?" in expect(cli("dlq", "purge", "--all", input="n\n"), code=1)
    assert [d.id for d in vstore.dead_letters()] == ["dead-2"]
    assert "purged 1" in expect(cli("dlq", "purge", "dead-2", "--yes"))
    assert vstore.dead_letters() == [] and not vstore.exists("dead-2")


def test_dlq_requeue_all(cli: Invoke, vstore: DelayStore) -> None:
    bury(vstore, "dead-3")
    assert "requeued 1" in expect(cli("dlq", "requeue", "--all"))
    assert vstore.exists("dead-3") and vstore.dead_letters() == []


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["list"], ["cancel", "x"], ["dlq", "list"], ["forward"]])
def test_shard_mismatch_is_one_clean_line(cli: Invoke, vstore: DelayStore, command: list[str]) -> None:
    vstore.schedule("x", FAR, envelope())  # records 4 shards for the prefix
    out = expect(cli(*command, "--shards", "8"), code=1)
    assert out.startswith("Error: ") and "holds 4 shards" in out and "Traceback" not in out


@pytest.mark.parametrize("command", [["stats"], ["forward"]])
def test_a_shard_mismatch_is_named_even_where_the_counts_share_key_names(valkey_url: str, command: list[str]) -> None:
    """Under this prefix shard 0 of 4 is ``{prefix:0}``, as it is in layout 1 for every count:
    with --shards 8 the check read layout 1's keys and said "layout 2 but layout 1" (then, in the
    count check, that the keys were 8 shards'), never the wrong count. Found by a random prefix."""
    prefix = "t343ed84fdf7b"
    store = make_store(valkey_url, prefix, shards=4)
    try:
        store.schedule("x", FAR, envelope())
        env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix}
        out = expect(CliRunner().invoke(main, [*command, "--shards", "8"], env=env), code=1)
        assert out.startswith(f"Error: prefix {prefix!r} holds 4 shards") and "set shards=4" in out, out
    finally:
        store.client.delete(*store.client.keys(f"{prefix}:*"))
        store.client.close()


def test_read_only_commands_do_not_record_a_layout(cli: Invoke, vstore: DelayStore, prefix: str) -> None:
    expect(cli("stats", "--shards", "8"))
    expect(cli("list", "--shards", "8"))
    assert not vstore.client.exists(meta_key(prefix))
    vstore.schedule("x", FAR, envelope())  # the producer's 4 shards still go in


def test_unreachable_server_is_one_line_without_the_password(cli: Invoke) -> None:
    port = free_port()
    out = expect(cli("stats", "--url", f"redis://someone:{PASSWORD}@127.0.0.1:{port}/0"), code=1)
    assert out.startswith(f"Error: cannot use Redis at redis://someone:***@127.0.0.1:{port}/0") and PASSWORD not in out


def test_demo_prints_the_server_without_the_password(secret_url: str) -> None:
    out = expect(CliRunner().invoke(main, ["demo", "--url", secret_url, "--items", "20", "--spread", "0"]))
    assert PASSWORD not in out and ":***@127.0.0.1" in out and "20 distinct" in out


# -- forward, as a real process ---------------------------------------------------------------


def test_forward_delivers_everything_and_exits_0_on_sigterm(
    secret_url: str, prefix: str, tmp_path: Path, procs: Launcher
) -> None:
    store = make_store(secret_url, prefix, shards=4)
    key = f"{prefix}:out"
    store.schedule_many([(f"f{i}", time.time() - 1, envelope(key, str(i).encode())) for i in range(500)])
    log = tmp_path / "forward.log"
    env = {**os.environ, "DELAYQ_URL": secret_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": "4"}
    proc = procs.delayq("forward", "--poll", "0.2", env=env, log=log)
    wait_for(lambda: store.client.llen(key) >= 500 or proc.poll() is not None, 30, "500 items in the list")
    assert proc.poll() is None, log.read_text()
    assert procs.stop(proc) == 0, log.read_text()
    text = log.read_text()
    assert store.client.llen(key) == 500
    assert sorted(int(b) for b in store.client.lrange(key, 0, -1)) == list(range(500))
    assert sum(s.scheduled for s in store.stats()) == 0
    assert "forwarded 500," in text and "Traceback" not in text
    assert PASSWORD not in text and ":***@127.0.0.1" in text
    store.client.close()


# -- secrets out of the process list ----------------------------------------------------------


def test_forward_reads_its_urls_from_files_and_ps_never_shows_the_password(
    secret_url: str, prefix: str, tmp_path: Path, procs: Launcher
) -> None:
    store = make_store(secret_url, prefix, shards=4)
    key = f"{prefix}:out"
    store.schedule_many([(f"f{i}", time.time() - 1, envelope(key, str(i).encode())) for i in range(20)])
    (tmp_path / "url").write_text(secret_url + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    args = ["--url-file", str(tmp_path / "url"), "--list-redis-file", str(tmp_path / "url")]
    proc = procs.delayq("forward", "--prefix", prefix, "--shards", "4", *args, env=env, capture=True)
    wait_for(lambda: store.client.llen(key) >= 20 or proc.poll() is not None, 30, "20 items in the list")
    assert proc.poll() is None
    assert PASSWORD.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and PASSWORD.encode() not in out, out
    store.client.close()


def test_a_url_and_a_url_file_together_are_refused(cli: Invoke, valkey_url: str, tmp_path: Path) -> None:
    (tmp_path / "url").write_text(valkey_url)
    out = expect(cli("stats", "--url", valkey_url, "--url-file", str(tmp_path / "url")), code=2)
    assert "--url or --url-file, not both" in out
    assert "is empty" in expect(cli("stats", "--url-file", os.devnull), code=2)
    # the file wins over the env var (DELAYQ_URL is set by the fixture to the same server)
    assert expect(cli("stats", "--url-file", str(tmp_path / "url"), "--json"))


@pytest.mark.parametrize(
    "command, options",
    [
        (["stats"], ["--url-file", "DELAYQ_URL_FILE"]),
        (["forward"], ["--url-file", "--celery-broker-file", "--rq-redis-file", "--list-redis-file"]),
        (["rq-migrate"], ["--rq-redis-file"]),
        (["dashboard"], ["--url-file", "--celery-broker-file", "--rq-redis-file"]),
        (["acl"], ["--apply", "--password-file", "--url-file", "--functions / --eval"]),
        (["functions", "install"], ["--url-file"]),
    ],
)
def test_help_names_the_file_forms_of_secrets(command: list[str], options: list[str]) -> None:
    shown = expect(CliRunner().invoke(main, [*command, "--help"]))
    assert all(option in shown for option in options), shown


def test_functions_install_and_status(tmp_path: Path) -> None:
    from delayq_backends.embedded import EmbeddedServer
    from delayq_backends.scripts import LIBRARY

    with EmbeddedServer() as server:
        missing = CliRunner().invoke(main, ["functions", "status", "--url", server.url])
        assert missing.exit_code == 1 and f"{LIBRARY} MISSING" in missing.output
        installed = expect(CliRunner().invoke(main, ["functions", "install", "--url", server.url]))
        assert f"{LIBRARY} installed" in installed
        assert f"{LIBRARY} found" in expect(CliRunner().invoke(main, ["functions", "status", "--url", server.url]))
        store = make_store(server.url, "fn", shards=2)
        store.schedule("a", 1, envelope())
        assert store.scripts.backend().functions and [i.id for i in store.claim(store.shard_of("a")).items] == ["a"]


def test_list_shows_collapsed_calls_of_debounced_and_throttled_items(cli: Invoke, vstore: DelayStore) -> None:
    for _ in range(3):
        vstore.debounce("user-42", FAR, envelope())
    vstore.throttle("feed", FAR + 1, envelope())
    vstore.schedule("plain", FAR + 2, envelope())
    entries = {e["id"]: e["collapsed"] for e in json.loads(expect(cli("list", "--json")))}
    assert entries == {
        "debounce:user-42": {"mode": "debounce", "key": "user-42", "calls": 3},
        "throttle:feed": {"mode": "throttle", "key": "feed", "calls": 1},
        "plain": None,
    }
    table = expect(cli("list"))
    assert "debounced: 3 calls, key user-42" in table and "throttled: 1 call, key feed" in table
