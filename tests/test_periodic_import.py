"""``delayq periodic import`` from the real peers: django-celery-beat's tables on SQLite (made by
Django's own migrations, filled through its ORM) and celery-redbeat's keys on the test Redis
(written by ``RedBeatSchedulerEntry.save``). Every field survives the move, ``--dry-run``
writes nothing, a second import changes nothing, a solar schedule (or redbeat's rrule) is
refused by name while the rest imports; then an imported entry fires once per period through a
real ``delayq forward`` that is SIGKILLed and restarted."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.schedules import crontab, schedule
from click.testing import CliRunner, Result

from delayq_backends import DelayStore
from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.message import StoredMessage
from delayq_backends.celery.periodic import _message_of
from delayq_backends.cli import main
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.keys import meta_key
from delayq_backends.periodic import ops
from delayq_backends.periodic.schedules import Cron, Period, run_task_id
from delayq_backends.periodic.state import state_of
from delayq_backends.timeutil import to_ms
from tests.harness import Launcher, make_store
from tests.helpers import wait_for
from tests.readme import snippet
from tests.test_celery.conftest import broker_url_for
from tests.test_celery.harness import delayq_cli, new_env

SETTINGS = """
SECRET_KEY = "import-test"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": %r}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""

NOW = datetime.now(timezone.utc).replace(microsecond=0)
LAST = NOW - timedelta(seconds=3)
START = datetime(2026, 1, 5, 8, 0, tzinfo=timezone.utc)
EXPIRES = datetime(2099, 1, 1, tzinfo=timezone.utc)
CLOCKED = NOW + timedelta(hours=1)


def ms(when: datetime) -> int:
    return to_ms(when)


@contextmanager
def python_crontab() -> Iterator[None]:
    """Module ``crontab`` as python-crontab's for the block. django-celery-beat imports python-crontab
    by that name, which the ``crontab`` package (rq-scheduler's parser, the rq extra) takes too:
    both installed, the package wins and django-celery-beat's import fails. A team on
    django-celery-beat has no rq-scheduler; here both are, so Django loads its models with
    python-crontab's module, and everything else keeps the package."""
    path = importlib.metadata.distribution("python-crontab").locate_file("crontab.py")
    spec = importlib.util.spec_from_file_location("crontab", str(path))
    assert spec is not None and spec.loader is not None
    theirs = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("crontab")
    sys.modules["crontab"] = theirs
    try:
        spec.loader.exec_module(theirs)
        yield
    finally:
        if ours is None:
            del sys.modules["crontab"]
        else:
            sys.modules["crontab"] = ours


@pytest.fixture(scope="module")
def django_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Django project of django-celery-beat alone on SQLite, migrated by Django and filled
    through its ORM: an interval, a crontab in Berlin time, a clocked one-off and a solar entry."""
    root = tmp_path_factory.mktemp("django")
    database = root / "beat.sqlite3"
    (root / "import_settings.py").write_text(SETTINGS % str(database))
    sys.path.insert(0, str(root))
    mp = pytest.MonkeyPatch()
    mp.setenv("DJANGO_SETTINGS_MODULE", "import_settings")
    import django
    from django.core.management import call_command

    with python_crontab():
        django.setup()
    call_command("migrate", verbosity=0)
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(
        name="dj-every", task="proj.report", interval=every, args=json.dumps([1, "two"]),
        kwargs=json.dumps({"k": 3}), queue="imports", exchange="imports-x", routing_key="imports.rk",
        headers=json.dumps({"tenant": "acme"}), priority=7, expire_seconds=30, start_time=START,
        last_run_at=LAST, total_run_count=41,
    )  # fmt: skip
    berlin = CrontabSchedule.objects.create(
        minute="30", hour="2", day_of_week="1-5", day_of_month="*", month_of_year="*", timezone="Europe/Berlin"
    )
    PeriodicTask.objects.create(
        name="dj-nightly", task="proj.nightly", crontab=berlin, enabled=False, expires=EXPIRES, total_run_count=5,
    )  # fmt: skip
    clocked = ClockedSchedule.objects.create(clocked_time=CLOCKED)
    PeriodicTask.objects.create(name="dj-once", task="proj.once", clocked=clocked, one_off=True)
    sun = SolarSchedule.objects.create(event="sunrise", latitude=52.52, longitude=13.40)
    PeriodicTask.objects.create(name="dj-sunrise", task="proj.sunrise", solar=sun)
    yield database
    mp.undo()
    sys.path.remove(str(root))


@pytest.fixture
def cli(valkey_url: str, prefix: str) -> Callable[..., Result]:
    def invoke(*args: str) -> Result:
        store = [
            "--url",
            valkey_url,
            "--prefix",
            prefix,
            "--shards",
            "4",
            "--celery-broker",
            "redis://broker.invalid/1",
        ]
        return CliRunner().invoke(main, ["periodic", "import", *args, *store])

    return invoke


def lines(result: Result) -> list[str]:
    """The diff's lines (one per entry), without the summary."""
    return [line for line in result.output.splitlines() if not line.startswith(("django-celery-beat:", "redbeat:"))]


