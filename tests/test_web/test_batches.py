"""Batches over HTTP and on the dashboard: each batch's progress and state, in progress first with
the counts over all; one batch with its failed ids, an unknown one a 404 that says so, a key that
is no key a 400; garbage in batch keys is skipped and named, never a 5xx for the list."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from delayq_backends import DelayStore
from delayq_backends.acl import acl_setuser
from delayq_backends.entries import iso
from delayq_backends.errors import BatchError
from delayq_backends.keys import ShardKeys, batch_item_id, shard_of
from delayq_backends.store import MAX_FAILED_IDS, batches
from delayq_backends.targets import RedisListTarget
from delayq_backends.web import batches as web_batches
from delayq_backends.web import create_app
from tests.harness import make_store
from tests.test_web.conftest import ARTIFACTS, AUTH, SHARDS, TOKEN
from tests.test_web.test_dashboard import TIMEOUT_MS

T0 = 1_800_000_000_000  # ms: the fake clock's start


@pytest.fixture
def ticking(web_store: DelayStore) -> DelayStore:
    """The store on a clock one second later at each read: each batch opened later than the last."""
    seconds = itertools.count()
    web_store.clock = lambda: T0 + 1000 * next(seconds)
    return web_store


def own_keys(store: DelayStore, key: str) -> ShardKeys:
    """The shard keys whose hash tag batch ``key``'s keys share."""
    return store.keys(shard_of(batch_item_id(key), store.config.shards))


def fill(store: DelayStore) -> None:
    """Four batches: one completed, one closed with a sub-job left, two open (one empty)."""
    store.open_batch("done-1")
    store.add_to_batch("done-1", ["d1", "d2"])
    store.close_batch("done-1")
    store.finish_in_batch("done-1", "d1", True)
    store.finish_in_batch("done-1", "d2", False)
    store.open_batch("closing")
    store.add_to_batch("closing", ["c1", "c2"])
    store.finish_in_batch("closing", "c1", True)
    store.close_batch("closing")
    store.open_batch("order/7")
    store.add_to_batch("order/7", ["o1", "o2", "o3"])
    store.finish_in_batch("order/7", "o2", False)
    store.open_batch("empty")


def test_batches_in_progress_first_then_the_last_completed_with_counts(client: TestClient, ticking: DelayStore) -> None:
    ticking.open_batch("first-opened")
    ticking.add_to_batch("first-opened", ["f1"])
    ticking.close_batch("first-opened")
    fill(ticking)
    ticking.finish_in_batch("first-opened", "f1", True)  # the last completed
    listed = client.get("/api/v1/batches", headers=AUTH)
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert (body["open"], body["closed"], body["completed"], body["unreadable"]) == (2, 1, 2, 0)
    assert [b["key"] for b in body["batches"]] == ["empty", "order/7", "closing", "first-opened", "done-1"]
    rows = {b["key"]: b for b in body["batches"]}
    assert {k: rows["order/7"][k] for k in ("state", "total", "done", "succeeded", "failed")} == {
        "state": "open", "total": 3, "done": 1, "succeeded": 0, "failed": 1
    }  # fmt: skip
    assert rows["closing"]["state"] == "closed" and rows["closing"]["done"] == 1
    done = ticking.batch_status("done-1")
    assert done is not None and done.completed_ms is not None and done.completed_ms > done.created_ms
    assert rows["done-1"]["state"] == "completed" and rows["done-1"]["completed_at"] == iso(done.completed_ms)
    assert rows["first-opened"]["created"] == "2027-01-15T08:00:00.000Z" and rows["empty"]["completed_at"] is None
    assert "failed_ids" not in rows["order/7"], "the list reads no failed ids: one batch's status has them"
    page = client.get("/api/v1/batches?offset=1&limit=2", headers=AUTH).json()
    assert [b["key"] for b in page["batches"]] == ["order/7", "closing"] and page["completed"] == 2


def test_one_batch_by_path_and_by_query(client: TestClient, web_store: DelayStore) -> None:
    fill(web_store)
    one = client.get("/api/v1/batches/order/7", headers=AUTH)
    assert one.status_code == 200, one.text
    assert {k: one.json()[k] for k in ("key", "total", "done", "failed", "failed_ids", "closed", "completed")} == {
        "key": "order/7", "total": 3, "done": 1, "failed": 1, "failed_ids": ["o2"], "closed": False,
        "completed": False,
    }  # fmt: skip
    done = client.get("/api/v1/batch", params={"key": "done-1"}, headers=AUTH).json()
    assert done["state"] == "completed" and done["succeeded"] == 1 and done["failed_ids"] == ["d2"]
    web_store.open_batch("..")
    assert client.get("/api/v1/batch", params={"key": ".."}, headers=AUTH).json()["total"] == 0, "any key by query"


