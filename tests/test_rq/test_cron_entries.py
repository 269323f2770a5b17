"""RQ periodic entries, in process: the job template is the job RQ's own enqueue saves, a run is
written and pushed once however often it is sent, an ``rq cron`` config is captured as RQ loads
it (with ``tz=``), and firing on a fake clock makes one job per period, id ``uuid5(name, period)``."""

from __future__ import annotations

import pickle
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from rq import Queue as RQQueue
from rq import SimpleWorker
from rq.cron import CronScheduler
from rq.job import Job

from delayq_backends import Config, DelayStore
from delayq_backends.cli import main
from delayq_backends.envelope import ENTRY_FORMAT_VERSION, Envelope
from delayq_backends.errors import ConfigError, EnvelopeError
from delayq_backends.periodic import ops, trust
from delayq_backends.periodic.history import RunMark
from delayq_backends.periodic.schedules import Cron, Every, Misfire, Period, run_task_id
from delayq_backends.periodic.state import RUNTIME, PeriodicState, state_of, with_state
from delayq_backends.rq.cron import entry as cron_entry
from delayq_backends.rq.cron import load_config, sync
from delayq_backends.rq.entries import (
    KIND,
    MAX_RUNS_PER_CALL,
    PERIODIC_META,
    RUN_KIND,
    JobTemplate,
    RQPeriodicTarget,
    RQRunTarget,
    TemplateError,
    capture,
    run_envelope,
)
from delayq_backends.rq.slots import Slots
from delayq_backends.store import SlotRun, slot_member
from delayq_backends.targets import Delivery
from delayq_backends.testing import FakeClock, TestingStore, advance_and_run, run_due, testing_store
from delayq_backends.timeutil import from_ms, to_ms
from tests.harness.rq import runs
from tests.test_rq.jobs import record

FUNC = "tests.test_rq.jobs.record"
OPTIONS = {"job_timeout": 30, "result_ttl": 99, "ttl": 600, "failure_ttl": 77, "meta": {"team": "ops"}}


def _run(template: JobTemplate, name: str, due_ms: int) -> Delivery:
    job_id = run_task_id(name, Every(1000).first_after(due_ms - 1000))
    return Delivery(
        f"periodic:{name}#{job_id}",
        run_envelope(template, job_id, template.run_meta(RunMark(name, due_ms)), name),
        0,
        due_ms,
    )


def test_a_run_is_the_job_rqs_own_enqueue_saves(conn: redis.Redis, prefix: str) -> None:
    queue = f"{prefix}-q"
    by_rq = RQQueue(queue, connection=conn).enqueue(record, args=("t",), kwargs={"times": 2}, **OPTIONS)
    template = capture(FUNC, queue, args=("t",), kwargs={"times": 2}, **OPTIONS)
    run = _run(template, prefix, 1_800_000_000_000)
    report = RQRunTarget(conn).publish_many([run])
    assert report.published == [run.id]
    job_id = run.id.rpartition("#")[2]

    ours, theirs = conn.hgetall(Job.key_for(job_id)), conn.hgetall(by_rq.key)
    per_run = {b"created_at", b"enqueued_at", b"meta"}
    assert {k: v for k, v in ours.items() if k not in per_run} == {k: v for k, v in theirs.items() if k not in per_run}
    assert set(ours) == set(theirs)
    assert pickle.loads(ours[b"meta"]) == {"team": "ops", PERIODIC_META: {"name": prefix, "due": 1_800_000_000_000}}
    assert 590 < conn.ttl(Job.key_for(job_id)) <= 600  # RQ's job ttl, as its enqueue sets it
    assert conn.lrange(f"rq:queue:{queue}", 0, -1) == [by_rq.id.encode(), job_id.encode()]
    assert f"rq:queue:{queue}".encode() in conn.smembers("rq:queues")

    SimpleWorker([RQQueue(queue, connection=conn)], connection=conn).work(burst=True)
    assert [r["id"] for r in runs(conn, queue)] == [by_rq.id, job_id]  # a worker runs it as RQ's own
    fetched = Job.fetch(job_id, connection=conn)
    assert fetched.return_value() == "tx2" and fetched.meta[PERIODIC_META]["name"] == prefix


