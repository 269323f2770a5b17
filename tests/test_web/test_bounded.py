"""What one request costs is bounded whatever the store holds, and the read-only role reads it all.

- ``GET /api/v1/periodic`` pages (a registry cursor and a limit): with 20,000 entries a page is
  small and quick, and following ``next_cursor`` reaches every entry once; junk registry fields
  (not UTF-8, or no item id) are listed with their fix on their page, never a 503.
- Every dashboard panel and every API read answers with a ``reader`` ACL user's credential
  (``delayq acl reader``), and ``delayq periodic list`` runs on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from bench.lib.proxy import TcpProxy
from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.keys import periodic_key
from delayq_backends.periodic import ops
from delayq_backends.store import SlotAsk
from delayq_backends.web import create_app
from tests.harness import Launcher, make_store
from tests.helpers import wait_for
from tests.test_security import Admin, user_url
from tests.test_web.conftest import AUTH, SHARDS, TOKEN, Dashboard
from tests.test_web.test_dashboard import TIMEOUT_MS

ENTRIES = 20_000
#: a page of the default limit, at most (HSCAN's COUNT is a hint): 9 MB was the whole list
PAGE_BYTES = 256 * 1024
#: seconds a page may take on two shared cores (the whole list took 11 s)
PAGE_SECONDS = 2.0


def plant_entries(client: TestClient, store: DelayStore, count: int) -> list[str]:
    """``count`` entries as the API adds them: one through POST, the others its item copied
    under their names (as ``ops.upsert`` stores them, in bulk); returns their names."""
    body = {"name": "e00000", "task": "t.tick", "every": 3600}
    assert client.post("/api/v1/periodic", headers=AUTH, json=body).status_code == 201
    item = store.get(ops.item_id("e00000"))
    assert item is not None
    names = [f"e{n:05d}" for n in range(count)]
    for start in range(1, count, 5000):
        chunk = names[start : start + 5000]
        store.client.hset(periodic_key(store.config.prefix), mapping={n: ops.item_id(n) for n in chunk})
        store.schedule_many([(ops.item_id(n), item.ready_ms / 1000, item.envelope) for n in chunk])
    return names


def test_the_periodic_list_pages_and_every_entry_is_on_a_page(client: TestClient, web_store: DelayStore) -> None:
    names = plant_entries(client, web_store, ENTRIES)
    registry = periodic_key(web_store.config.prefix)
    web_store.client.hset(registry, mapping={b"\xff\xfe": b"x", "bad\nname": "x"})  # junk a producer wrote

    started = time.monotonic()
    first = client.get("/api/v1/periodic", headers=AUTH)
    took = time.monotonic() - started
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(first.content) <= PAGE_BYTES and took <= PAGE_SECONDS, (len(first.content), took)
    assert 0 < len(page["entries"]) <= 200 and page["next_cursor"] and page["hint"] is None
    shown = [e["name"] for e in page["entries"] if e["item_id"]]
    assert shown == sorted(shown)

    seen: list[str] = []
    unreadable: list[str] = []
    cursor, pages = "0", 0
    while cursor is not None:
        response = client.get(f"/api/v1/periodic?cursor={cursor}&limit=1000", headers=AUTH)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["entries"]) <= 2000
        seen += [e["name"] for e in body["entries"] if e["item_id"]]
        unreadable += [e["state"] for e in body["entries"] if not e["item_id"]]
        cursor, pages = body["next_cursor"], pages + 1
    assert pages >= ENTRIES // 2000 and sorted(set(seen)) == names
    assert len(unreadable) == 2 and all(u.startswith("unreadable: ") and "HDEL" in u for u in unreadable)


@pytest.mark.parametrize("query", ["cursor=18446744073709551616", "cursor=-1", "cursor=1e3", "limit=0", "limit=1001"])
def test_a_bad_page_is_a_4xx_that_says_what_to_pass(client: TestClient, query: str) -> None:
    response = client.get(f"/api/v1/periodic?{query}", headers=AUTH)
    assert response.status_code in (400, 422) and response.json()["detail"]


def test_an_empty_registry_gives_the_hint_on_its_first_page_only(client: TestClient) -> None:
    assert client.get("/api/v1/periodic", headers=AUTH).json() == {
        "entries": [],
        "next_cursor": None,
        "hint": ops_hint(client),
    }
    assert client.get("/api/v1/periodic?cursor=7", headers=AUTH).json()["hint"] is None


def ops_hint(client: TestClient) -> str:
    hint: str = client.get("/api/v1/periodic", headers=AUTH).json()["hint"]
    assert hint.startswith("no periodic entries")
    return hint


# -- the reader role ----------------------------------------------------------------------------


@pytest.fixture
def admin(valkey_server: EmbeddedServer) -> Iterator[Admin]:
    found = Admin(redis.Redis.from_url(valkey_server.url), valkey_server.url, valkey_server.port)
    yield found
    found.clean_up()


#: every GET of the API, with what :func:`fill` stored in its parameters
READS = {
    "/api/v1/items": "/api/v1/items?limit=10",
    "/api/v1/item": "/api/v1/item?id=i-1",
    "/api/v1/item/why": "/api/v1/item/why?id=dead-1",
    "/api/v1/items/{item_id}": "/api/v1/items/i-1",
    "/api/v1/stats": "/api/v1/stats",
    "/api/v1/due": "/api/v1/due?minutes=1440&bucket_minutes=5",
    "/api/v1/dead": "/api/v1/dead?limit=50",
    "/api/v1/lateness": "/api/v1/lateness?limit=200",
    "/api/v1/slots": "/api/v1/slots?limit=50",
    "/api/v1/slot": "/api/v1/slot?key=cust-1",
    "/api/v1/slots/{key}": "/api/v1/slots/cust-1",
    "/api/v1/groups": "/api/v1/groups?limit=50",
    "/api/v1/group": "/api/v1/group?key=cust-1",
    "/api/v1/groups/{key}": "/api/v1/groups/cust-1",
    "/api/v1/batches": "/api/v1/batches?limit=50",
    "/api/v1/batch": "/api/v1/batch?key=b-1",
    "/api/v1/batches/{key}": "/api/v1/batches/b-1",
    "/api/v1/periodic": "/api/v1/periodic",
    "/api/v1/periodic/{name}": "/api/v1/periodic/tick",
    "/api/v1/periodic/{name}/history": "/api/v1/periodic/tick/history",
}


def fill(store: DelayStore, client: TestClient) -> None:
    """One of each thing a panel shows: an item, a dead letter, a periodic entry, a slot key
    with a limit (a group, paused, with a rate and a weight), an open batch."""
    from tests.test_web.test_api import bury

    assert client.post("/api/v1/celery", headers=AUTH, json={"task": "t.a", "countdown": 600, "id": "i-1"}).is_success
    bury(store, ["dead-1"])
    assert client.post("/api/v1/periodic", headers=AUTH, json={"name": "tick", "task": "t", "every": 60}).is_success
    store.take_slots({"cust-1": SlotAsk(2, [("s-0", 0)])}, hold_ms=600_000, wait_ms=600_000)
    store.set_slot_limit("cust-1", 2)
    store.set_group("cust-1", rate="5/s", weight=2)
    store.pause_group("cust-1")
    store.open_batch("b-1")
    store.add_to_batch("b-1", ["b-1-0", "b-1-1"])


def test_every_read_answers_with_the_reader_role(admin: Admin, web_store: DelayStore, client: TestClient) -> None:
    fill(web_store, client)
    gets = {p for p, m in client.get("/api/v1/openapi.json").json()["paths"].items() if "get" in m}
    assert gets == set(READS)  # a new read route is tried here too
    prefix = web_store.config.prefix
    url = user_url(admin, prefix, "reader")
    reader = make_store(url, prefix, shards=SHARDS)
    with TestClient(create_app(reader, token=TOKEN)) as as_reader:
        for path, target in READS.items():
            response = as_reader.get(target, headers=AUTH)
            assert response.status_code == 200, (path, response.status_code, response.text[:300])
            if path in (
                "/api/v1/periodic",
                "/api/v1/slots",
                "/api/v1/groups",
                "/api/v1/batches",
                "/api/v1/dead",
                "/api/v1/item/why",
            ):
                assert response.json() == client.get(target, headers=AUTH).json(), path
    where = ["--url", url, "--prefix", prefix, "--shards", str(SHARDS)]
    listed = CliRunner().invoke(main, ["periodic", "list", *where])
    assert listed.exit_code == 0 and "tick" in listed.output, listed.output
    shown = json.loads(CliRunner().invoke(main, ["periodic", "list", "--json", *where]).output)
    assert [e["name"] for e in shown] == ["tick"]


# -- the dashboard, in headless Chromium ---------------------------------------------------------

#: counts the page's requests of one API path in flight at once, as the server would see them
COUNT_OVERLAP = """
window.__inflight = { now: 0, max: 0, done: 0 };
const plainFetch = window.fetch;
window.fetch = async (...args) => {
  if (!String(args[0]).includes("api/v1/stats")) return plainFetch(...args);
  const n = window.__inflight;
  n.now += 1;
  n.max = Math.max(n.max, n.now);
  try { return await plainFetch(...args); } finally { n.now -= 1; n.done += 1; }
};
"""


def test_dashboard_refreshes_never_overlap_under_a_slow_server(
    page: Any, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    """Each refresh reads /stats once: with every reply of the store 1 s late (a proxy), a
    refresh takes longer than the 2 s period, and still no two refreshes run at once. A server
    of its own: the slot and batch panels SCAN the whole database, one reply (1 s) per 1,000
    keys, so the shared server's keys from other tests would set the pace, not the refreshes."""
    with EmbeddedServer() as server:
        make_store(server.url, prefix, shards=SHARDS).check_meta()
        _refreshes_never_overlap(page, server, prefix, procs, tmp_path)