def keys(store: DelayStore) -> dict[bytes, Any]:
    """Every key of the store's prefix and its value (a dry run must change none), but the
    layout record any command opening the store writes first (its ``meta``)."""
    client, layout = store.client, meta_key(store.config.prefix).encode()
    found = client.scan_iter(match=f"*{store.config.prefix}*")
    return {k: client.dump(k) for k in found if b"redbeat" not in k and k != layout}


def template(store: DelayStore, name: str) -> tuple[StoredMessage, Any]:
    item = store.get(ops.item_id(name))
    assert item is not None, name
    envelope = Envelope.decode(item.envelope)
    return _message_of(envelope), state_of(envelope)


def test_django_celery_beat_moves_with_every_field(
    django_db: Path, cli: Callable[..., Result], vstore: DelayStore
) -> None:
    sqlite = f"sqlite:///{django_db}"
    before = keys(vstore)
    dry = cli("--from", "django-celery-beat", "--database", sqlite, "--dry-run")
    assert dry.exit_code == 1, dry.output  # one refused
    assert lines(dry) == [
        "added: dj-every", "added: dj-nightly", "added: dj-once",
        "refused: dj-sunrise: solar schedule (sunrise): solar schedules are not supported by delayq periodic "
        "entries (no forwarder-side ephemeris): use a crontab near the event's time, or keep this entry in "
        "django-celery-beat",
    ]  # fmt: skip
    assert "dry run, nothing written" in dry.output
    assert keys(vstore) == before, "the dry run wrote"

    done = cli("--from", "django-celery-beat", "--database", sqlite)
    assert done.exit_code == 1 and "refused: dj-sunrise" in done.output, done.output
    assert "added: dj-every" in done.output and "3 added" in done.output
    by_name = {e.name: e for e in ops.statuses(vstore)}
    assert sorted(by_name) == ["dj-every", "dj-nightly", "dj-once"]

    every = by_name["dj-every"]
    assert (every.schedule, every.enabled, every.runs, every.start_ms) == ("every 10s", True, 41, ms(START))
    assert every.last_run_ms == ms(LAST)
    assert every.next_run_ms == ms(LAST) + 10_000, "the first period is the first after its last run"
    message, state = template(vstore, "dj-every")
    assert message.task == "proj.report"
    args, kwargs, _ = json.loads(message.body)
    assert (args, kwargs) == ([1, "two"], {"k": 3})
    assert message.headers["tenant"] == "acme" and message.headers["periodic_task_name"] == "dj-every"
    assert message.properties["priority"] == 7
    assert (message.exchange, message.routing_key) == ("imports-x", "imports.rk")
    assert state.expires == 30.0  # expire_seconds: counted from each run's send
    assert every.options == {
        "expires": 30.0, "priority": 7, "headers": {"tenant": "acme", "periodic_task_name": "dj-every"},
        "exchange": "imports-x", "routing_key": "imports.rk",
    }  # the entry's run options, as `periodic show`, the API and the dashboard read them back  # fmt: skip

    nightly = by_name["dj-nightly"]
    assert nightly.schedule == "crontab 30 2 * * 1,2,3,4,5 (Europe/Berlin)" and nightly.tz == "Europe/Berlin"
    assert (nightly.enabled, nightly.state, nightly.runs) == (False, "paused", 5)
    assert nightly.end_ms == ms(EXPIRES) and nightly.last_run_ms is None  # PeriodicTask.save() clears a disabled one's
    message, _ = template(vstore, "dj-nightly")
    assert message.headers["expires"] == EXPIRES.isoformat()  # an absolute expires: the run's too
    assert nightly.options["expires"] == EXPIRES.isoformat()

    once = by_name["dj-once"]
    assert once.schedule.startswith("once at ") and once.next_run_ms == ms(CLOCKED) and once.runs == 0

    again = cli("--from", "django-celery-beat", "--database", sqlite)
    assert lines(again)[:3] == ["unchanged: dj-every", "unchanged: dj-nightly", "unchanged: dj-once"], again.output
    assert "0 added, 0 changed, 3 unchanged" in again.output
    # the Django ORM reads the same rows as the SQLite reader: nothing to change either
    orm = cli("--from", "django-celery-beat")
    assert "0 added, 0 changed, 3 unchanged, 1 refused" in orm.output, orm.output


