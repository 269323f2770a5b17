"""What a periodic run carries and when a crontab with its own time zone runs (issue 22), on the
fake-clock harness of ``test_periodic.py``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from celery.schedules import crontab

from delayq_backends.celery.message import StoredMessage
from tests.test_celery.test_periodic import Harness

NEW_YORK = ZoneInfo("America/New_York")


def test_a_run_is_its_own_root() -> None:
    """Runs carried the template's placeholder root_id (all zeros), tying every run to one workflow."""
    h = Harness(datetime(2026, 5, 4, 12, tzinfo=timezone.utc), {"m": {"task": "t.m", "schedule": 60.0}})
    h.sync()
    h.fire_next("m")
    h.fire_next("m")
    runs = [StoredMessage.from_envelope(d.envelope) for d in h.sent.delivered]
    assert len(runs) == 2 and runs[0].task_id != runs[1].task_id
    assert all(run.headers["root_id"] == run.task_id for run in runs)


def test_a_crontab_in_its_own_zone_runs_by_that_zones_clock() -> None:
    """``crontab(hour=9, nowfun=<New York now>)`` in a UTC app became 09:00 UTC."""
    nowfun = lambda: datetime.now(NEW_YORK)  # noqa: E731 - as users write it
    h = Harness(
        datetime(2026, 3, 6, 12, tzinfo=timezone.utc),
        {"ny": {"task": "t", "schedule": crontab(minute=0, hour=9, nowfun=nowfun)}},
        zone="UTC",
    )
    assert h.sync().errors == {}
    for _ in range(3):  # across New York's spring forward (2026-03-08): still 09:00 there
        h.fire_next("ny")
    utc = [when.astimezone(timezone.utc) for _, when in h.runs()]
    assert [(t.day, t.hour) for t in utc] == [(6, 14), (7, 14), (8, 13)]


def test_a_crontab_zone_without_rules_is_refused_by_entry_and_the_others_sync() -> None:
    fixed = timezone(timedelta(hours=-5))
    h = Harness(
        datetime(2026, 3, 6, 12, tzinfo=timezone.utc),
        {
            "offset": {"task": "t", "schedule": crontab(hour=9, nowfun=lambda: datetime.now(fixed))},
            "naive": {"task": "t", "schedule": crontab(hour=9, nowfun=datetime.now)},
            "fine": {"task": "t", "schedule": crontab(minute=0, hour=9)},
        },
        zone="UTC",
    )
    report = h.sync()
    assert report.added == ["fine"] and sorted(report.errors) == ["naive", "offset"]
    assert "no IANA name" in report.errors["offset"] and "without a zone" in report.errors["naive"]
