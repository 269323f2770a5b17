"""`delayq rq-migrate` and `delayq forward --rq-redis`, through the real command line."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis
import rq_scheduler
from click.testing import CliRunner
from rq import Queue as RQQueue
from rq.job import JobStatus
from rq.registry import ScheduledJobRegistry

from delayq_backends import Config, DelayStore, Envelope
from delayq_backends.cli import main
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import Queue, RQTarget
from delayq_backends.rq.jobs import AT_FRONT_RANK
from delayq_backends.rq.migrate import RQ_SCHEDULER_KEY
from tests.harness.rq import SHARDS, Processes, runs
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"


@pytest.fixture
def own_db(valkey_url: str) -> Iterator[str]:
    """A database of the embedded Valkey for this test alone: the migration scans RQ's global keys."""
    url = valkey_url.rsplit("/", 1)[0] + "/13"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def migrate(url: str, prefix: str) -> str:
    args = ["rq-migrate", "--url", url, "--rq-redis", url, "--prefix", prefix, "--shards", str(SHARDS)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result.output


def test_rq_migrate_moves_both_kinds_once_and_twice_changes_nothing(own_db: str, prefix: str) -> None:
    conn = redis.Redis.from_url(own_db)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    plain = RQQueue("mig", connection=conn)
    registry_jobs = [plain.enqueue_at(later + timedelta(seconds=i), RECORD, i) for i in range(30)]
    in_front = plain.enqueue_at(later, RECORD, "front", at_front=True)
    old = rq_scheduler.Scheduler("mig-s", connection=conn)
    periodic = old.schedule(later.replace(tzinfo=None), RECORD, args=["p"], interval=60, repeat=5)
    once = old.enqueue_at(later.replace(tzinfo=None) + timedelta(minutes=1), RECORD, "o")
    ghost = plain.enqueue_at(later, RECORD, "ghost")
    ghost.delete()
    conn.zadd(ScheduledJobRegistry(queue=plain).key, {ghost.id: later.timestamp()})  # a job hash gone

    output = migrate(own_db, prefix)
    assert "moved 33 job(s)" in output and "job gone 1" in output
    store = DelayStore(conn, Config(prefix=prefix, shards=SHARDS))
    assert store.rank(in_front.id) == AT_FRONT_RANK and store.rank(registry_jobs[0].id) == 0
    for job in registry_jobs:
        item = store.get(job.id)
        assert item is not None and item.ready_ms == int(later.timestamp() + registry_jobs.index(job)) * 1000
        assert Envelope.decode(item.envelope).destination == "mig"
    # the schedule is copied from job.meta into the envelope: the forwarder never unpickles meta
    periodic_meta = {"scheduler": True, "schedule": {"interval": 60, "repeat": 5}}
    assert Envelope.decode(store.get(periodic.id).envelope).meta == periodic_meta  # type: ignore[union-attr]
    assert store.get(once.id).ready_ms == int((later + timedelta(minutes=1)).timestamp()) * 1000  # type: ignore[union-attr]
    # RQ's registry keeps listing the queue's jobs, as mirror entries no RQ scheduler moves
    assert conn.zcard(ScheduledJobRegistry(queue=plain).key) == 31 and conn.zcard(RQ_SCHEDULER_KEY) == 0
    assert plain.scheduled_job_registry.get_jobs_to_schedule(int(later.timestamp()) + 10**6) == []
    ours = Queue("mig", connection=conn, delay_store=store)
    assert ours.scheduled_job_registry.get_job_ids()[:2] == [in_front.id, registry_jobs[0].id] or (
        ours.scheduled_job_registry.get_job_ids()[:2] == [registry_jobs[0].id, in_front.id]
    )
    assert ours.scheduled_job_registry.get_scheduled_time(registry_jobs[3].id).timestamp() == int(later.timestamp() + 3)
    before = {k: conn.dump(k) for k in conn.scan_iter(f"{prefix}:*")}

    assert "moved 0 job(s)" in migrate(own_db, prefix)
    assert {k: conn.dump(k) for k in conn.scan_iter(f"{prefix}:*")} == before

    # and the migrated jobs run: the periodic one keeps its rq-scheduler schedule
    store.reschedule(periodic.id, 0)
    store.reschedule(registry_jobs[0].id, 0)
    forwarder = Forwarder(store, [RQTarget(conn)])
    assert forwarder.run_once() == 2
    assert set(plain.job_ids) == {registry_jobs[0].id} and RQQueue("mig-s", connection=conn).job_ids == [periodic.id]
    next_run = Envelope.decode(store.get(periodic.id).envelope)  # type: ignore[union-attr]
    assert next_run.meta["schedule"] == {"interval": 60, "repeat": 4}  # counted down in the envelope
    conn.close()


def test_a_copy_left_by_an_interrupted_run_is_not_duplicated(own_db: str, prefix: str) -> None:
    conn = redis.Redis.from_url(own_db)
    plain = RQQueue("mig", connection=conn)
    job = plain.enqueue_at(datetime.now(timezone.utc) + timedelta(hours=1), RECORD, 1)
    store = DelayStore(conn, Config(prefix=prefix, shards=SHARDS))
    store.schedule(job.id, datetime.now(timezone.utc) + timedelta(hours=2), Queue("mig", connection=conn).envelope())
    output = migrate(own_db, prefix)  # as if a first run had copied, then died before ZREM
    registry = ScheduledJobRegistry(queue=plain)
    assert (
        "already in the store 1" in output
        and registry.get_jobs_to_schedule(int(time.time()) + 10**9) == []
        and registry.count == 1
    )
    assert sum(s.scheduled for s in store.stats()) == 1
    conn.close()


def test_forward_has_an_rq_target_only_when_asked(conn: redis.Redis, queue: Queue, rq_store: DelayStore) -> None:
    job = queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, 1)
    without = Forwarder(rq_store, [])
    assert without.run_once() == 1 and queue.job_ids == []  # no rq target: left for one, not lost
    item = rq_store.get(job.id)
    assert item is not None and item.attempts == 0  # a configuration, not an attempt
    assert item.leased_until_ms is not None and item.leased_until_ms > time.time() * 1000  # deferred
    assert Forwarder(rq_store, [RQTarget(conn)]).run_once() == 0  # waits for its not-before time
    help_text = CliRunner().invoke(main, ["forward", "--help"]).output
    assert "--rq-redis" in help_text and "no rq target" in help_text


