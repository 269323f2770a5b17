"""The dashboard in a real headless Chromium against a real ``delayq dashboard`` process: it asks
for the token, shows the store's counts and the periodic Celery entries, finds an item (a
periodic entry's as its next run), cancels it and requeues and purges dead letters, and the store
confirms each change. A screenshot is saved as a test artifact
(tests/artifacts/; with DELAYQ_UPDATE_SCREENSHOT=1 also as docs/dashboard.png for the README)."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Celery
from celery.schedules import crontab
from playwright.sync_api import expect

from delayq_backends import DelayStore
from delayq_backends.audit import FORWARDED, AuditRecord, RedisStreamAudit
from delayq_backends.celery.periodic import sync
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.periodic.ops import EntryStatus, item_id, statuses
from delayq_backends.store import SlotAsk
from delayq_backends.testing import CollectingTarget
from tests.helpers import wait_for
from tests.test_web.conftest import ARTIFACTS, ROOT, TOKEN
from tests.test_web.test_api import bury

UPCOMING = 240
#: synced from a beat_schedule; neither falls due while the test runs (no forwarder fires them)
BEAT_SCHEDULE = {
    "hourly-cleanup": {"task": "proj.cleanup", "schedule": 3600.0, "kwargs": {"days": 30}},
    "nightly-report": {"task": "proj.report", "schedule": crontab(minute=30, hour=2), "args": ["daily"]},
}
TIMEOUT_MS = 15_000


def sync_periodic(store: DelayStore) -> list[EntryStatus]:
    """The periodic entries of a small Celery app, synced into the store as a forwarder does."""
    app = Celery("dash", broker="memory://", set_as_current=False)
    app.conf.update(timezone="UTC", beat_schedule=BEAT_SCHEDULE)
    assert sorted(sync(app, store).added) == sorted(BEAT_SCHEDULE)
    return statuses(store)


def shown_time(ms: int) -> str:
    """A time as the page shows it in the test's browser (en-GB, UTC)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%d/%m/%Y, %H:%M:%S")


def fill_store(store: DelayStore, stream: str) -> None:
    """Items over the next 24 h (busier in the morning), one to find, three dead letters, a few
    audit records of recent forwards, two concurrency slot keys in use and two batches."""
    rng = random.Random(7)
    now = store.server_time_ms()
    when = [now + int(abs(rng.gauss(8, 5)) * 3_600_000) % 86_000_000 + 60_000 for _ in range(UPCOMING)]
    store.schedule_many(
        [
            (f"report-{n:04d}", ms / 1000, Envelope("celery", rng.choice(["emails", "reports"]), b"{}"))
            for n, ms in enumerate(when)
        ]
    )
    store.schedule("invoice-42", timedelta(minutes=30), Envelope("rq", "billing", b""), rank=3)
    bury(store, ["dead-a", "dead-b", "dead-c"])
    hold = 3_600_000  # ms: no slot lapses while the test runs
    store.take_slots(
        {"customer-42": SlotAsk(3, [(f"c42-{i}", i) for i in range(8)]), "acme/eu": SlotAsk(1, [("eu-0", 0)])},
        hold_ms=hold,
        wait_ms=hold,
    )
    store.set_slot_limit("customer-42", 3)
    store.open_batch("import-11")  # completed: 40 sub-jobs, 2 failed
    store.add_to_batch("import-11", [f"imp-{n}" for n in range(40)])
    store.close_batch("import-11")
    for n in range(40):
        store.finish_in_batch("import-11", f"imp-{n}", ok=n % 20 != 7)
    store.open_batch("order-7")  # open: 7 of 12 finished, 1 failed
    store.add_to_batch("order-7", [f"order-7-{n}" for n in range(12)])
    for n in range(7):
        store.finish_in_batch("order-7", f"order-7-{n}", ok=n != 3)
    audit = RedisStreamAudit(store.config.url, stream, background=False)
    ready = [now - 60_000 + n * 500 for n in range(60)]
    audit.record(
        [
            AuditRecord(FORWARDED, f"done-{n}", "celery", "emails", r, r + rng.randint(2, 40), 1, "fwd")
            for n, r in enumerate(ready)
        ]
    )
    audit.close()