@pytest.fixture
def redbeat_app(system_redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery("redbeat-import", set_as_current=False)
    app.conf.update(redbeat_redis_url=system_redis_url, redbeat_key_prefix=f"{prefix}:redbeat:", timezone="UTC")
    yield app
    app.close()


def test_redbeat_moves_with_every_field(
    redbeat_app: Celery, system_redis_url: str, cli: Callable[..., Result], vstore: DelayStore
) -> None:
    from redbeat.schedulers import RedBeatSchedulerEntry
    from redbeat.schedules import rrule

    options = {
        "queue": "rb",
        "priority": 3,
        "headers": {"origin": "redbeat"},
        "expires": 20,
        "exchange": "rb-x",
        "routing_key": "rb.rk",
    }
    entry = RedBeatSchedulerEntry(
        "rb-every", "proj.tick", schedule(timedelta(seconds=5)), args=[7], kwargs={"x": "y"}, options=options,
        app=redbeat_app, total_run_count=11,
    )  # fmt: skip
    entry.save()
    entry._next_instance(last_run_at=LAST)  # redbeat's own bookkeeping of a run: last_run_at, total_run_count 12
    RedBeatSchedulerEntry(
        "rb-cron", "proj.cron", crontab(minute="*/15", hour="9-17"), enabled=False, app=redbeat_app
    ).save()
    RedBeatSchedulerEntry("rb-rrule", "proj.rrule", rrule("MINUTELY"), app=redbeat_app).save()
    redbeat = [
        "--from",
        "redbeat",
        "--redbeat-redis",
        system_redis_url,
        "--redbeat-prefix",
        f"{vstore.config.prefix}:redbeat:",
    ]

    before = keys(vstore)
    dry = cli(*redbeat, "--dry-run", "--tz", "Europe/Paris")
    assert lines(dry)[:2] == ["added: rb-cron", "added: rb-every"], dry.output
    assert "refused: rb-rrule: redbeat's 'rrule' schedule is not supported" in dry.output and dry.exit_code == 1
    assert keys(vstore) == before, "the dry run wrote"

    done = cli(*redbeat, "--tz", "Europe/Paris")
    assert "2 added, 0 changed, 0 unchanged, 1 refused" in done.output, done.output
    by_name = {e.name: e for e in ops.statuses(vstore)}
    every, cron = by_name["rb-every"], by_name["rb-cron"]
    assert (every.schedule, every.runs, every.last_run_ms, every.enabled) == ("every 5s", 12, ms(LAST), True)
    assert every.next_run_ms == ms(LAST) + 5_000
    message, state = template(vstore, "rb-every")
    args, kwargs, _ = json.loads(message.body)
    assert (message.task, args, kwargs) == ("proj.tick", [7], {"x": "y"})
    assert message.headers["origin"] == "redbeat" and message.properties["priority"] == 3
    assert (message.exchange, message.routing_key, state.expires) == ("rb-x", "rb.rk", 20.0)
    run_options = {k: v for k, v in options.items() if k != "queue"}  # the queue is the entry's routing
    assert every.options == {**run_options, "expires": 20.0}
    assert cron.schedule == "crontab 0,15,30,45 9,10,11,12,13,14,15,16,17 * * * (Europe/Paris)"
    theirs = RedBeatSchedulerEntry.from_key(f"{vstore.config.prefix}:redbeat:rb-cron", app=redbeat_app)
    assert (cron.enabled, cron.runs, cron.last_run_ms) == (False, 0, ms(theirs.last_run_at))  # save()'s "now"

    again = cli(*redbeat, "--tz", "Europe/Paris")
    assert "0 added, 0 changed, 2 unchanged, 1 refused" in again.output, again.output

    # hand writes in redbeat's keys: each refused by name, the others still read
    client = redis.Redis.from_url(system_redis_url)
    rb = f"{vstore.config.prefix}:redbeat:"
    client.hset(f"{rb}garbled", "definition", "{not json")
    client.set(f"{rb}a-string", "x")
    client.hset(f"{rb}no-task", "definition", json.dumps({"name": "no-task", "schedule": 5}))
    client.zadd(f"{rb}:schedule", {f"{rb}garbled": 0, f"{rb}a-string": 0, f"{rb}no-task": 0, f"{rb}gone": 0})
    hostile = cli(*redbeat, "--tz", "Europe/Paris")
    refused = sorted(line.split(":")[1].strip() for line in lines(hostile) if line.startswith("refused"))
    assert refused == ["a-string", "garbled", "gone", "no-task", "rb-rrule"], hostile.output
    assert "2 unchanged" in hostile.output and isinstance(hostile.exception, SystemExit), hostile.output
    client.close()


def test_an_import_refuses_the_name_of_an_entry_from_code(
    django_db: Path, cli: Callable[..., Result], vstore: DelayStore
) -> None:
    """A code entry of the same name would be undone by the next sync: refused, the rest imported."""
    from delayq_backends.celery.periodic import entry_spec

    app = Celery("code", set_as_current=False)
    code = entry_spec(app, "dj-every", {"task": "proj.other", "schedule": 60.0}, source="code")
    ops.sync_code(vstore, [code], kind="celery-periodic")
    done = cli("--from", "django-celery-beat", "--database", f"sqlite:///{django_db}")
    assert "refused: dj-every: entry 'dj-every' comes from code" in done.output, done.output
    assert "2 added" in done.output
    app.close()


# -- the imported entries fire -------------------------------------------------------------------


#: the entry's period: longer than a lease (1 s), so a forwarder stopped while it fires delays no
#: period past the next (periods due together are one run under beat's misfire policy, run_once)
EVERY_S = 3


def test_imported_entries_fire_once_per_period_beside_a_killed_forwarder(
    redbeat_app: Celery, system_redis_url: str, valkey_url: str, prefix: str, tmp_path: Path
) -> None:
    """A redbeat entry every 3 s, imported, fired by two real `delayq forward`, one SIGKILLed after
    two runs and started again: every period from the first to the last reaches the broker's queue
    once, none twice, none lost, none before its time, on redbeat's grid (after its last run)."""
    from redbeat.schedulers import RedBeatSchedulerEntry

    queue = f"{prefix}-q"
    last = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(milliseconds=500)
    entry = RedBeatSchedulerEntry(
        "fast", "proj.fast", schedule(timedelta(seconds=EVERY_S)), options={"queue": queue}, app=redbeat_app
    )
    entry.save()
    entry._next_instance(last_run_at=last)
    base = valkey_url.rsplit("/", 1)[0]
    broker = f"{base}/1"
    store_args = ["--url", f"{base}/0", "--prefix", prefix, "--shards", "4", "--celery-broker", broker]
    imported = CliRunner().invoke(
        main,
        [
            "periodic",
            "import",
            "--from",
            "redbeat",
            "--redbeat-redis",
            system_redis_url,
            "--redbeat-prefix",
            f"{prefix}:redbeat:",
            *store_args,
        ],
    )
    assert "1 added" in imported.output, imported.output
    store = make_store(f"{base}/0", prefix, shards=4)
    queue_client = redis.Redis.from_url(broker)
    launcher = Launcher()
    forward = [sys.executable, "-m", "delayq_backends.cli", "forward", *store_args, "--poll", "0.2", "--lease", "1"]
    try:
        victim = launcher.start(forward, log=tmp_path / "forwarder-a.log")
        survivor = launcher.start(forward, log=tmp_path / "forwarder-b.log")
        wait_for(lambda: queue_client.llen(queue) >= 2, 30, "two runs before the kill")
        time.sleep(EVERY_S / 2)  # mid-period: a kill between a run's publish and its rearm re-sends it (same id)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = queue_client.llen(queue)
        again = launcher.start(forward, log=tmp_path / "forwarder-a-again.log")
        wait_for(lambda: queue_client.llen(queue) >= killed_at + 3, 30, "runs after the kill")
        for proc in (survivor, again):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    except BaseException:
        print(launcher.tail())
        raise
    finally:
        launcher.stop_all(grace=5)
    [status] = ops.statuses(store)
    messages = [json.loads(m) for m in queue_client.lrange(queue, 0, -1)]
    queue_client.delete(queue)
    ids = [m["headers"]["id"] for m in messages]
    assert len(ids) == len(set(ids)), "a period ran twice"
    first_at = to_ms(last) + EVERY_S * 1000
    periods = {
        run_task_id("fast", Period(str(at), at)): at for at in range(first_at, first_at + 200_000, EVERY_S * 1000)
    }
    ats = sorted(periods[i] for i in ids)
    # on redbeat's grid, from the period after its last run on (that one, or the latest due when the
    # forwarder came up, as the run_once misfire policy collapses periods due together)
    assert ats[0] >= first_at, "a period redbeat ran was run again"
    assert ats == list(range(ats[0], ats[-1] + 1, EVERY_S * 1000)), "a period was lost"
    assert status.runs == 1 + len(ats)  # redbeat's count (its one run) goes on
    store.client.close()


# -- docs/migrating.md, every block run as written ------------------------------------------------

PAGE = Path(__file__).resolve().parent.parent / "docs" / "migrating.md"


@pytest.fixture
def page_db(valkey_url: str) -> Iterator[str]:
    """A database of the embedded Valkey of its own for the page's URL (the snippets use the
    default prefix and redbeat's default keys, which a flush removes)."""
    url = valkey_url.rsplit("/", 1)[0] + "/11"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def run_bash(marker: str, url: str, **replace: str) -> list[Result]:
    """Each line of the page's bash block holding ``marker``, as ``delayq`` runs it on ``url``
    (its store, and the snippet's servers), ``replace`` applied to the line first."""
    results = []
    for line in snippet(marker, PAGE).splitlines():
        line = line.replace("redis://127.0.0.1:6379/0", url)
        for old, new in replace.items():
            line = line.replace(old, new)
        words = shlex.split(line)
        env = {"DELAYQ_URL": url}
        while "=" in words[0]:
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        assert words[0] == "delayq", line
        results.append(CliRunner().invoke(main, words[1:], env=env))
    return results


def run_python(marker: str, url: str) -> None:
    exec(compile(snippet(marker, PAGE).replace("redis://127.0.0.1:6379/0", url), "docs/migrating.md", "exec"), {})


def test_docs_redbeat_import_and_rollback(page_db: str) -> None:
    """The import brings redbeat's entry in; the rollback pauses it and writes its last run and
    run count back over what redbeat held (here an older run, as if redbeat's meta were stale)."""
    from redbeat.schedulers import RedBeatSchedulerEntry

    app = Celery("page", set_as_current=False)
    app.conf.redbeat_redis_url = page_db
    theirs = RedBeatSchedulerEntry("nightly", "proj.nightly", crontab(minute="0", hour="3"), app=app, total_run_count=8)
    theirs.save()
    theirs._next_instance(last_run_at=LAST)
    dry, done = run_bash("--from redbeat --redbeat-redis", page_db)
    assert "added: nightly" in dry.output and "dry run" in dry.output, dry.output
    assert done.exit_code == 0 and "1 added" in done.output, done.output
    store = DelayStore.from_url(page_db)
    [entry] = ops.statuses(store)
    assert (entry.runs, entry.last_run_ms, entry.tz) == (9, ms(LAST), "Europe/Berlin")
    theirs.reschedule(last_run_at=LAST - timedelta(days=2))  # redbeat's meta: an older run, no count
    run_python("RedBeatSchedulerEntry.from_key", page_db)
    back = RedBeatSchedulerEntry.from_key("redbeat:nightly", app=app)
    assert (ms(back.last_run_at), back.total_run_count) == (ms(LAST), 9)
    assert ops.statuses(store)[0].state == "paused"
    app.close()
    store.client.close()


def test_docs_django_celery_beat_import_and_rollback(django_db: Path, page_db: str) -> None:
    from django_celery_beat.models import PeriodicTask

    dry, done = run_bash(
        "--from django-celery-beat --database",
        page_db,
        **{"sqlite:///db.sqlite3": f"sqlite:///{django_db}", "mysite.settings": "import_settings"},
    )
    assert "added: dj-every" in dry.output and "refused: dj-sunrise" in dry.output, dry.output
    assert "3 added" in done.output, done.output
    PeriodicTask.objects.filter(name="dj-every").update(last_run_at=None, total_run_count=0)  # stale rows
    run_python("PeriodicTasks.update_changed", page_db)
    row = PeriodicTask.objects.get(name="dj-every")
    assert (row.last_run_at, row.total_run_count) == (LAST, 41)
    store = DelayStore.from_url(page_db)
    assert {e.state for e in ops.statuses(store)} == {"paused"}
    store.client.close()


def test_docs_rq_scheduler_import_and_rollback(page_db: str) -> None:
    import rq_scheduler

    conn = redis.Redis.from_url(page_db)
    later = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0) + timedelta(hours=1)
    job = rq_scheduler.Scheduler("page", connection=conn).schedule(later, "proj.jobs.sync", interval=60, repeat=3)
    dry, done = run_bash("--from rq-scheduler --rq-redis", page_db)
    assert "would move 1" in dry.output and "moved 1 job(s)" in done.output, (dry.output, done.output)
    assert conn.zcard("rq:scheduler:scheduled_jobs") == 0
    run_python('"rq:scheduler:scheduled_jobs", {item.id', page_db)
    assert conn.zrange("rq:scheduler:scheduled_jobs", 0, -1, withscores=True) == [
        (job.id.encode(), later.replace(tzinfo=timezone.utc).timestamp())
    ]
    assert DelayStore.from_url(page_db).get(job.id) is None
    conn.close()