def test_an_unknown_batch_is_a_404_and_a_key_that_is_none_a_400(client: TestClient, web_store: DelayStore) -> None:
    unknown = client.get("/api/v1/batches/nope", headers=AUTH)
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == (
        f"no batch 'nope' in prefix {web_store.config.prefix!r} (never opened, or expired after completion)"
    )
    assert client.get("/api/v1/batch", params={"key": "nope"}, headers=AUTH).status_code == 404
    for key in ("tab\there", "\u2028", "k" * 500 + "\u00e9" * 4):
        bad = client.get("/api/v1/batch", params={"key": key}, headers=AUTH)
        assert bad.status_code == 400, (key, bad.text)
        assert "is no usable key" in bad.json()["detail"]
    too_long = client.get("/api/v1/batch", params={"key": "k" * 507}, headers=AUTH)
    assert too_long.status_code == 422 and "at most 506 characters" in too_long.json()["detail"]


def plant_garbage(store: DelayStore) -> list[str]:
    """Batch keys a writer around delayq could leave; their keys."""
    raw = store.client
    raw.hset(own_keys(store, "no-fields").batch("no-fields"), "foo", "bar")
    store.open_batch("bad-members")
    raw.delete(own_keys(store, "bad-members").batch_members("bad-members"))
    raw.set(own_keys(store, "bad-members").batch_members("bad-members"), "not a set")
    raw.set(own_keys(store, "a-string").batch("a-string"), "not a hash")
    raw.hset(own_keys(store, "bad\nkey").batch("bad\nkey"), "closed", "0")  # no batch has such a key
    store.open_batch("bad-flag")
    raw.hset(own_keys(store, "bad-flag").batch("bad-flag"), "closed", "maybe")
    return ["a-string", "bad\nkey", "bad-flag", "bad-members", "no-fields"]