def _refreshes_never_overlap(page: Any, server: EmbeddedServer, prefix: str, procs: Launcher, tmp_path: Path) -> None:
    proxy = TcpProxy("127.0.0.1", server.port)
    try:
        dashboard = Dashboard(procs, f"redis://127.0.0.1:{proxy.port}/0", prefix, tmp_path, "--no-auth")
        proxy.delay = 1.0
        page.add_init_script(COUNT_OVERLAP)
        page.goto(dashboard.base + "/")
        started = time.monotonic()
        wait_for(lambda: page.evaluate("window.__inflight.done") >= 3, 60, "three refreshes", interval=0.2)
        took = time.monotonic() - started
        counts = page.evaluate("window.__inflight")
        assert took > 3 * 2.0 and counts["max"] == 1, (took, counts)
        expect(page.locator("#status")).to_contain_text("updated")
    finally:
        proxy.close()


def test_the_dashboard_pages_through_the_periodic_entries(
    page: Any, dashboard_factory: Callable[..., Any], client: TestClient, web_store: DelayStore
) -> None:
    names = plant_entries(client, web_store, 1200)  # past a small hash (listpack), which HSCAN returns whole
    dashboard = dashboard_factory("--no-auth")
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    rows = page.locator("#periodic tbody tr")
    expect(rows.first).to_contain_text("e")
    expect(page.locator("#periodic-page")).to_have_text("page 1")
    expect(page.locator("#periodic-first")).to_be_hidden()
    seen: list[str] = []
    for number in range(1, 20):
        expect(page.locator("#periodic-page")).to_contain_text(f"page {number}")
        shown = [row.split("\t")[0] for row in rows.all_inner_texts()]
        assert 0 < len(shown) <= 200 and shown == sorted(shown), shown
        seen += shown
        if "the last" in page.locator("#periodic-page").inner_text():
            break
        page.click("#periodic-next")
        expect(page.locator("#periodic-first")).to_be_visible()
    assert number >= 2 and sorted(seen) == names
    expect(page.locator("#periodic-next")).to_be_hidden()
    page.click("#periodic-first")
    expect(page.locator("#periodic-page")).to_have_text("page 1")
