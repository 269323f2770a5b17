"""Trust follows the role that wrote it (issue 30, findings 1 and 5): an RQ periodic entry's
template is code an ``rq worker`` runs, so a producer credential must not be able to make one a
forwarder fires; and the code schedule's record is the operator's and forwarder's alone.

Real parts: the ACL users ``delayq acl`` makes (Function library), a real ``delayq forward``, a
real ``rq worker``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from delayq_backends import Config, DelayStore, Envelope
from delayq_backends.cli import main
from delayq_backends.connection import connect
from delayq_backends.errors import NotDurableError
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import periodic_code_key, periodic_key, periodic_trust_key
from delayq_backends.periodic import ops, trust
from delayq_backends.periodic.registry import record_code_sync
from delayq_backends.periodic.schedules import interval
from delayq_backends.periodic.state import CODE, with_state
from delayq_backends.periodic.trust import UntrustedError
from delayq_backends.rq.cron import entry as cron_entry
from delayq_backends.rq.cron import runtime_entry
from delayq_backends.rq.entries import KIND, JobTemplate, RQPeriodicTarget, RQRunTarget, run_envelope
from delayq_backends.scripts import function_name
from delayq_backends.targets import RedisListTarget
from delayq_backends.timeutil import from_ms
from tests.harness import Launcher
from tests.harness.rq import SHARDS, Processes, runs
from tests.helpers import wait_for
from tests.test_security import Admin, open_store, user_url

RECORD = "tests.test_rq.jobs.record"


@pytest.fixture
def admin(valkey_url: str) -> Iterator[Admin]:
    client = redis.Redis.from_url(valkey_url)
    found = Admin(client, valkey_url, int(client.connection_pool.connection_kwargs["port"]))
    found.install_functions()
    yield found
    found.clean_up()


def _users(admin: Admin, prefix: str, *roles: str) -> dict[str, str]:
    """An ACL user per role (and the forwarder's), by role: its URL."""
    return {role: user_url(admin, prefix, role) for role in ("forwarder", *roles)}


def _stores(urls: dict[str, str], prefix: str) -> dict[str, DelayStore]:
    """A store per role's user; the forwarder's first, recording the prefix's metadata."""
    stores = {role: open_store(url, prefix) for role, url in urls.items()}
    stores["forwarder"].check_meta()
    return stores


def _planted(producer: DelayStore, name: str, func: str, queue: str, args: list[str]) -> str:
    """What a producer can write: an RQ entry's item for ``func`` (built as ``delayq periodic add
    --kind rq`` builds one, in its own memory) and a stored run of it; returns the run's id."""
    spec = runtime_entry(name, func, queue=queue, schedule=interval(1), args=args)
    now = producer.clock()
    producer.schedule(ops.item_id(name), from_ms(now), with_state(spec.template.envelope, spec.state(None, now)))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    template = JobTemplate.from_envelope(spec.template.envelope)
    producer.schedule(run_id, from_ms(now), run_envelope(template, run_id, {}, name))
    return run_id


def test_a_producer_cannot_make_an_rq_worker_run_its_function(
    admin: Admin, valkey_url: str, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    """Finding 1: a producer planted an entry for os.system and an rq worker ran it every period.
    Now the forwarder dead-letters it (and a planted run) naming the fix, nothing reaches RQ, and
    an operator's entry on the same queue runs."""
    urls = _users(admin, prefix, "producer", "operator")
    stores = _stores(urls, prefix)
    producer, operator, forwarder = stores["producer"], stores["operator"], stores["forwarder"]
    queue, marker = f"{prefix}-q", tmp_path / "ran"
    run_id = _planted(producer, "evil", "os.system", queue, [f"touch {marker}"])
    stored = forwarder.get(ops.item_id("evil"))
    assert stored is not None
    digest = JobTemplate.from_envelope(Envelope.decode(stored.envelope)).digest()
    trusted = periodic_trust_key(prefix)
    for hostile in (
        ("HSET", trusted, "evil", digest),
        ("FCALL", function_name("periodic_trust"), 1, trusted, "add", "evil", digest),
        ("HSET", periodic_key(prefix), "evil", ops.item_id("evil")),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.client.execute_command(*hostile)
    assert ops.upsert(operator, runtime_entry("good", RECORD, queue=queue, schedule=interval(1), args=["good"]))

    env = Processes(procs, valkey_url, prefix).env
    procs.delayq("forward", "--url", urls["forwarder"], "--rq-redis", valkey_url, env=env)
    procs.python("-m", "rq.cli", "worker", "-u", valkey_url, "-q", queue, env=env)
    conn = admin.client
    wait_for(lambda: len(runs(conn, queue)) >= 2, 30, "the operator's entry to run twice in the rq worker")
    dead = {d.id: d for d in forwarder.dead_letters()}
    wait_for(lambda: dead.update({d.id: d for d in forwarder.dead_letters()}) or len(dead) == 2, 20, "2 dead letters")
    assert set(dead) == {ops.item_id("evil"), run_id}
    for letter in dead.values():
        assert "not the one an operator defined" in letter.error and "delayq periodic trust evil" in letter.error
        assert "delayq dlq requeue" in letter.error
    wait_for(lambda: conn.llen(f"rq:queue:{queue}") == 0, 20, "the worker to take every queued job")
    assert not marker.exists(), "a producer's function ran in the rq worker"
    assert {r["tag"] for r in runs(conn, queue)} == {"good"}


def test_only_an_operator_vouches_and_every_defining_path_records_its_definition(
    admin: Admin, valkey_url: str, prefix: str
) -> None:
    """`delayq periodic add --kind rq` (operator), a sync from code (forwarder) record their
    templates; `run now` records nothing (a producer's planted template stays refused); the
    operator's `periodic trust` makes a stored entry fire; a removed entry's definition goes."""
    urls = _users(admin, prefix, "producer", "operator", "worker")
    stores = _stores(urls, prefix)
    forwarder, operator = stores["forwarder"], stores["operator"]
    queue = f"{prefix}-q"
    for role in ("producer", "worker"):  # neither may vouch, by script or by hand
        with pytest.raises(redis.exceptions.NoPermissionError):
            ops.upsert(stores[role], runtime_entry("x", RECORD, queue=queue, schedule=interval(60)))
    cli = CliRunner().invoke(main, [
        "periodic", "add", "nightly", "--kind", "rq", "--func", RECORD, "--queue", queue, "--every", "60",
        "--url", urls["operator"], "--prefix", prefix, "--shards", str(SHARDS), "--rq-redis", valkey_url,
    ])  # fmt: skip
    assert cli.exit_code == 0, cli.output
    code = cron_entry("from-code", RECORD, queue, interval=60).spec(source=CODE)
    assert ops.sync_code(forwarder, [code], kind=KIND, version=1).added == ["from-code"]
    planted = _planted(stores["producer"], "planted", RECORD, queue, ["p"])
    ops.run_now(operator, "planted")  # asks for a run: vouches for nothing

    rq_target = RQRunTarget(admin.client)
    fwd = Forwarder(forwarder, [RQPeriodicTarget(rq_target), rq_target], retry_delay=0.05)
    for name in ("nightly", "from-code"):
        ops.run_now(operator, name)
    wait_for(lambda: fwd.run_once() == 0 and len(forwarder.dead_letters()) == 2, 10, "one pass over the items")
    assert {d.id for d in forwarder.dead_letters()} == {ops.item_id("planted"), planted}
    assert len(admin.client.lrange(f"rq:queue:{queue}", 0, -1)) == 2  # nightly's and from-code's runs

    shown = CliRunner().invoke(main, [
        "periodic", "trust", "planted", "nightly", "missing", "--url", urls["operator"], "--prefix", prefix,
        "--shards", str(SHARDS),
    ])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert f"planted: trusted: runs {RECORD}" in shown.output and "missing: not found" in shown.output
    forwarder.requeue_dead([ops.item_id("planted")])
    wait_for(lambda: fwd.run_once() >= 0 and admin.client.llen(f"rq:queue:{queue}") == 3, 10, "the vouched run")
    ops.remove(operator, ["nightly"])
    assert admin.client.hget(periodic_trust_key(prefix), "nightly") is None


def test_the_code_schedule_record_is_the_operators_and_a_missing_one_lets_no_old_deploy_win(
    admin: Admin, prefix: str
) -> None:
    """Finding 5: a producer deleted the record and a late old forwarder's sync restored an entry
    the newer deploy removed. Now neither producer nor worker may write it, and with the record
    gone (an admin's hand) an old deploy's different set is refused while the current one
    records itself again."""
    stores = _stores(_users(admin, prefix, "producer", "worker", "operator"), prefix)
    forwarder, operator = stores["forwarder"], stores["operator"]
    queue = f"{prefix}-q"
    a, b = (cron_entry(n, RECORD, queue, interval=60).spec(source=CODE) for n in ("a", "b"))
    assert ops.sync_code(operator, [a, b], kind=KIND, version=1).added == ["a", "b"]
    assert ops.sync_code(forwarder, [a], kind=KIND, version=2).removed == ["b"]
    record = periodic_code_key(prefix)
    for role in ("producer", "worker"):
        for hostile in (
            ("DEL", record),
            ("HSET", record, f"{KIND}:version", "0"),
            ("FCALL", function_name("sync_version"), 1, record, "1", "fp", "h", 0, KIND),
            ("FCALL", function_name("rearm"), 5, *stores[role].keys(0).all()[:5], "", "", 0, "w", "x", 0, "e", 0),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                stores[role].client.execute_command(*hostile)

    admin.client.delete(record)
    late = ops.sync_code(forwarder, [a, b], kind=KIND, version=1)  # the late old forwarder
    assert "is missing" in late.refused and "['b']" in late.refused and "HSET" in late.refused
    assert ops.get(forwarder, "b") is None
    current = ops.sync_code(forwarder, [a], kind=KIND, version=2)  # the current deploy: no change
    assert not current.refused and current.unchanged == ["a"]
    assert "older" in ops.sync_code(forwarder, [a, b], kind=KIND, version=1).refused
    assert ops.get(forwarder, "b") is None
    # an older deploy that lacks a newer entry changes none of its own: with no record it
    # removes nothing (the newer entry is kept), and a sync with the record removes as usual
    c = cron_entry("c", RECORD, queue, interval=60).spec(source=CODE)
    assert ops.sync_code(forwarder, [a, c], kind=KIND, version=3).added == ["c"]
    admin.client.delete(record)
    lacking = ops.sync_code(forwarder, [a], kind=KIND)
    assert not lacking.refused and lacking.removed == [] and lacking.kept == 1 and ops.get(forwarder, "c")
    assert ops.sync_code(forwarder, [a], kind=KIND).removed == ["c"]


def test_garbage_in_the_trusted_definitions_never_stops_the_line(admin: Admin, prefix: str) -> None:
    """Each role's credential writing the trusted definitions: producer, worker and reader are
    refused (by hand and by script), operator and forwarder may. Then an admin's hand write: the
    key of another type makes RQ entries wait (no dead letter, the fix logged) while other items
    flow; a value that is no digest refuses only its own entry; an operator's next definition
    replaces it."""
    stores = _stores(_users(admin, prefix, "operator", "producer", "worker", "reader"), prefix)
    forwarder, operator = stores["forwarder"], stores["operator"]
    trusted = periodic_trust_key(prefix)
    by_script = ("FCALL", function_name("periodic_trust"), 1, trusted, "add", "e", "ab" * 32)
    for role in ("producer", "worker", "reader"):
        for hostile in (("HSET", trusted, "e", "ab" * 32), ("DEL", trusted), by_script):
            with pytest.raises(redis.exceptions.NoPermissionError):
                stores[role].client.execute_command(*hostile)
    for role in ("operator", "forwarder"):
        assert stores[role].client.execute_command(*by_script) in (0, 1)
    queue = f"{prefix}-q"
    assert ops.upsert(operator, runtime_entry("e", RECORD, queue=queue, schedule=interval(1)))
    admin.client.delete(trusted)
    admin.client.set(trusted, "garbage")
    rq_target = RQRunTarget(admin.client)
    fwd = Forwarder(forwarder, [RQPeriodicTarget(rq_target), rq_target, RedisListTarget(admin.client)])
    operator.schedule("plain", 0, RedisListTarget.envelope(f"{prefix}-out", b"x"))
    wait_for(lambda: fwd.run_once() >= 0 and admin.client.llen(f"{prefix}-out") == 1, 10, "the list item")
    assert forwarder.dead_letters() == [] and admin.client.llen(f"rq:queue:{queue}") == 0
    with pytest.raises(UntrustedError, match="RENAME"):
        ops.upsert(operator, runtime_entry("e2", RECORD, queue=queue, schedule=interval(1)))
    synced = ops.sync_code(forwarder, [cron_entry("c", RECORD, queue, interval=60).spec(source=CODE)], kind=KIND)
    assert "RENAME" in synced.errors["c"] and not synced.refused  # said per entry; the sync goes on

    admin.client.delete(trusted)
    admin.client.hset(trusted, "e", "zz not-a-digest")
    wait_for(lambda: fwd.run_once() >= 0 and len(forwarder.dead_letters()) == 1, 10, "e refused alone")
    forwarder.requeue_dead()
    assert ops.upsert(operator, runtime_entry("e", RECORD, queue=queue, schedule=interval(1), args=["v2"]))
    wait_for(lambda: fwd.run_once() >= 0 and admin.client.llen(f"rq:queue:{queue}") >= 1, 10, "e's run")


def test_the_definitions_and_the_version_record_wait_for_replicas(valkey_url: str, prefix: str) -> None:
    """durable_replicas: both new writes on the prefix's own keys are sent with a WAIT (the
    embedded server has no replica, so each is refused as not durable, never acknowledged)."""
    store = DelayStore(
        connect(valkey_url), Config(prefix=prefix, shards=SHARDS, durable_replicas=1, durable_timeout_ms=50)
    )
    with pytest.raises(NotDurableError):
        trust.record(store, "x", "ab" * 32)
    with pytest.raises(NotDurableError):
        record_code_sync(store, 1, "fp", kind=KIND)