def test_the_dashboard_shows_counts_cancels_and_requeues(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore, prefix: str
) -> None:
    stream = f"{prefix}:audit"
    fill_store(web_store, stream)
    periodic = sync_periodic(web_store)
    dashboard = dashboard_factory("--audit-stream", stream)
    expect.set_options(timeout=TIMEOUT_MS)

    page.goto(dashboard.base + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", "wrong-token-0123456789")
    page.click("#connect")
    expect(page.locator("#login-error")).to_contain_text("refused")
    page.fill("#token", TOKEN)
    page.click("#connect")

    expect(page.locator("#count-scheduled")).to_have_text(str(UPCOMING + 1 + len(BEAT_SCHEDULE)))
    expect(page.locator("#login")).to_be_hidden()
    expect(page.locator("#count-dead")).to_have_text("3")
    expect(page.locator("#count-due")).to_have_text("0")
    expect(page.locator("#shards tbody tr")).to_have_count(web_store.shards)
    expect(page.locator("#dead tbody tr")).to_have_count(3)
    expect(page.locator("#chart svg rect.bar").first).to_be_visible()
    expect(page.locator("#lateness")).to_contain_text("p95")
    expect(page.locator("#groups tbody tr").first).to_contain_text("3 / 3")
    expect(page.locator("#batches tbody tr").first).to_contain_text("7 / 12")
    expect(page.locator("#batches-summary")).to_have_text("(1 open · 0 closed · 1 completed)")
    rows = page.locator("#periodic tbody tr")
    expect(rows).to_have_count(len(BEAT_SCHEDULE))
    for n, entry in enumerate(periodic):  # sorted by name, as listed
        assert entry.next_run_ms is not None
        expect(rows.nth(n)).to_contain_text(entry.name)
        expect(rows.nth(n)).to_contain_text(entry.task)
        expect(rows.nth(n)).to_contain_text(shown_time(entry.next_run_ms))
        expect(rows.nth(n)).to_contain_text("scheduled")
    expect(rows.nth(1)).to_contain_text("crontab")

    page.fill("#search-id", "invoice-42")
    page.click("#search button")
    expect(page.locator("#item-details")).to_contain_text("rq / billing")
    expect(page.locator("#item-details")).to_contain_text("rank3")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    if os.environ.get("DELAYQ_UPDATE_SCREENSHOT") == "1":  # the README's picture, refreshed on demand
        shutil.copy(ARTIFACTS / "dashboard.png", ROOT / "docs" / "dashboard.png")

    page.click("#cancel-item")
    expect(page.locator("#cancel-item")).to_have_text("Really cancel?")
    page.click("#cancel-item")
    expect(page.locator("#search-message")).to_have_text("Cancelled invoice-42.")
    wait_for(lambda: web_store.get("invoice-42") is None, 5, "the store to lose invoice-42")
    expect(page.locator("#count-scheduled")).to_have_text(str(UPCOMING + len(BEAT_SCHEDULE)))

    page.click("#dead button[data-action=requeue][data-id=dead-b]")
    expect(page.locator("#dead-message")).to_have_text("Requeued dead-b.")
    wait_for(lambda: web_store.get("dead-b") is not None, 5, "dead-b to be scheduled again")
    assert {d.id for d in web_store.dead_letters()} == {"dead-a", "dead-c"}
    expect(page.locator("#count-dead")).to_have_text("2")
    expect(page.locator("#count-due")).to_have_text("1")

    purge = page.locator("#dead button[data-action=purge][data-id=dead-c]")
    purge.click()
    expect(purge).to_have_text("Really purge?")
    purge.click()
    expect(page.locator("#dead-message")).to_have_text("Purged dead-c.")
    wait_for(lambda: {d.id for d in web_store.dead_letters()} == {"dead-a"}, 5, "dead-c to be purged")
    assert web_store.get("dead-c") is None
    expect(page.locator("#count-dead")).to_have_text("1")

    page.fill("#search-id", "no-such-id")
    page.click("#search button")
    expect(page.locator("#search-result")).to_contain_text("no item 'no-such-id' is scheduled")

    page.fill("#search-id", item_id("nightly-report"))
    page.click("#search button")
    details = page.locator("#item-details")
    expect(details).to_contain_text("periodic entrynightly-report")
    expect(details).to_contain_text("taskproj.report")
    expect(details).to_contain_text('args["daily"]')
    page.screenshot(path=str(ARTIFACTS / "dashboard-after.png"), full_page=True)


def test_the_page_refreshes_live(page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore) -> None:
    dashboard = dashboard_factory()
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    expect(page.locator("#count-scheduled")).to_have_text("0")
    expect(page.locator("#periodic")).to_contain_text("no periodic entries")
    web_store.schedule("arrives-later", timedelta(hours=2), Envelope("list", "k", b""))
    expect(page.locator("#count-scheduled")).to_have_text("1")
    expect(page.locator("#upcoming")).to_contain_text("arrives-later")
    for _ in range(3):
        web_store.debounce("user-7", timedelta(hours=1), Envelope("list", "k", b""))
    expect(page.locator("#upcoming")).to_contain_text("debounced: 3 calls, key user-7")


def test_the_item_view_says_why_an_item_waits(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore
) -> None:
    """An item of a group at its limit (released by a real forwarder), one not due yet and a dead
    letter: the item view answers each as ``delayq why`` does."""
    start = datetime.now(timezone.utc) - timedelta(seconds=30)
    for n in range(3):
        web_store.schedule(
            f"t7-{n}",
            start + timedelta(milliseconds=n),
            Envelope("list", "out", b""),
            slot={"key": "tenant-7", "limit": 1},
        )
    Forwarder(web_store, [CollectingTarget("list")]).run_once()
    web_store.schedule("invoice-42", timedelta(minutes=30), Envelope("rq", "billing", b""))
    bury(web_store, ["dead-a"])
    dashboard = dashboard_factory()
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    for found, words in (
        ("t7-2", "waiting for group tenant-7 (1 of 1 running: t7-0)"),
        ("invoice-42", "not due until"),
    ):
        page.fill("#search-id", found)
        page.click("#search button")
        expect(page.locator("#item-details")).to_contain_text(f"id{found}")
        expect(page.locator("#item-why")).to_have_text(web_store.why(found).line)
        expect(page.locator("#item-why")).to_contain_text(words)
    page.fill("#search-id", "dead-a")
    page.click("#search button")
    expect(page.locator("#search-result")).to_contain_text("no item 'dead-a' is scheduled")
    expect(page.locator("#item-why")).to_have_text(web_store.why("dead-a").line)
    expect(page.locator("#item-why")).to_contain_text("dead since")
    page.fill("#search-id", "no-such-id")
    page.click("#search button")
    expect(page.locator("#search-result")).to_contain_text("no item 'no-such-id' is scheduled")
    expect(page.locator("#item-why")).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "dashboard-why.png"), full_page=True)