def test_garbage_in_batch_keys_is_skipped_and_named(
    client: TestClient, web_store: DelayStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    web_store.open_batch("good")
    web_store.add_to_batch("good", ["g1"])
    junk = plant_garbage(web_store)
    listed = client.get("/api/v1/batches", headers=AUTH)
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [b["key"] for b in body["batches"]] == ["good"] and body["batches"][0]["total"] == 1
    assert body["unreadable"] == len(junk) and len(body["problems"]) == len(junk)
    for key, problem in zip(junk, body["problems"]):
        assert problem.startswith((f"batch {key!r}: ", f"batch key {key!r} ")), problem
    assert "did not write" in body["problems"][0] and "is no usable key" in body["problems"][1]
    monkeypatch.setattr(web_batches, "MAX_PROBLEMS", 2)
    capped = client.get("/api/v1/batches", headers=AUTH).json()
    assert capped["problems"][2:] == [f"and {len(junk) - 2} more unreadable batches"]
    assert capped["unreadable"] == len(junk), "each unreadable batch is counted, named or not"
    for key in ("no-fields", "bad-members", "a-string", "bad-flag"):
        one = client.get("/api/v1/batch", params={"key": key}, headers=AUTH)
        assert one.status_code == 503, one.text
        assert "hold data delayq did not write" in one.json()["detail"] and "delete them" in one.json()["detail"]


def test_the_bulk_read_agrees_with_batch_status(web_store: DelayStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API reads each batch as :meth:`batch_status` does (the list without failed ids), over
    several rounds; garbage is the same BatchError."""
    monkeypatch.setattr(batches, "STATUS_CHUNK", 2)
    fill(web_store)
    plant_garbage(web_store)
    keys = ["done-1", "closing", "order/7", "empty", "gone", "no-fields", "bad-members", "a-string", "bad-flag"]
    listed = web_store.batch_statuses(keys)
    each = web_store.batch_statuses(keys, failed_ids=MAX_FAILED_IDS)
    for key, status, full in zip(keys, listed, each):
        try:
            one = web_store.batch_status(key)
        except BatchError as exc:
            assert isinstance(status, BatchError) and str(status) == str(full) == str(exc), key
            continue
        assert full == one, key
        assert status == (None if one is None else replace(one, failed_ids=())), key
    assert each[2] is not None and each[2].failed_ids == ("o2",), "the failed ids are read when asked for"


# -- the dashboard, in a real Chromium, over a real ``delayq dashboard`` -----------------------


def test_the_dashboard_shows_a_batch_progress_to_completion(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore, prefix: str
) -> None:
    """A batch of four sub-jobs scheduled an hour ahead: the panel shows each report of a finish
    as it lands, the close, and the completion; a garbage batch is named, the rest still shown."""
    out = f"{prefix}:out"
    web_store.open_batch("order-7", on_complete=RedisListTarget.envelope(out, b"done"))
    for n in range(4):
        web_store.schedule(f"order-7-{n}", timedelta(hours=1), RedisListTarget.envelope(out, b"x"), batch="order-7")
    web_store.open_batch("old")
    web_store.close_batch("old")  # empty: completed at close
    web_store.client.set(own_keys(web_store, "junk").batch("junk"), "not a hash")
    dashboard = dashboard_factory()
    expect.set_options(timeout=TIMEOUT_MS)

    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    rows = page.locator("#batches tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#batches-summary")).to_have_text("(1 open · 0 closed · 1 completed)")
    expect(page.locator("#error-batches")).to_contain_text("Incomplete: batch 'junk': its keys")
    expect(page.locator("#error-batches")).to_contain_text("hold data delayq did not write")
    cells = [rows.nth(0).locator("td").nth(i) for i in range(5)]  # in progress first
    key, progress, succeeded, failed, state = cells
    expect(key).to_have_text("order-7")
    expect(progress).to_have_text("0 / 4")
    expect(progress.locator("progress")).to_have_attribute("max", "4")
    expect(state).to_have_text("open")
    expect(rows.nth(1)).to_contain_text("old")
    expect(rows.nth(1)).to_contain_text("completed")

    web_store.finish_in_batch("order-7", "order-7-0", True)
    web_store.finish_in_batch("order-7", "order-7-1", False)
    expect(progress).to_have_text("2 / 4")
    expect(progress.locator("progress")).to_have_attribute("value", "2")
    expect(succeeded).to_have_text("1")
    expect(failed).to_have_text("1")

    web_store.close_batch("order-7")
    expect(state).to_have_text("closed")
    expect(page.locator("#batches-summary")).to_have_text("(0 open · 1 closed · 1 completed)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#batches").locator("xpath=..").screenshot(path=str(ARTIFACTS / "dashboard-batches.png"))

    web_store.finish_in_batch("order-7", "order-7-2", True)
    assert web_store.finish_in_batch("order-7", "order-7-3", True), "the last report completes it"
    expect(page.locator("#batches-summary")).to_have_text("(0 open · 0 closed · 2 completed)")
    expect(state).to_have_text("completed")
    expect(progress).to_have_text("4 / 4")
    expect(succeeded).to_have_text("3")
    expect(rows.nth(0).locator("td").nth(6)).not_to_have_text("–")  # its completion time
    assert web_store.get(batch_item_id("order-7")) is not None, "on_complete is in the store, ready now"


def test_a_redis_user_without_scan_or_hgetall_is_a_503_for_batches_only(web_store: DelayStore, valkey_url: str) -> None:
    """The ``forwarder`` role (the dashboard's, see docs/security.md) may not SCAN for batch keys:
    the batch list says Redis refused (a refusal is never read as garbage), and the other routes
    answer; it reads one batch (it reports a purged sub-job to its batch, so it has the batch
    commands)."""
    prefix = web_store.config.prefix
    web_store.open_batch("b")
    name, password = f"fwd-{prefix[-8:]}", "pw-0123456789"
    web_store.client.execute_command(*acl_setuser(name, prefix, "forwarder", password=password))
    try:
        port = web_store.client.connection_pool.connection_kwargs["port"]
        user = make_store(f"redis://{name}:{password}@127.0.0.1:{port}/0", prefix, shards=SHARDS)
        with TestClient(create_app(user, token=TOKEN)) as client:
            assert client.get("/api/v1/stats", headers=AUTH).status_code == 200
            response = client.get("/api/v1/batches", headers=AUTH)
            assert response.status_code == 503, response.text
            assert "refused the command" in response.json()["detail"], response.text
            for path in ("/api/v1/batch?key=b", "/api/v1/batches/b"):
                assert client.get(path, headers=AUTH).json()["key"] == "b"
    finally:
        web_store.client.execute_command("ACL", "DELUSER", name)
