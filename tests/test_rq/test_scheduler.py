"""delayq_backends.rq.Scheduler: rq-scheduler's API and behaviour, no daemon."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
import rq_scheduler
from rq import Queue as RQQueue
from rq import Worker
from rq.connections import NoRedisConnectionException
from rq.job import Job, JobStatus

from delayq_backends import DelayStore, InvalidTimeError
from delayq_backends.forwarder import Forwarder
from delayq_backends.rq import InvalidScheduleError, JobNotScheduledError, Queue, RQTarget, Scheduler
from delayq_backends.rq import scheduler as scheduler_module
from delayq_backends.rq.periodic import next_cron_time
from delayq_backends.targets import RedisListTarget
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for

RECORD = "tests.test_rq.jobs.record"


@pytest.fixture
def scheduler(conn: redis.Redis, rq_store: DelayStore, prefix: str) -> Scheduler:
    return Scheduler(f"{prefix}-s", connection=conn, delay_store=rq_store)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


# -- rq-scheduler's README, run unchanged but for the import ------------------------------------

README_EXAMPLES = """
from redis import Redis
from rq import Queue
from rq_scheduler import Scheduler
from datetime import datetime

scheduler = Scheduler(connection=Redis()) # Get a scheduler for the "default" queue
scheduler = Scheduler('foo', connection=Redis()) # Get a scheduler for the "foo" queue

# You can also instantiate a Scheduler using an RQ Queue
queue = Queue('bar', connection=Redis())
scheduler = Scheduler(queue=queue)

scheduler.enqueue_at(datetime(2020, 1, 1), func) # Date time should be in UTC
scheduler.enqueue_at(datetime(2020, 1, 1, 3, 4), func, 'foo', bar=baz)

from datetime import timedelta

# Schedule a job to run 10 minutes, 1 hour and 1 day later
scheduler.enqueue_in(timedelta(minutes=10), count_retweets, tweet_id)
scheduler.enqueue_in(timedelta(hours=1), count_retweets, tweet_id)
scheduler.enqueue_in(timedelta(days=1), count_retweets, tweet_id)

scheduler.schedule(
    scheduled_time=datetime.utcnow(), # Time for first execution, in UTC timezone
    func=func,                     # Function to be queued
    args=[arg1, arg2],             # Arguments passed into function when executed
    kwargs={'foo': 'bar'},         # Keyword arguments passed into function when executed
    interval=60,                   # Time before the function is called again, in seconds
    repeat=10,                     # Repeat this number of times (None means repeat forever)
    meta={'foo': 'bar'}            # Arbitrary pickleable data on the job itself
)

scheduler.cron(
    cron_string,                # A cron string (e.g. "0 0 * * 0")
    func=func,                  # Function to be queued
    args=[arg1, arg2],          # Arguments passed into function when executed
    kwargs={'foo': 'bar'},      # Keyword arguments passed into function when executed
    repeat=10,                  # Repeat this number of times (None means repeat forever)
    queue_name=queue_name,      # In which queue the job should be put in
    meta={'foo': 'bar'},        # Arbitrary pickleable data on the job itself
    use_local_timezone=False    # Interpret hours in the local timezone
)

list_of_job_instances = scheduler.get_jobs()
# get all jobs until 2012-11-30 10:00:00
list_of_job_instances = scheduler.get_jobs(until=datetime(2012, 10, 30, 10))
# get all jobs for the next hour
list_of_job_instances = scheduler.get_jobs(until=timedelta(hours=1))
# get all jobs with execution times
jobs_and_times = scheduler.get_jobs(with_times=True)

job_instance = list(scheduler.get_jobs())[0]
job_id = job_instance.id
if job_instance in scheduler:
    found_instance = True
if job_id in scheduler:
    found_id = True

job = job_instance
scheduler.cancel(job)
"""


def run_readme(import_line: str, url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the README's examples with ``Redis()`` meaning ``url``; returns their namespace."""

    kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    settings = {k: kwargs[k] for k in ("host", "port", "db")}

    class Redis(redis.Redis):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**{**settings, **kwargs})

    monkeypatch.setattr(redis, "Redis", Redis)
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)
    namespace: dict[str, Any] = {
        "func": RECORD, "baz": 3, "count_retweets": RECORD, "tweet_id": 42, "arg1": 1, "arg2": 2,
        "cron_string": "0 0 * * 0", "queue_name": f"{prefix}-cron",
    }  # fmt: skip
    code = README_EXAMPLES.replace("from rq_scheduler import Scheduler", import_line)
    if "rq_scheduler" in import_line:  # rq-scheduler 0.14 refuses its own README's Scheduler(queue=queue)
        code = code.replace("Scheduler(queue=queue)", "Scheduler(queue=queue, connection=Redis())")
    exec(compile(code, "rq-scheduler README", "exec"), namespace)
    return namespace