def test_docs_rq_cron_import(page_db: str, tmp_path: Path) -> None:
    config = tmp_path / "page_cron.py"
    config.write_text(
        "from rq import cron\nfrom tests.test_rq.jobs import record\n"
        "cron.register(record, 'default', interval=300, name='sync')\n"
    )
    dry, done = run_bash("--from rq-cron --config", page_db, **{"cron_config.py": str(config)})
    assert "added: sync" in dry.output and "dry run" in dry.output, dry.output
    assert "added: sync" in done.output and done.exit_code == 0, done.output
    store = DelayStore.from_url(page_db)
    assert [(e.name, e.kind, e.source) for e in ops.statuses(store)] == [("sync", "rq", "code")]
    store.client.close()


def test_celery_a_proj_imports_with_the_apps_zone_and_routing(
    redbeat_app: Celery, system_redis_url: str, valkey_server: EmbeddedServer, prefix: str
) -> None:
    """`celery -A proj delayq periodic import`: the user's app builds the entries, so a redbeat
    crontab (which has no zone of its own) is read in the app's `timezone`, and the app's store
    settings say where they go."""
    from redbeat.schedulers import RedBeatSchedulerEntry

    RedBeatSchedulerEntry("rb-9am", "dqt.record", crontab(minute="0", hour="9"), args=["x"], app=redbeat_app).save()
    env = new_env("redis", broker_url_for("redis", None, valkey_server), valkey_server)  # type: ignore[arg-type]
    env.conf = {"timezone": "America/New_York"}
    done = delayq_cli(
        env, "periodic", "import", "--from", "redbeat", "--redbeat-redis", system_redis_url,
        "--redbeat-prefix", f"{prefix}:redbeat:",
    )  # fmt: skip
    assert done.returncode == 0 and "1 added" in done.stdout, done.stdout + done.stderr
    app = env.app()
    try:
        [entry] = ops.statuses(store_for(app))
        assert (entry.name, entry.tz, entry.task) == ("rb-9am", "America/New_York", "dqt.record")
    finally:
        forget_store(app)