def test_a_run_sent_twice_is_enqueued_once(conn: redis.Redis, prefix: str) -> None:
    """A forwarder killed between the publish and its rearm sends that period again (same id)."""
    queue = f"{prefix}-q"
    template = capture(FUNC, queue, args=("x",))
    first, other = _run(template, prefix, 1_800_000_000_000), _run(template, prefix, 1_800_000_001_000)
    target = RQRunTarget(conn)
    assert target.publish_many([first]).published == [first.id]
    job_key = Job.key_for(first.id.rpartition("#")[2])
    conn.hset(job_key, "status", "started")  # a worker has it: the second send must not reset it
    report = target.publish_many([first, other])
    assert sorted(report.published) == sorted([first.id, other.id]) and not report.failed
    pushed = [j.decode() for j in conn.lrange(f"rq:queue:{queue}", 0, -1)]
    assert pushed == [first.id.rpartition("#")[2], other.id.rpartition("#")[2]]
    assert conn.hget(job_key, "status") == b"started"


def test_a_run_envelope_from_another_tool_fails_alone(conn: redis.Redis, prefix: str) -> None:
    template = capture(FUNC, f"{prefix}-q")
    good = _run(template, prefix, 1_800_000_000_000)
    bad = Delivery("x", Envelope(RUN_KIND, f"{prefix}-q", meta={"rq": {"job": 5}}), 0, 0)
    report = RQRunTarget(conn).publish_many([bad, good])
    assert report.published == [good.id]
    assert [f.id for f in report.failed] == ["x"] and report.failed[0].permanent


def test_a_template_round_trips_and_refuses_what_no_run_can_carry() -> None:
    template = capture(FUNC, "q", args=(1,), meta={"a": [1]}, ttl=5)
    assert JobTemplate.from_envelope(Envelope.decode(template.to_envelope().encode())) == template
    assert template.func == FUNC and template.fields["origin"] == "q" and template.fields["timeout"] == 180
    with pytest.raises(TemplateError, match="not JSON"):
        capture(FUNC, "q", meta={"when": object()})
    with pytest.raises(TemplateError, match="serializer"):
        capture(FUNC, "q", serializer="myapp.Pickle")
    with pytest.raises(EnvelopeError, match="job template"):
        JobTemplate.from_envelope(Envelope(KIND, "q", meta={"rq": {"fields": {"a": [1]}, "meta": {}}}))


CONFIG = """
    from rq import cron
    from delayq_backends.rq import cron as delayq_cron
    from tests.test_rq.jobs import record

    cron.register(record, "{q}", args=("plain",), interval=1)
    delayq_cron.register(record, "{q}", args=("berlin",), cron="30 9 * * 1-5", tz="Europe/Berlin",
                         name="standup", misfire="run_all", misfire_max=3, overlap="skip", result_ttl=60)
    cron.register(record, "{q}", args=("seconds",), cron="* * * * * */2", name="every-2s")
    cron.register(record, "{q}", args=("either",), cron="0 0 1 * 1", name="either-day")
    cron.register(record, "{q}", args=("never",), name="no-schedule")
    cron.register(record, "{q}", args=("again",), interval=5, name="standup")
"""


def _config(tmp_path: Path, queue: str) -> Path:
    path = tmp_path / "cron_config.py"
    path.write_text(textwrap.dedent(CONFIG.format(q=queue)))
    return path


def test_a_config_is_captured_as_rq_cron_loads_it(tmp_path: Path, conn: redis.Redis) -> None:
    path = _config(tmp_path, "q")
    config = load_config(str(path))
    entries = {e.name: e for e in config.entries}
    assert list(entries) == [FUNC, "standup", "every-2s", "either-day", "standup#2"]
    assert entries[FUNC].schedule == Every(1000) and entries[FUNC].misfire == Misfire()
    standup = entries["standup"]
    assert standup.schedule == Cron("30 9 * * 1-5", "Europe/Berlin")
    assert standup.misfire == Misfire("run_all", max_runs=3) and standup.overlap == "skip"
    assert standup.template.fields["result_ttl"] == 60 and standup.template.queue == "q"
    assert entries["every-2s"].schedule == Cron("* * * * * */2", entries["every-2s"].schedule.zone)
    either = entries["either-day"].schedule
    assert either == Cron("0 0 1 * 1", either.zone, day_or=True)  # the 1st or a Monday, as `rq cron` runs it
    assert set(config.errors) == {"no-schedule"}
    assert "interval or cron" in config.errors["no-schedule"]
    assert entries["standup#2"].schedule == Every(5000)  # the second job of that name: RQ 3 runs both

    rq_itself = CronScheduler(connection=conn)
    rq_itself.load_config_from_file(str(path))  # `rq cron` loads the same file, delayq's options aside
    assert sum(j.name == "standup" for j in rq_itself.get_jobs()) == 2