def scheduled_set(jobs_and_times: Iterator[Any]) -> list[str]:
    """What was scheduled, comparable across the two schedulers (ids differ, seconds may)."""
    return sorted(
        repr((j.func_name, j.args, j.kwargs, j.origin, j.result_ttl, sorted(j.meta.items()), round(t.timestamp() / 60)))
        for j, t in jobs_and_times
    )


def test_rq_schedulers_readme_examples_run_unchanged_and_schedule_the_same(
    valkey_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = valkey_url.rsplit("/", 1)[0]
    theirs_url, ours_url = f"{base}/10", f"{base}/11"
    for url in (theirs_url, ours_url):
        redis.Redis.from_url(url).flushdb()  # our embedded server's spare databases
    with pytest.raises((ValueError, NoRedisConnectionException)):  # 0.14 / 0.13
        rq_scheduler.Scheduler(queue=Queue("bar", connection=redis.Redis.from_url(theirs_url)))
    theirs = run_readme("from rq_scheduler import Scheduler", theirs_url, prefix, monkeypatch)
    ours = run_readme("from delayq_backends.rq import Scheduler", ours_url, prefix, monkeypatch)
    assert isinstance(ours["scheduler"], Scheduler) and isinstance(theirs["scheduler"], rq_scheduler.Scheduler)
    assert ours["found_instance"] and ours["found_id"] and ours["job"] not in ours["scheduler"]
    mine, original = ours["scheduler"], theirs["scheduler"]
    assert mine.count() == original.count() == 6  # seven scheduled, one cancelled
    assert scheduled_set(mine.get_jobs(with_times=True)) == scheduled_set(original.get_jobs(with_times=True))
    (due,) = [t for j, t in mine.get_jobs(with_times=True) if j.args == ("foo",)]
    assert due == datetime(2020, 1, 1, 3, 4)  # naive means UTC, and is returned naive, as rq-scheduler does


# -- periodic jobs ------------------------------------------------------------------------------


def rq_scheduler_runs(conn: redis.Redis, repeat: int) -> int:
    """How many runs rq-scheduler itself gives ``schedule(interval=…, repeat=repeat)``."""
    original = rq_scheduler.Scheduler("parity", connection=conn)
    job = original.schedule(datetime(2020, 1, 1), RECORD, interval=1, repeat=repeat)
    count = 0
    while job.id in original:
        original.enqueue_job(Job.fetch(job.id, connection=conn))
        count += 1
    conn.delete(original.scheduled_jobs_key, "rq:queue:parity", job.key)
    return count


def test_schedule_interval_repeat_runs_as_rq_scheduler_with_three_forwarders(
    valkey_url: str, scheduler: Scheduler, rq_store: DelayStore, processes: Processes
) -> None:
    parity_db = redis.Redis.from_url(valkey_url.rsplit("/", 1)[0] + "/12")
    expected = rq_scheduler_runs(parity_db, repeat=3)
    assert expected == 3  # repeat counts the runs in all, this first one included
    for _ in range(3):
        processes.forwarder()
    processes.worker(scheduler.queue_name)
    listening = RQQueue(scheduler.queue_name, connection=scheduler.connection)
    wait_for(lambda: bool(Worker.all(queue=listening)), 20, "the worker to start")
    start = datetime.now(timezone.utc) + timedelta(seconds=0.5)
    job = scheduler.schedule(start, RECORD, args=["p"], interval=2, repeat=3)
    wait_for(lambda: len(runs(scheduler.connection, scheduler.queue_name)) == expected, 20, f"{expected} runs")
    wait_for(lambda: job not in scheduler, 5, "the schedule to end")
    at = [r["at"] for r in runs(scheduler.connection, scheduler.queue_name)]
    # each run is queued 2 s after the previous was queued; start times add the worker's pick-up jitter
    assert all(1.9 <= b - a < 3 for a, b in zip(at, at[1:])), f"runs at {at}"
    processes.forwarder()  # one more forwarder, after the end: nothing more runs
    wait_for(lambda: job.get_status() == JobStatus.FINISHED, 10, "the last run finished")
    assert len(runs(scheduler.connection, scheduler.queue_name)) == expected
    # the runs left are counted in the store's envelope: the forwarder never rewrites (or unpickles) job.meta
    assert Job.fetch(job.id, connection=scheduler.connection).meta["repeat"] == 3
    assert scheduler.connection.ttl(job.key) == -1  # result_ttl=-1: the hash outlives the interval


def test_cron_fires_once_per_minute_boundary_with_forwarders_racing(
    conn: redis.Redis, rq_store: DelayStore, prefix: str
) -> None:
    """A fake clock an hour back makes every boundary due at once; three forwarders race through
    them. Each boundary is moved exactly once: pushes == boundaries the schedule advanced."""
    boundary = (int(time.time()) // 60 - 60) * 60
    clock = [boundary - 5.0]
    now: Callable[[], float] = lambda: clock[0]  # noqa: E731
    scheduler = Scheduler(f"{prefix}-cron", connection=conn, delay_store=rq_store, clock=now)
    job = scheduler.cron("*/1 * * * *", RECORD, args=["c"])
    item = rq_store.get(job.id)
    assert item is not None and item.ready_ms == boundary * 1000
    forwarders = [Forwarder(rq_store, [RQTarget(conn, clock=lambda: int(now() * 1000))]) for _ in range(3)]

    def race() -> None:
        threads = [threading.Thread(target=lambda f=f: [f.run_once() for _ in range(8)]) for f in forwarders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    race()
    for _ in range(3):  # and then some, one after the other, so the chain surely advanced
        assert forwarders[0].run_once() == 1
    pushes = conn.llen(f"rq:queue:{prefix}-cron")
    item = rq_store.get(job.id)
    assert item is not None and pushes >= 4
    assert item.ready_ms == (boundary + 60 * pushes) * 1000, "a minute boundary was moved twice or skipped"
    clock[0] = boundary + 60 * 30 + 10.0  # the forwarders were down: boundaries passed meanwhile run once, not all
    wait_for(lambda: forwarders[0].run_once() == 1, 5, "the overdue cron run")
    item = rq_store.get(job.id)
    assert item is not None and item.ready_ms == (boundary + 60 * 31) * 1000


@pytest.fixture
def paris(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def run_times(cron: str, start: datetime, n: int) -> list[str]:
    t, out = start.timestamp(), []
    for _ in range(n):
        t = next_cron_time(cron, t, use_local_timezone=True)
        out.append(datetime.fromtimestamp(t, timezone.utc).strftime("%m-%d %H:%M"))
    return out


def test_cron_in_the_local_zone_is_dst_correct(paris: None) -> None:
    cest, cet = timezone(timedelta(hours=2)), timezone(timedelta(hours=1))
    # 09:00 Paris stays 09:00 on the wall: 07:00 UTC in summer time, 08:00 UTC after
    assert run_times("0 9 * * *", datetime(2026, 10, 23, 12, tzinfo=cest), 3) == [
        "10-24 07:00",
        "10-25 08:00",
        "10-26 08:00",
    ]
    # every real hour once across the repeated hour
    assert run_times("0 * * * *", datetime(2026, 10, 25, 0, 30, tzinfo=cest), 4) == [
        "10-24 23:00", "10-25 00:00", "10-25 01:00", "10-25 02:00",
    ]  # fmt: skip
    # a fixed 02:30 runs once on the day 02:30 happens twice
    assert run_times("30 2 * * *", datetime(2026, 10, 24, 12, tzinfo=cest), 2) == ["10-25 00:30", "10-26 01:30"]
    # and right after the jump on the day 02:30 does not exist
    assert run_times("30 2 * * *", datetime(2026, 3, 28, 12, tzinfo=cet), 2) == ["03-29 01:00", "03-30 00:30"]
    # UTC (the default) knows no DST
    assert next_cron_time("0 9 * * *", utc(2026, 10, 24, 12).timestamp()) == utc(2026, 10, 25, 9).timestamp()


# -- the rest of the API ------------------------------------------------------------------------


def test_cancel_means_it_never_runs(scheduler: Scheduler, rq_store: DelayStore, conn: redis.Redis) -> None:
    gone = scheduler.enqueue_at(datetime(2020, 1, 1), RECORD, "gone")
    by_id = scheduler.enqueue_at(datetime(2020, 1, 1), RECORD, "by id")
    kept = scheduler.enqueue_at(datetime(2020, 1, 1), RECORD, "kept")
    scheduler.cancel(gone)
    scheduler.cancel(by_id.id)
    assert gone not in scheduler and by_id.id not in scheduler and kept in scheduler
    assert Forwarder(rq_store, [RQTarget(conn)]).run_once() == 1
    assert conn.lrange(f"rq:queue:{scheduler.queue_name}", 0, -1) == [kept.id.encode()]


def test_change_execution_time_count_and_get_jobs(scheduler: Scheduler, rq_store: DelayStore) -> None:
    jobs = [scheduler.enqueue_at(utc(2031, 1, 1, h), RECORD, h) for h in range(5)]
    scheduler.change_execution_time(jobs[0], datetime(2031, 1, 1, 10))  # naive: UTC
    assert [j.id for j in scheduler.get_jobs()] == [j.id for j in jobs[1:] + jobs[:1]]
    assert scheduler.count() == 5 and scheduler.count(until=utc(2031, 1, 1, 2)) == 2
    assert scheduler.count(until=utc(2031, 1, 1, 2).timestamp()) == 2  # epoch seconds
    assert scheduler.count(until=timedelta(days=1)) == 0
    page = list(scheduler.get_jobs(with_times=True, offset=1, length=2))
    assert [(j.id, t) for j, t in page] == [
        (jobs[2].id, datetime(2031, 1, 1, 2)),
        (jobs[3].id, datetime(2031, 1, 1, 3)),
    ]
    with pytest.raises(InvalidScheduleError, match="both offset and length"):
        list(scheduler.get_jobs(offset=1))
    jobs[4].delete()
    assert jobs[4].id not in [j.id for j in scheduler.get_jobs()] and jobs[4] not in scheduler  # cleaned up
    scheduler.cancel(jobs[1])
    with pytest.raises(JobNotScheduledError, match=jobs[1].id):
        scheduler.change_execution_time(jobs[1], utc(2032, 1, 1))
    assert isinstance(JobNotScheduledError("x"), ValueError)  # rq-scheduler raises ValueError here


def test_depends_on_defers_until_the_dependency_finished_as_rq_scheduler_does(
    scheduler: Scheduler, rq_store: DelayStore, conn: redis.Redis, processes: Processes
) -> None:
    queue = Queue(scheduler.queue_name, connection=conn, delay_store=rq_store)
    parent = queue.enqueue(RECORD, "parent")
    child = scheduler.enqueue_at(datetime(2020, 1, 1), RECORD, "child", depends_on=parent)
    assert Forwarder(rq_store, [RQTarget(conn)]).run_once() == 1
    assert child.get_status() == JobStatus.DEFERRED and queue.job_ids == [parent.id]
    processes.worker(queue.name, burst=True).wait(30)
    assert [r["tag"] for r in runs(conn, queue.name)] == ["parent", "child"]


def test_naive_times_follow_each_original(
    scheduler: Scheduler, queue: Queue, rq_store: DelayStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        naive = datetime(2031, 7, 1, 12)
        by_scheduler = scheduler.enqueue_at(naive, RECORD, 1)  # rq-scheduler: UTC
        by_queue = queue.enqueue_at(naive, RECORD, 2)  # RQ: the machine's local time
    finally:
        monkeypatch.undo()
        time.tzset()
    assert rq_store.get(by_scheduler.id).ready_ms == utc(2031, 7, 1, 12).timestamp() * 1000  # type: ignore[union-attr]
    assert rq_store.get(by_queue.id).ready_ms == utc(2031, 7, 1, 16).timestamp() * 1000  # type: ignore[union-attr]


def test_bad_input_is_refused_with_what_to_do(scheduler: Scheduler, queue: Queue, rq_store: DelayStore) -> None:
    with pytest.raises(InvalidScheduleError, match="without interval"):
        scheduler.schedule(datetime(2031, 1, 1), RECORD, repeat=3)
    for interval in (float("nan"), float("inf"), 0, -5):
        with pytest.raises(InvalidScheduleError, match="seconds > 0"):
            scheduler.schedule(datetime(2031, 1, 1), RECORD, interval=interval)
    with pytest.raises(InvalidScheduleError, match="not valid"):
        scheduler.cron("every minute", RECORD)
    with pytest.raises(InvalidTimeError, match="not a finite time|cannot schedule"):
        scheduler.enqueue_at(float("nan"), RECORD)  # type: ignore[arg-type]
    with pytest.raises(InvalidTimeError, match="pass a datetime"):
        queue.enqueue_at(float("nan"), RECORD)  # type: ignore[arg-type]
    with pytest.raises(InvalidTimeError, match="timedelta"):
        scheduler.enqueue_in(5, RECORD)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Scheduler()
    assert sum(s.scheduled for s in rq_store.stats()) == 0  # nothing half-stored


def test_get_jobs_pages_by_score_through_ties_and_other_targets(
    scheduler: Scheduler, rq_store: DelayStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "PAGE", 3)
    at = [utc(2031, 1, 1, 0, 0, s // 4) for s in range(14)]  # runs of 4 jobs on one millisecond
    jobs = [scheduler.enqueue_at(t, RECORD, i) for i, t in enumerate(at)]
    for i in range(5):  # items of another target interleaved: paged over, never returned
        rq_store.schedule(f"list-{i}", at[3 * i], RedisListTarget.envelope("elsewhere", b""))
    listed = [j.id for j in scheduler.get_jobs()]
    assert sorted(listed) == sorted(j.id for j in jobs) and len(listed) == len(set(listed))
    assert scheduler.count() == 14 and scheduler.count(until=at[7]) == 8


# -- first contact: freezegun and rq-scheduler's daemon methods ----------------------------------


def test_scheduler_reads_the_clock_when_called_so_freezegun_moves_it(
    scheduler: Scheduler, rq_store: DelayStore
) -> None:
    """rq-scheduler's ``enqueue_in`` and ``cron`` follow ``freeze_time``; so do ours."""
    freezegun = pytest.importorskip("freezegun")
    theirs = rq_scheduler.Scheduler(connection=scheduler.connection)
    with freezegun.freeze_time("2030-01-01 00:00:00"):
        job = scheduler.enqueue_in(timedelta(minutes=5), RECORD, "in")
        cron = scheduler.cron("0 12 * * *", RECORD, args=["cron"], cron_syntax="cron")
        assert [t for _, t in scheduler.get_jobs(with_times=True)] == [datetime(2030, 1, 1, 0, 5),
                                                                        datetime(2030, 1, 1, 12, 0)]  # fmt: skip
        theirs_job = theirs.enqueue_in(timedelta(minutes=5), RECORD, "theirs")
    try:
        assert rq_store.get(job.id).ready_ms == int(utc(2030, 1, 1, 0, 5).timestamp() * 1000)  # type: ignore[union-attr]
        assert rq_store.get(cron.id).ready_ms == int(utc(2030, 1, 1, 12).timestamp() * 1000)  # type: ignore[union-attr]
        assert theirs.connection.zscore(theirs.scheduled_jobs_key, theirs_job.id) == utc(2030, 1, 1, 0, 5).timestamp()
    finally:
        theirs.cancel(theirs_job)


@pytest.mark.parametrize("method", ["run", "acquire_lock", "register_birth", "register_death", "remove_lock",
                                    "heartbeat"])  # fmt: skip
def test_rq_scheduler_daemon_methods_say_delayq_forward_replaces_them(scheduler: Scheduler, method: str) -> None:
    with pytest.raises(scheduler_module.NoSchedulerProcessError) as caught:
        getattr(scheduler, method)()
    message = str(caught.value)
    assert "\n" not in message and f"Scheduler.{method}()" in message
    assert "delayq forward" in message and "--rq-redis" in message and "instead of rqscheduler" in message


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("scheduler_lock_key", "delayq stats"),
        ("scheduler_key", "delayq stats"),
        ("redis_scheduler_namespace_prefix", "no scheduler instance"),
        ("scheduled_jobs_key", "Scheduler.get_jobs()"),
    ],
)
def test_rq_scheduler_daemon_keys_say_there_is_none_and_what_to_read(scheduler: Scheduler, key: str, says: str) -> None:
    """rq-scheduler has them (``getattr`` shows it); a ported health check reading one gets the
    fix, not a bare AttributeError; ``hasattr`` answers False as for any missing attribute."""
    assert isinstance(getattr(rq_scheduler.Scheduler, key), str)
    for owner in (scheduler, Scheduler):
        with pytest.raises(scheduler_module.NoSchedulerKeyError) as caught:
            getattr(owner, key)
        message = str(caught.value)
        assert f"Scheduler.{key}: delayq_backends.rq.Scheduler has no scheduler process" in message
        assert says in message and "delayq forward" in message
        assert isinstance(caught.value, AttributeError) and not hasattr(owner, key)
