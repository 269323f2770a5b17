"""Drop-in parity with RQ and rq-scheduler (issue 14): waiting jobs in RQ's registry API and
rq-dashboard, rq-scheduler's cron strings and run-now methods, and no silent stalls for jobs a
plain ``rq.Queue`` schedules."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone

import pytest
import redis
import rq_scheduler
from click.testing import CliRunner
from rq import Queue as RQQueue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry
from rq_scheduler.utils import get_next_scheduled_time

from delayq_backends import DelayStore, Envelope
from delayq_backends.cli import main
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import InvalidScheduleError, Queue, RQTarget, Scheduler, adopt
from delayq_backends.rq.periodic import next_cron_time
from delayq_backends.timeutil import to_ms
from tests.harness.rq import SHARDS, Processes, runs
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"


@pytest.fixture
def scheduler(conn: redis.Redis, rq_store: DelayStore, prefix: str) -> Scheduler:
    return Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store)


def ms(when: datetime) -> int:
    return to_ms(when)  # as the store reads a time (rounded up to the ms)


# -- 1. waiting jobs in RQ's registry ------------------------------------------------------------


def test_waiting_jobs_are_listed_by_rqs_registry_with_their_exact_times(queue: Queue, rq_store: DelayStore) -> None:
    base = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    jobs = [queue.enqueue_at(base + timedelta(milliseconds=1234 * i), RECORD, i) for i in (2, 0, 1)]
    ours = queue.scheduled_job_registry
    plain = ScheduledJobRegistry(queue.name, connection=queue.connection)  # as rq-dashboard builds it
    in_time_order = [jobs[1].id, jobs[2].id, jobs[0].id]
    assert ours.get_job_ids() == plain.get_job_ids() == in_time_order
    assert ours.count == plain.count == 3
    for job, i in zip(jobs, (2, 0, 1)):
        assert ms(ours.get_scheduled_time(job)) == ms(base + timedelta(milliseconds=1234 * i))
    # rescheduled through RQ's API: the store and the registry follow
    queue.schedule_job(jobs[0], base - timedelta(minutes=5))
    assert ours.get_job_ids()[0] == jobs[0].id
    assert ms(ours.get_scheduled_time(jobs[0].id)) == rq_store.get(jobs[0].id).ready_ms == ms(base) - 300_000  # type: ignore[union-attr]
    # cancelled and deleted through RQ: gone from the registry (the store's entries are skipped when due)
    jobs[1].cancel()
    jobs[2].delete()
    assert ours.get_job_ids() == [jobs[0].id] and ours.count == 1
    # removed through the registry: gone from the store too
    ours.remove(jobs[0])
    assert ours.count == 0 and not rq_store.exists(jobs[0].id)
    with pytest.raises(NoSuchJobError):
        ours.get_scheduled_time(jobs[0].id)


def test_a_moved_job_leaves_the_registry_in_the_same_transaction(
    queue: Queue, rq_store: DelayStore, forwarder: Forwarder
) -> None:
    due = queue.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), RECORD, "due")
    later = queue.enqueue_in(timedelta(hours=1), RECORD, "later")
    assert queue.scheduled_job_registry.count == 2
    assert forwarder.run_once() == 1
    assert queue.job_ids == [due.id] and queue.scheduled_job_registry.get_job_ids() == [later.id]


def test_registry_schedule_puts_the_job_in_the_store(queue: Queue, rq_store: DelayStore) -> None:
    job = Job.create(RECORD, args=("r",), connection=queue.connection, origin=queue.name)
    job.save()
    when = datetime.now(timezone.utc) + timedelta(minutes=3, milliseconds=7)
    queue.scheduled_job_registry.schedule(job, when)
    assert rq_store.get(job.id).ready_ms == ms(when)  # type: ignore[union-attr]
    assert queue.scheduled_job_registry.get_job_ids() == [job.id]


def test_rq_dashboard_shows_waiting_jobs_in_its_scheduled_tab(queue: Queue, valkey_url: str) -> None:
    dashboard = pytest.importorskip("rq_dashboard.cli")
    web = pytest.importorskip("rq_dashboard.web")
    if not hasattr(ScheduledJobRegistry, "get_job_count"):
        pytest.skip("rq-dashboard 0.9 needs RQ 2 or later (it calls BaseRegistry.get_job_count)")
    jobs = [queue.enqueue_in(timedelta(minutes=m), RECORD, m) for m in (5, 1, 3)]
    app = dashboard.make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = valkey_url
    web.setup_rq_connection(app)
    client = app.test_client()
    listed = client.get(f"/0/data/jobs/{queue.name}/scheduled/8/asc/1.json").get_json()
    assert [j["id"] for j in listed["jobs"]] == [jobs[1].id, jobs[2].id, jobs[0].id]
    queues = {q["name"]: q for q in client.get("/0/data/queues.json").get_json()["queues"]}
    assert queues[queue.name]["scheduled_job_registry_count"] == 3


@pytest.mark.alone  # a forking worker runs 40 jobs in about 12 s alone; beside others, past the wait
def test_rq_worker_with_scheduler_beside_a_forwarder_moves_nothing_early_or_twice(
    queue: Queue, processes: Processes
) -> None:
    """RQ's scheduler moves every score between 0 and now each second; the mirror entries are
    beyond its reach, so each job runs once, when the forwarder moves it, never before its time."""
    start = datetime.now(timezone.utc) + timedelta(seconds=2)
    planned = {queue.enqueue_at(start + timedelta(milliseconds=37 * i), RECORD, i).id: start.timestamp() + 0.037 * i
               for i in range(40)}  # fmt: skip
    processes.worker(queue.name, queue_class="rq.Queue", extra=("--with-scheduler",))
    processes.forwarder()
    wait_for(lambda: len(runs(queue.connection, queue.name)) >= 40, 60, "40 runs")
    time.sleep(1.5)  # RQ's scheduler polls each second: give it the chance to move one twice
    done = runs(queue.connection, queue.name)
    assert sorted(r["id"] for r in done) == sorted(planned), "a job ran twice or not at all"
    early = [r for r in done if r["at"] < planned[r["id"]]]
    assert early == [], f"{len(early)} job(s) ran before their time"


# -- 2. cron strings as rq-scheduler reads them ---------------------------------------------------


@pytest.fixture(params=["UTC", "America/New_York"])
def host_zone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


CRONS = ["5 * * * * *", "@hourly", "@daily", "@weekly", "0 0 1 * 1", "0 9 * * 1-5", "*/15 * * * *", "0 0 1 1 * 2030"]


@pytest.mark.parametrize("use_local_timezone", [False, True])
def test_cron_strings_fire_at_the_instants_rq_scheduler_computes(host_zone: str, use_local_timezone: bool) -> None:
    """rq-scheduler 0.14 reads a cron string on the host's wall clock, whatever use_local_timezone
    says, with the crontab package (a 6th field is a year; day-of-month AND day-of-week)."""
    for cron in CRONS:
        theirs = get_next_scheduled_time(cron, use_local_timezone=use_local_timezone).timestamp()
        ours = next_cron_time(cron, time.time(), use_local_timezone=use_local_timezone, syntax="rq-scheduler")
        assert ours == theirs, f"{cron!r} on a {host_zone} host"


def test_rq_scheduler_syntax_never_schedules_a_run_in_the_past_in_the_repeated_hour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """01:10 on the second pass of New York's repeated hour: 01:30 read as its first pass would be
    20 minutes ago, and the job would run again and again; it is the second pass's 01:30."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        second_pass_0110 = datetime(2026, 11, 1, 6, 10, tzinfo=timezone.utc).timestamp()
        following = next_cron_time("30 1 * * *", second_pass_0110, syntax="rq-scheduler")
        assert following == datetime(2026, 11, 1, 6, 30, tzinfo=timezone.utc).timestamp()
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_cron_time_skipped_by_the_spring_jump_runs_once_where_rq_scheduler_runs_it_every_poll(
    conn: redis.Redis, rq_store: DelayStore, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New York, 2026-03-08: 02:30 does not exist (02:00 EST jumps to 03:00 EDT). rq-scheduler
    schedules "30 2 * * *" at 01:30 EST, then computes 01:30 EST again on each poll until the
    jump, so the job runs every minute until the jump; the forwarder runs it once, then on
    the 9th at 02:30 EDT."""
    freezegun = pytest.importorskip("freezegun")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        first = datetime(2026, 3, 8, 6, 30, tzinfo=timezone.utc)  # 01:30 EST
        # rq-scheduler's daemon, polling each minute from 01:00 EST to 04:00 EDT
        theirs, due = [], first
        for minute in range(0, 150):
            poll = datetime(2026, 3, 8, 6, 0, tzinfo=timezone.utc) + timedelta(minutes=minute)
            if due <= poll:
                theirs.append(poll)
                offset = datetime.fromtimestamp(poll.timestamp()).astimezone().utcoffset()
                with freezegun.freeze_time(poll, tz_offset=offset):
                    due = get_next_scheduled_time("30 2 * * *")
        # every minute from 01:30 EST up to the jump (03:00 EDT): 31 runs
        assert theirs == [first + timedelta(minutes=m) for m in range(31)]

        # ours: scheduled the day before, then moved and re-armed by a forwarder, run by run
        day_before = datetime(2026, 3, 7, 12, tzinfo=timezone.utc).timestamp()
        scheduler = Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store, clock=lambda: day_before)
        job = scheduler.cron("30 2 * * *", RECORD)
        forwarder = Forwarder(rq_store, [RQTarget(conn, clock=lambda: 0)])
        ours = []
        for _ in range(3):
            item = rq_store.get(job.id)
            assert item is not None
            ours.append(datetime.fromtimestamp(item.ready_ms / 1000, timezone.utc))
            assert forwarder.run_once() == 1  # long past: due at once
        assert ours == [
            first,
            datetime(2026, 3, 9, 6, 30, tzinfo=timezone.utc),
            datetime(2026, 3, 10, 6, 30, tzinfo=timezone.utc),
        ]
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("cron", ["0 0 1 * 1", "0 9 * * 1-5", "*/15 * * * *", "30 2 * * *", "@daily"])
def test_rqs_own_cron_reads_strings_as_cron_syntax_cron_with_the_local_zone(
    conn: redis.Redis, rq_store: DelayStore, prefix: str, host_zone: str, cron: str
) -> None:
    """What the README tells an `rq cron` user (RQ >= 2.4): RQ's CronJob reads a string with
    croniter on the host's clock, as ``cron(..., cron_syntax="cron", use_local_timezone=True)``;
    the default (rq-scheduler's syntax) differs: "0 0 1 * 1" on 2026-11-26 runs 2027-02-01
    (a Monday the 1st), where RQ's runs 2026-11-30 (a Monday, or the 1st)."""
    rq_cron = pytest.importorskip("rq.cron")
    now = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
    theirs_job = rq_cron.CronJob(f"{prefix}-c", func_name=RECORD, cron=cron)
    theirs_job.latest_enqueue_time = now  # its next run is computed from here
    theirs = theirs_job.get_next_enqueue_time()
    scheduler = Scheduler(f"{prefix}-c", connection=conn, delay_store=rq_store, clock=now.timestamp)
    ours = scheduler.cron(cron, RECORD, cron_syntax="cron", use_local_timezone=True)
    default = scheduler.cron(cron, RECORD)
    assert rq_store.get(ours.id).ready_ms == theirs.timestamp() * 1000, f"{cron!r} on a {host_zone} host"  # type: ignore[union-attr]
    if cron == "0 0 1 * 1":
        local = datetime.fromtimestamp(rq_store.get(default.id).ready_ms / 1000)  # type: ignore[union-attr]
        assert (local.date(), theirs.astimezone().date()) == (date(2027, 2, 1), date(2026, 11, 30))


def test_moving_from_rq_cron_as_docs_rq_md_shows_and_running_it_again_adds_nothing(
    conn: redis.Redis, rq_store: DelayStore, prefix: str
) -> None:
    scheduler = Scheduler(f"{prefix}-q", connection=conn, delay_store=rq_store, cron_syntax="cron")
    for _ in range(2):  # a second deploy replaces the jobs
        scheduler.cron("0 0 1 * 1", RECORD, args=["m"], id=f"{prefix}-monthly-report", use_local_timezone=True)
        scheduler.schedule(datetime.now(timezone.utc), RECORD, interval=60, id=f"{prefix}-heartbeat")
    assert sorted(j.id for j in scheduler.get_jobs()) == [f"{prefix}-heartbeat", f"{prefix}-monthly-report"]
    monthly = Envelope.decode(rq_store.get(f"{prefix}-monthly-report").envelope)  # type: ignore[union-attr]
    assert monthly.meta["schedule"]["cron_syntax"] == "cron"


def test_scheduler_cron_reads_rq_schedulers_syntax_by_default_and_standard_cron_on_request(
    conn: redis.Redis, rq_store: DelayStore, prefix: str
) -> None:
    now = datetime(2026, 11, 2, 10, 0, 30, tzinfo=timezone.utc).timestamp()
    scheduler = Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store, clock=lambda: now)
    hourly_at_5 = scheduler.cron("5 * * * * *", RECORD)  # 6th field: the year (any)
    assert rq_store.get(hourly_at_5.id).ready_ms == (now - 30 + 5 * 60) * 1000  # type: ignore[union-attr]
    assert scheduler.cron("@hourly", RECORD) and scheduler.cron("@hourly", RECORD, cron_syntax="cron")
    mondays_the_first = scheduler.cron("0 0 1 * 1", RECORD)
    assert rq_store.get(mondays_the_first.id).ready_ms == datetime(2027, 2, 1, tzinfo=timezone.utc).timestamp() * 1000  # type: ignore[union-attr]
    standard = Scheduler(f"{prefix}-c", connection=conn, delay_store=rq_store, clock=lambda: now, cron_syntax="cron")
    first_or_monday = standard.cron("0 0 1 * 1", RECORD)
    assert rq_store.get(first_or_monday.id).ready_ms == datetime(2026, 11, 9, tzinfo=timezone.utc).timestamp() * 1000  # type: ignore[union-attr]
    with pytest.raises(InvalidScheduleError, match="cron_syntax"):
        Scheduler(f"{prefix}-x", connection=conn, cron_syntax="quartz")
    # the forwarder re-arms in the job's own syntax: the next run is an hour on, not a minute
    forwarder = Forwarder(rq_store, [RQTarget(conn, clock=lambda: int((now + 10**4) * 1000))])
    rq_store.reschedule(hourly_at_5.id, 0)
    assert forwarder.run_once() >= 1
    following = rq_store.get(hourly_at_5.id)
    assert following is not None and (following.ready_ms / 1000 - 5 * 60) % 3600 == 0
    assert Envelope.decode(following.envelope).meta["schedule"]["cron_syntax"] == "rq-scheduler"


# -- 3. run now: enqueue_job, enqueue_jobs, get_queue_for_job ------------------------------------


class OtherQueue(RQQueue):
    """A queue class named by path, as rq-scheduler's Scheduler(queue_class="...") takes it."""


def test_enqueue_job_runs_a_job_now_and_rearms_a_periodic_one(scheduler: Scheduler, rq_store: DelayStore) -> None:
    later = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(hours=1)
    once = scheduler.enqueue_at(later, RECORD, "once")
    periodic = scheduler.schedule(later, RECORD, args=["p"], interval=600, repeat=3)
    queue = RQQueue(scheduler.queue_name, connection=scheduler.connection)
    scheduler.enqueue_job(once)
    assert queue.job_ids == [once.id] and once not in scheduler
    assert once.get_status() == JobStatus.QUEUED
    before = time.time()
    scheduler.enqueue_job(periodic)
    assert queue.job_ids == [once.id, periodic.id] and periodic in scheduler
    following = rq_store.get(periodic.id)
    # the store rounds up to the ms
    assert following is not None and before + 600 <= following.ready_ms / 1000 <= time.time() + 600.001
    assert Envelope.decode(following.envelope).meta["schedule"]["repeat"] == 2


def test_enqueue_job_rearms_by_the_schedule_of_the_job_it_is_given(scheduler: Scheduler, rq_store: DelayStore) -> None:
    job = scheduler.cron("1 * * * *", RECORD)
    job.meta["cron_string"] = "2 * * * *"  # as rq-scheduler's own test does: the job given decides
    scheduler.enqueue_job(job)
    following = rq_store.get(job.id)
    assert following is not None and datetime.fromtimestamp(following.ready_ms / 1000).minute == 2
    assert Envelope.decode(following.envelope).meta["schedule"]["cron_string"] == "2 * * * *"


def test_enqueue_jobs_moves_what_is_due_as_rq_scheduler_does(scheduler: Scheduler) -> None:
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    due = [scheduler.enqueue_at(now - timedelta(seconds=s), RECORD, s) for s in (3, 1)]
    scheduler.enqueue_at(now + timedelta(hours=1), RECORD, "later")
    assert [j.id for j in scheduler.enqueue_jobs()] == [due[0].id, due[1].id]
    assert RQQueue(scheduler.queue_name, connection=scheduler.connection).job_ids == [due[0].id, due[1].id]
    assert scheduler.count() == 1 and scheduler.enqueue_jobs() == []


def test_get_queue_for_job_follows_the_queue_class_name_in_meta(conn: redis.Redis, prefix: str) -> None:
    path = f"{__name__}.OtherQueue"
    for make in (Scheduler, rq_scheduler.Scheduler):
        scheduler = make(f"{prefix}-g", connection=conn, queue_class=path)
        job = scheduler.enqueue_in(timedelta(hours=1), RECORD, 1)
        assert job.meta["queue_class_name"] == path
        queue = scheduler.get_queue_for_job(job)
        assert type(queue) is OtherQueue and queue.name == f"{prefix}-g", make
        plain = make(f"{prefix}-g", connection=conn)
        job2 = plain.enqueue_in(timedelta(hours=1), RECORD, 2, queue_name="elsewhere")
        assert type(plain.get_queue_for_job(job2)) is RQQueue and plain.get_queue_for_job(job2).name == "elsewhere"


# -- 4. jobs a plain rq.Queue scheduled are adopted, not stalled ------------------------------------


def test_forward_adopts_jobs_scheduled_without_the_queue_class(queue: Queue, processes: Processes) -> None:
    """`rq enqueue --schedule-in` without --queue-class writes to RQ's own registry; with no RQ
    scheduler anywhere the forwarder adopts it (with a warning) and the job runs."""
    args = ["-m", "rq.cli", "enqueue", "-u", processes.url, "-q", queue.name, "--job-id", f"{queue.name}-stray",
            "--schedule-in", "2s", RECORD, "stray"]  # fmt: skip
    assert processes.start(*args).wait(30) == 0
    assert ScheduledJobRegistry(queue.name, connection=queue.connection).get_jobs_to_schedule(2**33) != []
    forwarder = processes.forwarder()
    processes.worker(queue.name)  # our queue class, no --with-scheduler: only the forwarder moves jobs
    wait_for(lambda: len(runs(queue.connection, queue.name)) == 1, 20, "the stray job ran")
    assert [r["tag"] for r in runs(queue.connection, queue.name)] == ["stray"]
    forwarder.terminate()
    _, err = forwarder.communicate(timeout=20)
    assert b"adopted 1 job(s) from RQ's rq:scheduled:" in err and b"--queue-class" in err


def test_adoption_can_be_turned_off(queue: Queue, rq_store: DelayStore, processes: Processes) -> None:
    plain = RQQueue(queue.name, connection=queue.connection)
    job = plain.enqueue_in(timedelta(seconds=1), RECORD, "left")
    processes.forwarder("--no-rq-adopt")
    time.sleep(2.5)  # nothing to wait for: the job must stay where RQ put it
    assert not rq_store.exists(job.id) and job.id in ScheduledJobRegistry(queue=plain)
    assert job.get_status() == JobStatus.SCHEDULED


def test_adopt_moves_registry_entries_without_reading_meta(queue: Queue, rq_store: DelayStore) -> None:
    plain = RQQueue(queue.name, connection=queue.connection)
    when = datetime.now(timezone.utc) + timedelta(minutes=10)
    job = plain.enqueue_at(when, RECORD, "adopted")
    queue.connection.hset(job.key, "meta", b"\x80\x04not a pickle anyone should load")
    report = adopt(queue.connection, rq_store, [queue.name])
    assert report.total_moved == 1
    assert rq_store.get(job.id).ready_ms == int(when.timestamp()) * 1000  # type: ignore[union-attr]  # RQ keeps whole seconds
    registry = ScheduledJobRegistry(queue=plain)
    assert registry.get_job_ids() == [job.id] and registry.get_jobs_to_schedule(int(time.time()) + 10**9) == []
    assert adopt(queue.connection, rq_store, [queue.name]).total_moved == 0


def test_rq_migrate_honours_rq_schedulers_queue_class_name_and_cron_syntax(valkey_url: str, prefix: str) -> None:
    url = valkey_url.rsplit("/", 1)[0] + "/12"
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    try:
        old = rq_scheduler.Scheduler(f"{prefix}-m", connection=conn, queue_class=f"{__name__}.OtherQueue")
        cron = old.cron("5 * * * * *", RECORD)
        args = ["rq-migrate", "--url", url, "--rq-redis", url, "--prefix", prefix, "--shards", str(SHARDS)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        envelope = Envelope.decode(DelayStore.from_url(url, prefix=prefix, shards=SHARDS).get(cron.id).envelope)  # type: ignore[union-attr]
        assert envelope.meta["queue_class"] == f"{__name__}.OtherQueue"
        assert envelope.meta["schedule"] == {"cron_string": "5 * * * * *", "use_local_timezone": False,
                                             "cron_syntax": "rq-scheduler"}  # fmt: skip
    finally:
        conn.flushdb()
        conn.close()