def test_a_config_that_cannot_load_or_a_bad_zone_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load the rq cron config"):
        load_config(str(tmp_path / "missing.py"))
    path = tmp_path / "zone.py"
    path.write_text(
        "from delayq_backends.rq import cron\nfrom tests.test_rq.jobs import record\n"
        "cron.register(record, 'q', cron='0 9 * * *', tz='Mars/Olympus')\n"
    )
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        load_config(str(path))


def _stored(store: TestingStore, template: JobTemplate, name: str, every_ms: int, misfire: Misfire) -> None:
    """An entry as a sync stores it (first period one interval from now), its template an operator's."""
    trust.record(store, name, template.digest())
    schedule = Every(every_ms)
    slot = schedule.first_after(store.clock())
    state = PeriodicState(name, schedule, misfire, template.fingerprint(), slot)
    store.schedule(f"periodic:{name}", from_ms(slot.at_ms), with_state(template.to_envelope(), state))


def test_firing_makes_one_job_per_period_and_follows_the_misfire_policy() -> None:
    clock = FakeClock()
    store = testing_store(prefix="cron", shards=2, clock=clock)
    conn = store.client  # RQ's keys on the same fake server
    runs_target = RQRunTarget(conn)
    targets = {KIND: RQPeriodicTarget(runs_target), RUN_KIND: runs_target}
    template = capture(FUNC, "q", args=("p",))
    _stored(store, template, "tick", 1000, Misfire())
    _stored(store, template, "all", 1000, Misfire("run_all"))
    start = clock()

    for _ in range(3):
        advance_and_run(store, 1, targets)
    queued = [j.decode() for j in conn.lrange("rq:queue:q", 0, -1)]
    periods = [Every(1000).first_after(start + i * 1000) for i in range(3)]
    expected = [run_task_id(n, s) for s in periods for n in ("tick", "all")]
    assert sorted(queued) == sorted(expected)
    meta = pickle.loads(conn.hget(Job.key_for(run_task_id("tick", periods[2])), "meta"))
    assert meta[PERIODIC_META] == {"name": "tick", "due": periods[2].at_ms}

    advance_and_run(store, 5, targets)  # an outage of 5 periods
    after = [j.decode() for j in conn.lrange("rq:queue:q", 0, -1)][len(queued) :]
    tick = [j for j in after if Job.fetch(j, connection=conn).meta[PERIODIC_META]["name"] == "tick"]
    assert len(tick) == 1  # run_once: one run for the missed periods
    assert len(after) - len(tick) == 5  # run_all: each missed period


def test_a_cron_string_with_both_day_fields_runs_on_either_day_as_rq_cron_does() -> None:
    """'0 9 1 * 1' is the 1st and every Monday for cron and `rq cron` (croniter's day_or): it runs
    on Monday 2026-06-08, not first on 2027-02-01 (a Monday the 1st, what Celery's crontab reads)."""
    clock = FakeClock(datetime(2026, 6, 2, 12, tzinfo=timezone.utc))  # a Tuesday
    store = testing_store(prefix="cron", shards=2, clock=clock)
    runs_target = RQRunTarget(store.client)
    targets = {KIND: RQPeriodicTarget(runs_target), RUN_KIND: runs_target}
    assert (
        ops.upsert(store, cron_entry("either", FUNC, "q", cron="0 9 1 * 1", tz="UTC").spec(source=RUNTIME)) == "added"
    )
    monday = datetime(2026, 6, 8, 9, tzinfo=timezone.utc)
    item = store.get(ops.item_id("either"))
    assert item is not None and item.ready_ms == to_ms(monday)
    assert item.envelope[2] == ENTRY_FORMAT_VERSION  # an older forwarder would read both days: it leaves it alone

    clock.set(monday + timedelta(seconds=1))
    run_due(store, targets)
    [job_id] = [j.decode() for j in store.client.lrange("rq:queue:q", 0, -1)]
    assert job_id == run_task_id("either", Period("2026-06-08T09:00:00", to_ms(monday)))
    status = ops.get(store, "either")
    assert status is not None and status.next_run_ms == to_ms(datetime(2026, 6, 15, 9, tzinfo=timezone.utc))