def test_a_crontab_last_run_long_ago_catches_up_from_its_latest_period() -> None:
    """An entry moved in with a last run a year old: one catch-up run from the latest period due
    (Berlin wall time), not a walk through the 525,600 minutes since; a recent last run keeps
    its next period."""
    now = ms(datetime(2026, 12, 7, 20, 30, 15, tzinfo=timezone.utc))
    year_ago = now - 365 * 86_400_000
    minutely = Cron("* * * * *", "UTC")
    assert ops.Carried(year_ago, 3).first_slot(minutely, now, None).at_ms == now - 15_000
    daily = Cron("0 9 * * *", "Europe/Berlin")
    slot = ops.Carried(year_ago, 3).first_slot(daily, now, None)
    assert (slot.key, slot.at_ms) == ("2026-12-07T09:00:00", ms(datetime(2026, 12, 7, 8, tzinfo=timezone.utc)))
    before_it = ms(datetime(2026, 12, 7, 7, 30, tzinfo=timezone.utc))  # 08:30 in Berlin: today's 09:00 is due
    assert ops.Carried(before_it, 3).first_slot(daily, now, None) == slot
    after_it = ms(datetime(2026, 12, 7, 8, 30, tzinfo=timezone.utc))  # ran today: tomorrow's is next
    assert ops.Carried(after_it, 3).first_slot(daily, now, None).key == "2026-12-08T09:00:00"
    assert ops.Carried(now - 5_000, 3).first_slot(minutely, now, None).at_ms == now + 45_000