def test_an_unknown_function_fails_in_the_worker_with_rqs_error_and_forwarding_goes_on(
    queue: Queue, processes: Processes
) -> None:
    """The forwarder never imports job functions (it needs none of the app's code): a job whose
    function cannot be imported is moved, and the worker fails it with the reason, as RQ does."""
    soon = timedelta(milliseconds=200)
    bad = queue.enqueue_in(soon, "no_such_module.func", 1)
    good = queue.enqueue_in(soon * 2, RECORD, "after")
    processes.forwarder()
    processes.worker(queue.name)
    wait_for(lambda: runs(queue.connection, queue.name) != [], 20, "the next job ran")
    wait_for(lambda: bad.get_status() == JobStatus.FAILED, 10, "the bad job failed")
    assert bad.id in queue.failed_job_registry
    assert "no_such_module.func" in (bad.latest_result().exc_string or "")  # type: ignore[union-attr]
    assert [r["id"] for r in runs(queue.connection, queue.name)] == [good.id]


def test_delayq_list_shows_what_rq_jobs_run_without_unpickling_them(
    conn: redis.Redis, rq_store: DelayStore, queue: Queue, valkey_url: str, prefix: str, tmp_path: Path
) -> None:
    from tests.test_rq.test_untrusted import planted

    later = timedelta(hours=1)
    job = queue.enqueue_in(later, "tests.test_rq.jobs.record", "x", times=2)
    described = queue.enqueue_in(later * 2, "tests.test_rq.jobs.record", "y", description="nightly report")
    conn.hset(described.key, "data", zlib.compress(planted(tmp_path / "data")))
    rq_store.schedule("other", time.time() + 3 * 3600, Envelope("list", "q:out"))
    env = {"DELAYQ_URL": valkey_url, "DELAYQ_PREFIX": prefix, "DELAYQ_SHARDS": str(SHARDS)}
    listed = CliRunner().invoke(main, ["list", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    jobs = {e["id"]: e.get("job") for e in json.loads(listed.output)}
    assert jobs == {
        job.id: {"id": job.id, "description": "tests.test_rq.jobs.record('x', times=2)", "status": "scheduled"},
        described.id: {"id": described.id, "description": "nightly report", "status": "scheduled"},
        "other": None,
    }
    table = CliRunner().invoke(main, ["list"], env=env).output
    assert "tests.test_rq.jobs.record('x', times=2)" in table and "nightly report" in table
    assert not (tmp_path / "data").exists(), "unpickled by delayq list"


def periodic_import(url: str, prefix: str, *args: str, code: int = 0) -> str:
    command = ["periodic", "import", *args, "--url", url, "--prefix", prefix, "--shards", str(SHARDS)]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == code, result.output
    return result.output


def test_periodic_import_from_rq_scheduler_is_rq_migrate(own_db: str, prefix: str) -> None:
    """`delayq periodic import --from rq-scheduler` moves what `rq-migrate` moves: a dry run
    nothing, then the repeating job once, then nothing again."""
    conn = redis.Redis.from_url(own_db)
    later = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(hours=1)
    repeating = rq_scheduler.Scheduler("imp-s", connection=conn).schedule(later, RECORD, interval=60, repeat=3)
    source = ["--from", "rq-scheduler", "--rq-redis", own_db]
    dry = periodic_import(own_db, prefix, *source, "--dry-run")
    assert f"{RQ_SCHEDULER_KEY}: would move 1" in dry and conn.zcard(RQ_SCHEDULER_KEY) == 1
    store = DelayStore(conn, Config(prefix=prefix, shards=SHARDS))
    assert store.get(repeating.id) is None
    assert "moved 1 job(s)" in periodic_import(own_db, prefix, *source)
    assert Envelope.decode(store.get(repeating.id).envelope).meta["schedule"] == {"interval": 60, "repeat": 3}  # type: ignore[union-attr]
    assert "moved 0 job(s)" in periodic_import(own_db, prefix, *source)
    conn.close()


def test_periodic_import_from_rq_cron_syncs_the_config_and_its_dry_run_writes_nothing(
    own_db: str, prefix: str, tmp_path: Path
) -> None:
    """`--from rq-cron --config CONFIG` is `delayq rq-cron sync CONFIG`, its diff printed first by
    `--dry-run`; a second run changes nothing, and an entry the config dropped is listed as removed."""
    config = tmp_path / "imp_cron.py"
    head = "from rq import cron\nfrom tests.test_rq.jobs import record\n"
    both = (
        "cron.register(record, 'imp', interval=60, name='a')\ncron.register(record, 'imp', cron='0 9 * * *', name='b')"
    )
    config.write_text(f"{head}{both}\n")
    source = ["--from", "rq-cron", "--config", str(config)]
    conn = redis.Redis.from_url(own_db)
    dry = periodic_import(own_db, prefix, *source, "--dry-run")
    assert "added: a\nadded: b\n" in dry and "dry run, nothing written" in dry
    assert not list(conn.scan_iter(f"{prefix}:*periodic*"))
    assert "2 added" in periodic_import(own_db, prefix, *source)
    assert "0 added, 0 changed, 2 unchanged" in periodic_import(own_db, prefix, *source)
    config.write_text(head + "cron.register(record, 'imp', interval=30, name='a')\n")
    dry = periodic_import(own_db, prefix, *source, "--dry-run")
    assert "changed: a\nremoved: b\n" in dry, dry
    assert "changed: a\nremoved: b\n" in periodic_import(own_db, prefix, *source)
    conn.close()