def test_either_day_periods_are_backfilled_and_written_as_rq_jobs_on_a_real_server(
    conn: redis.Redis, prefix: str
) -> None:
    """June 2026's periods of '0 9 1 * 1' (the 1st is a Monday): the five Mondays, each one RQ job."""
    store = DelayStore(conn, Config(prefix=prefix, shards=2))
    queue = f"{prefix}-q"
    runs_target = RQRunTarget(conn)
    targets = {KIND: RQPeriodicTarget(runs_target), RUN_KIND: runs_target}
    ops.upsert(store, cron_entry("either", FUNC, queue, cron="0 9 1 * 1", tz="UTC").spec(source=RUNTIME))
    june = [datetime(2026, 6, d, tzinfo=timezone.utc) for d in (1, 30)]
    ops.backfill(store, "either", to_ms(june[0]), to_ms(june[1]))
    run_due(store, targets)
    jobs = [Job.fetch(j.decode(), connection=conn) for j in conn.lrange(f"rq:queue:{queue}", 0, -1)]
    days = sorted(from_ms(j.meta[PERIODIC_META]["due"]).day for j in jobs)
    assert days == [1, 8, 15, 22, 29]


def _overlapping(policy: str) -> tuple[TestingStore, dict[str, Any], Job, str]:
    """An every-second entry with ``policy``, fired once, its run started by a worker (as RQ's
    SlotWorker reads its slot and names its member): the store, the targets, the run, the member."""
    clock = FakeClock()
    store = testing_store(prefix="cron", shards=2, clock=clock)
    runs_target = RQRunTarget(store.client)
    targets = {KIND: RQPeriodicTarget(runs_target), RUN_KIND: runs_target}
    template = capture(FUNC, "q", args=("o",))
    schedule = Every(1000)
    slot = schedule.first_after(clock())
    state = PeriodicState("o", schedule, Misfire(), template.fingerprint(), slot, overlap=policy)
    trust.record(store, "o", template.digest())
    store.schedule("periodic:o", from_ms(slot.at_ms), with_state(template.to_envelope(), state))
    advance_and_run(store, 1, targets)
    (first,) = [Job.fetch(j.decode(), connection=store.client) for j in store.client.lrange("rq:queue:q", 0, -1)]
    found = Slots._slot_of(first)  # what the worker reads
    assert found is not None and found.key == "periodic:o" and found.limit == 1
    member = slot_member(first.id, None)  # as Slots.execute_job names it
    store.hold_slots({found.key: [SlotRun(member, "")]}, "start", hold_ms=3_600_000)
    assert store.slot_status(found.key).running == 1  # the worker's hold is the forwarder's: one
    return store, targets, first, member


def test_skip_skips_while_the_worker_holds_the_runs_slot() -> None:
    """The forwarder takes the slot by the member RQ's SlotWorker names (the job id alone), so the
    worker's start takes over the forwarder's hold and its end frees the slot."""
    store, targets, _, member = _overlapping("skip")
    advance_and_run(store, 1, targets)
    advance_and_run(store, 1, targets)
    assert store.client.llen("rq:queue:q") == 1  # both periods fell due while the run ran: skipped
    stored = store.get("periodic:o")
    assert stored is not None and state_of(Envelope.decode(stored.envelope)).skipped == 2
    store.hold_slots({"periodic:o": [SlotRun(member, "")]}, "end")
    advance_and_run(store, 1, targets)
    assert store.client.llen("rq:queue:q") == 2


def test_buffer_one_keeps_one_run_waiting_and_writes_it_when_the_slot_is_given_back() -> None:
    store, targets, first, member = _overlapping("buffer_one")
    due = first.meta[PERIODIC_META]["due"]
    advance_and_run(store, 1, targets)  # waits, as its own item (kind rq-run)
    advance_and_run(store, 1, targets)  # skipped: one waits already
    assert store.client.llen("rq:queue:q") == 1
    waiting = run_task_id("o", Every(1000).first_after(due))
    item = store.get(waiting)
    assert item is not None and Envelope.decode(item.envelope).target == RUN_KIND
    store.hold_slots({"periodic:o": [SlotRun(member, "")]}, "end")
    advance_and_run(store, 0, targets)
    assert [j.decode() for j in store.client.lrange("rq:queue:q", 0, -1)] == [first.id, waiting]


def test_a_garbage_entry_is_dead_lettered_with_its_reason_and_stops_no_other() -> None:
    clock = FakeClock()
    store = testing_store(prefix="cron", shards=1, clock=clock, max_attempts=1)
    runs_target = RQRunTarget(store.client)
    targets = {KIND: RQPeriodicTarget(runs_target), RUN_KIND: runs_target}
    template = capture(FUNC, "q", args=("g",))
    _stored(store, template, "good", 1000, Misfire())
    bad = Envelope(KIND, "q", meta={"rq": {"fields": {"x": [1]}, "meta": {}}, "periodic": {"name": "bad"}})
    store.schedule("periodic:bad", from_ms(clock()), bad)
    advance_and_run(store, 1, targets)
    assert store.client.llen("rq:queue:q") == 1
    (letter,) = store.dead_letters()
    assert letter.id == "periodic:bad" and "cannot fire this periodic entry" in letter.error


def test_forward_with_a_cron_config_needs_rqs_redis(valkey_url: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["forward", "--url", valkey_url, "--rq-cron", str(_config(tmp_path, "q"))])
    assert result.exit_code == 2 and "--rq-redis" in result.output, result.output


def test_a_catch_up_of_more_runs_than_one_call_takes_is_written_in_order(conn: redis.Redis, prefix: str) -> None:
    """A run_all catch-up or a backfill sends up to 10,000 runs of one entry at once."""
    queue = f"{prefix}-q"
    template = capture(FUNC, queue)
    many = [_run(template, prefix, 1_800_000_000_000 + i * 1000) for i in range(MAX_RUNS_PER_CALL * 2 + 7)]
    report = RQRunTarget(conn).publish_many(many)
    assert len(report.published) == len(many) and not report.failed
    assert [j.decode() for j in conn.lrange(f"rq:queue:{queue}", 0, -1)] == [d.id.rpartition("#")[2] for d in many]


def test_a_runtime_entry_is_listed_as_rq_and_shadows_a_config_entry_of_its_name(tmp_path: Path) -> None:
    store = testing_store(prefix="cron", shards=2)
    runtime = cron_entry("standup", FUNC, "q", cron="0 9 * * *", tz="America/New_York", args=("rt",))
    assert ops.upsert(store, runtime.spec(source=RUNTIME)) == "added"
    status = ops.get(store, "standup")
    assert status is not None and (status.kind, status.task, status.tz) == ("rq", FUNC, "America/New_York")
    report = sync(store, load_config(str(_config(tmp_path, "q"))))
    assert report.shadowed == ["standup"]
    assert sorted(report.added) == sorted([FUNC, "every-2s", "either-day", "standup#2"])
    stored = store.get("periodic:standup")
    assert stored is not None and "'rt'" in str(
        JobTemplate.from_envelope(Envelope.decode(stored.envelope)).fields["description"]
    )
    with pytest.raises(ConfigError, match="interval= .* or cron="):
        cron_entry("x", FUNC, "q")


def test_a_cron_string_without_tz_is_read_in_the_syncing_hosts_zone_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``rq cron`` reads it in its host's zone; named, so every forwarder reads it alike."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    entries = {e.name: e for e in load_config(str(_config(tmp_path, "q"))).entries}
    assert entries["every-2s"].schedule == Cron("* * * * * */2", "Asia/Tokyo")
    monkeypatch.setenv("TZ", "Etc/UTC")
    assert load_config(str(_config(tmp_path, "q"))).entries[2].schedule == Cron("* * * * * */2", "UTC")


def test_an_unversioned_sync_after_a_versioned_one_names_rqs_flag_not_celerys_setting(tmp_path: Path) -> None:
    store = testing_store(prefix="cronv", shards=2)
    config = load_config(str(_config(tmp_path, "q")))
    assert sync(store, config, version=5).added
    refused = sync(store, config).refused
    assert "--schedule-version (DELAYQ_SCHEDULE_VERSION) of `delayq rq-cron sync`" in refused
    assert "delayq_schedule_version" not in refused, "a Celery setting named to an RQ user"
