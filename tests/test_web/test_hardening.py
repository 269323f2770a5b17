"""The API as a door (issue 11, item 7): the RQ endpoint is not code execution, cross-site writes
are refused on every server, the token and a body cap come before any parsing, connections and
listings are bounded, corrupt data fails one route with its reason, and every id is reachable."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.embedded import free_port
from delayq_backends.envelope import Envelope
from delayq_backends.keys import batch_item_id
from delayq_backends.web import create_app
from delayq_backends.web.guard import Limits
from delayq_backends.web.producers import FunctionAllowlist
from tests.harness import Launcher
from tests.helpers import wait_for
from tests.test_web.conftest import AUTH, RQ_JOBS, TOKEN
from tests.test_web.test_api import ITEM, LOCAL, bury

JSON = {"Content-Type": "application/json"}
CALL = {"args": [], "countdown": 60}


# -- 1. the RQ endpoint runs only allowed functions ----------------------------------------------


@pytest.mark.parametrize("func", ["os.system", "builtins.eval", "subprocess.run", "tests.test_rq.jobs.os.system"])
def test_dangerous_functions_are_refused(client: TestClient, web_store: DelayStore, func: str) -> None:
    response = client.post("/api/v1/rq", headers=AUTH, json={"func": func, "id": "evil", **CALL})
    assert response.status_code == 403, response.text
    assert func in response.json()["detail"] and "--rq-allow" in response.json()["detail"]
    assert not web_store.exists("evil") and not web_store.client.exists("rq:job:evil")


def test_without_an_allowlist_rq_scheduling_is_off(web_store: DelayStore) -> None:
    app = create_app(web_store, token=TOKEN, rq_connection=web_store.client)
    with TestClient(app) as client:
        response = client.post("/api/v1/rq", headers=AUTH, json={"func": f"{RQ_JOBS}.record", **CALL})
    assert response.status_code == 403 and "is off" in response.json()["detail"]
    assert "--rq-allow" in response.json()["detail"]


@pytest.mark.parametrize(
    "entries, func, allowed",
    [
        (["app.tasks"], "app.tasks.send", True),
        (["app.tasks."], "app.tasks.send", True),
        (["app.tasks"], "app.tasksevil.send", False),
        (["app.tasks"], "app.tasks.os.system", False),  # RQ would walk attributes to os.system
        (["app.tasks"], "app.tasks._private", False),
        (["app.tasks"], "app.send", False),
        (["app.tasks.send"], "app.tasks.send", True),
        (["app.tasks.send"], "app.tasks.other", False),
        ([], "app.tasks.send", False),
    ],
)
def test_allowlist_matches_whole_components(entries: list[str], func: str, allowed: bool) -> None:
    assert FunctionAllowlist.parse(entries).allows(func) is allowed


@pytest.mark.parametrize("entry", ["", ".", "app..tasks", "os system", "*"])
def test_a_bad_allow_entry_stops_the_command(entry: str) -> None:
    result = CliRunner().invoke(main, ["dashboard", "--url", "redis://127.0.0.1:1/0", "--no-auth", "--rq-allow", entry])
    assert result.exit_code == 2 and "--rq-allow" in result.output, result.output


# -- 2. cross-site writes ------------------------------------------------------------------------


@pytest.fixture
def open_client(web_store: DelayStore) -> Iterator[TestClient]:
    """A server without a token (as `--no-auth`), RQ allowed: only the cross-site checks protect it."""
    app = create_app(web_store, token=None, rq_connection=web_store.client, rq_allow=[RQ_JOBS])
    with TestClient(app, base_url=LOCAL) as client:
        yield client


WRITES = [
    ("POST", "/api/v1/celery", {"task": "t", "id": "x1", **CALL}),
    ("POST", "/api/v1/rq", {"func": f"{RQ_JOBS}.record", "id": "x1", **CALL}),
    ("POST", "/api/v1/dead/purge", {"all": True}),
    ("DELETE", "/api/v1/item?id=keep", None),
    ("PUT", "/api/v1/slots/guarded/limit", {"limit": 3}),
    ("PUT", "/api/v1/slot/limit?key=guarded", {"limit": 3}),
]


def _unchanged(store: DelayStore) -> bool:
    return (
        not store.exists("x1")
        and store.exists("keep")
        and len(store.dead_letters()) == 1
        and store.slot_status("guarded").limit is None
    )


@pytest.mark.parametrize(
    "headers, code, words",
    [
        ({**JSON, "Origin": "http://evil.example"}, 403, "Origin"),
        ({**JSON, "Origin": "null"}, 403, "Origin"),
        ({**JSON, "Origin": "http://127.0.0.1:1"}, 403, "Origin"),  # another port is another origin
        ({**JSON, "Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site"),
        ({**JSON, "Sec-Fetch-Site": "same-site"}, 403, "Sec-Fetch-Site"),  # a page on another local port
        ({"Content-Type": "text/plain;charset=UTF-8"}, 415, "application/json"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "application/json"),
        ({}, 415, "no content type"),
    ],
)
def test_cross_site_and_non_json_writes_are_refused(
    open_client: TestClient, web_store: DelayStore, headers: dict[str, str], code: int, words: str
) -> None:
    web_store.schedule("keep", timedelta(hours=1), ITEM)
    bury(web_store, ["dead"])
    for method, path, body in WRITES:
        if code == 415 and body is None:
            continue  # a DELETE without a body needs no content type: no page can send one cross-site
        raw = b"" if body is None else httpx.Request("POST", "/", json=body).content
        response = open_client.request(method, path, headers=headers, content=raw)
        assert response.status_code == code, (method, path, response.text)
        assert words in response.json()["detail"]
    assert _unchanged(web_store)
    with_text = open_client.request(
        "DELETE", "/api/v1/item?id=keep", headers={"Content-Type": "text/plain"}, content=b"x"
    )
    assert with_text.status_code == 415 and web_store.exists("keep"), "a DELETE with a body: JSON or nothing"


def test_same_origin_and_non_browser_writes_go_through(open_client: TestClient, web_store: DelayStore) -> None:
    own = {**JSON, "Origin": "http://127.0.0.1:8765", "Host": "127.0.0.1:8765", "Sec-Fetch-Site": "same-origin"}
    assert open_client.post("/api/v1/celery", headers=own, json={"task": "t", "id": "a", **CALL}).status_code == 201
    assert open_client.post("/api/v1/celery", json={"task": "t", "id": "b", **CALL}).status_code == 201
    assert open_client.delete("/api/v1/item?id=b").status_code == 200, "curl -X DELETE needs no content type"
    assert web_store.exists("a") and not web_store.exists("b")


ATTACK = """async (target) => {
  const calls = [
    ["/api/v1/celery", {task: "t", id: "x1", args: [], countdown: 60}],
    ["/api/v1/rq", {func: "tests.test_rq.jobs.record", id: "x1", args: [], countdown: 60}],
    ["/api/v1/dead/purge", {all: true}],
  ];
  const sent = [];
  for (const [path, body] of calls) {
    const text = JSON.stringify(body);
    for (const payload of [text, new Blob([text]), new URLSearchParams({x: text})]) {
      sent.push(fetch(target + path, {method: "POST", mode: "no-cors", body: payload}));
    }
  }
  const results = await Promise.allSettled(sent);
  return results.map((r) => r.status);
}"""


@pytest.mark.parametrize("auth", [False, True])
def test_a_foreign_page_in_a_real_browser_changes_nothing(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore, tmp_path: Path, auth: bool
) -> None:
    """A page on another loopback port POSTs (no-cors: text/plain, a Blob without a type, a form)
    to the dashboard's API; nothing is scheduled and no dead letter is purged."""
    web_store.schedule("keep", timedelta(hours=1), ITEM)
    bury(web_store, ["dead"])
    dashboard = dashboard_factory(*(["--rq-allow", RQ_JOBS] + ([] if auth else ["--no-auth"])))
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text("<!doctype html><title>elsewhere</title>")
    with _static_site(tmp_path / "www") as site:
        page.goto(site)
        statuses = page.evaluate(ATTACK, dashboard.base)
    # each fetch settles on the server's answer, sent once its request was handled: nothing is in flight
    assert len(statuses) == 9 and set(statuses) == {"fulfilled"}, "every request reached the server"
    assert _unchanged(web_store)


class _static_site:
    """``python -m http.server`` on a free loopback port: the attacker's origin."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.launcher = Launcher()
        self.launcher.python("-m", "http.server", str(self.port), "--bind", "127.0.0.1", "--directory", str(root))
        wait_for(self._up, 15, "the attacker's site to answer", interval=0.05)

    def _up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def __enter__(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def __exit__(self, *exc: object) -> None:
        self.launcher.stop_all()


# -- 3. the token and the body cap come before any parsing ---------------------------------------


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _raw_post(port: int, headers: str, body_bytes: int) -> bytes:
    """POST ``body_bytes`` of JSON-ish bytes over a raw socket; the status line the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST /api/v1/celery HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {body_bytes}\r\n{headers}\r\n".encode()
        )
        chunk = b"[" + b"1," * (1 << 19)  # 1 MiB
        sent = 0
        try:
            while sent < body_bytes:
                piece = chunk[: body_bytes - sent]
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before the rest was sent: the point
        answer = b""
        try:
            while b"\r\n" not in answer:
                more = sock.recv(4096)
                if not more:
                    break
                answer += more
        except ConnectionResetError:
            pass
        return answer.split(b"\r\n", 1)[0]


def test_an_unauthenticated_big_body_costs_nothing(dashboard_factory: Callable[..., Any]) -> None:
    dashboard = dashboard_factory()
    assert httpx.get(f"{dashboard.base}/api/v1/stats", headers=AUTH).status_code == 200  # warm
    before = _rss_kb(dashboard.proc.pid)
    status = _raw_post(dashboard.port, "", 26 * 1024 * 1024)
    grown_kb = _rss_kb(dashboard.proc.pid) - before
    assert status.startswith(b"HTTP/1.1 401"), status
    assert grown_kb < 4096, f"RSS grew {grown_kb} KiB on a refused 26 MB body"
    big = _raw_post(dashboard.port, f"Authorization: Bearer {TOKEN}\r\n", 2 * 1024 * 1024)
    assert big.startswith(b"HTTP/1.1 413"), big
    assert httpx.get(f"{dashboard.base}/api/v1/stats", headers=AUTH).status_code == 200


def test_a_streamed_body_over_the_cap_is_a_413(web_store: DelayStore) -> None:
    app: FastAPI = create_app(web_store, token=TOKEN, limits=Limits(max_body_bytes=4096))

    def chunks() -> Iterator[bytes]:
        yield b'{"task": "t", "countdown": 1, "args": ["'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"]}'

    with TestClient(app) as client:
        streamed = client.post("/api/v1/celery", headers={**AUTH, **JSON}, content=chunks())
        declared = client.post("/api/v1/celery", headers={**AUTH, **JSON}, content=b" " * 5000)
        fits = client.post("/api/v1/celery", headers=AUTH, json={"task": "t", "countdown": 1})
    assert streamed.status_code == 413 and "--max-body-bytes" in streamed.json()["detail"]
    assert declared.status_code == 413
    assert fits.status_code == 201


# -- 4. connections and listings are bounded -----------------------------------------------------


def test_half_open_connections_are_dropped_and_the_api_still_answers(dashboard_factory: Callable[..., Any]) -> None:
    dashboard = dashboard_factory("--request-timeout", "2")
    socks = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=5)
        s.sendall(b"GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
        socks.append(s)
    started = time.monotonic()
    try:
        for s in socks:
            s.settimeout(max(0.1, started + 15 - time.monotonic()))
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1) == b"", "closed without an answer"
        took = time.monotonic() - started
    finally:
        for s in socks:
            s.close()
    assert took < 15, f"300 half-open connections took {took:.1f} s to be dropped"
    assert httpx.get(f"{dashboard.base}/api/v1/stats", headers=AUTH).status_code == 200


def test_refreshed_half_open_connections_do_not_starve_authenticated_calls(
    dashboard_factory: Callable[..., Any],
) -> None:
    """100 unauthenticated connections that never finish their head, one reopened for each the
    server drops, beside 112 authenticated calls (a new connection each): none is refused."""
    dashboard = dashboard_factory("--request-timeout", "60")  # no help from the head timeout

    def half_open() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=5)
        s.sendall(b"GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        return s

    socks = [half_open() for _ in range(100)]
    refused = []
    try:
        for _ in range(112):
            response = httpx.get(f"{dashboard.base}/api/v1/stats", headers=AUTH, timeout=10)
            if response.status_code != 200:
                refused.append(response.status_code)
            socks.append(half_open())  # the attacker keeps its 100 coming
    finally:
        for s in socks:
            s.close()
    assert refused == [], f"{len(refused)} of 112 authenticated calls refused: {refused[:5]}"


def test_a_deep_offset_is_refused_with_the_way_out(client: TestClient, web_store: DelayStore) -> None:
    web_store.schedule_many([(f"i{n}", 2_000_000_000.0 + n, ITEM) for n in range(20)])
    for route in ("items", "dead"):
        deep = client.get(f"/api/v1/{route}?offset=100000", headers=AUTH)
        assert deep.status_code == 422 and "shard" in deep.json()["detail"], deep.text
        assert client.get(f"/api/v1/{route}?offset=9000&limit=1000", headers=AUTH).status_code == 200
    one = client.get("/api/v1/items?shard=1&limit=1000", headers=AUTH).json()["items"]
    assert one and {i["shard"] for i in one} == {1}


# -- 5. corrupt data fails one route with its reason ---------------------------------------------


def plant_garbage(store: DelayStore) -> None:
    """What a writer around delayq can leave (the producer ACL role may write these keys)."""
    store.schedule_many([(f"good-{n}", timedelta(hours=1 + n), ITEM) for n in range(4)])
    bury(store, ["dead-ok"])
    raw = store.client
    keys = store._keys
    own = keys[store.shard_of("leased-garbage")]
    raw.zadd(own.due, {"leased-garbage": 1})
    raw.hset(own.items, "leased-garbage", Envelope("list", "k", b"").encode())
    raw.hset(own.leased, "leased-garbage", "not:a:lease")
    raw.delete(keys[1].dead)
    raw.set(keys[1].dead, "a string where a sorted set belongs")
    raw.zadd(keys[2].due, {b"\xff\xfe-not-utf8": 5})
    raw.zadd(keys[3].dead, {"bad-info": 7})
    raw.hset(keys[3].dead_info, "bad-info", b"\x00{not json")
    store.open_batch("good-batch")
    raw.set(keys[store.shard_of(batch_item_id("junk-batch"))].batch("junk-batch"), "a string where a hash belongs")


GETS = [
    "/api/v1/stats",
    "/api/v1/items",
    "/api/v1/items?shard=3",
    "/api/v1/dead",
    "/api/v1/dead?shard=3",
    "/api/v1/due",
    "/api/v1/lateness",
    "/api/v1/item?id=leased-garbage",
    "/api/v1/item?id=good-0",
    "/api/v1/items/leased-garbage",
    "/api/v1/batches",
    "/api/v1/batch?key=junk-batch",
    "/api/v1/batches/junk-batch",
    "/api/v1/batches/good-batch",
]


def test_every_read_route_survives_planted_garbage(client: TestClient, web_store: DelayStore) -> None:
    plant_garbage(web_store)
    for path in GETS:
        response = client.get(path, headers=AUTH)  # a 500 would raise here (TestClient re-raises)
        assert response.status_code in (200, 400, 404, 503), (path, response.text)
        if response.status_code != 200:
            assert "cannot be read" in response.json()["detail"] or "wrong type" in response.json()["detail"]


def test_the_page_shows_each_failure_in_place(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore
) -> None:
    from playwright.sync_api import expect

    plant_garbage(web_store)
    dashboard = dashboard_factory("--no-auth")
    expect.set_options(timeout=15_000)
    page.goto(dashboard.base + "/")
    expect(page.locator("#chart svg")).to_be_visible()
    expect(page.locator("#lateness")).to_contain_text("--audit-stream")
    expect(page.locator("#error-totals")).to_contain_text("cannot be read")
    expect(page.locator("#error-shards")).to_contain_text("cannot be read")
    expect(page.locator("#error-dead")).to_be_visible()
    expect(page.locator("#status")).to_contain_text("partly live")
    expect(page.locator("#error-chart")).to_be_hidden()
    expect(page.locator("#error-lateness")).to_be_hidden()
    expect(page.locator("#error-batches")).to_contain_text("batch 'junk-batch': its keys hold data")
    expect(page.locator("#batches")).to_contain_text("good-batch")


# -- 6. every id is reachable --------------------------------------------------------------------


@pytest.mark.parametrize("item_id", [".", "..", "a/b", "/", "../x", "?&#"])
def test_any_id_is_reachable_by_query(client: TestClient, web_store: DelayStore, item_id: str) -> None:
    web_store.schedule(item_id, timedelta(hours=1), ITEM)
    q = {"id": item_id}
    assert client.get("/api/v1/item", params=q, headers=AUTH).json()["id"] == item_id
    moved = client.post("/api/v1/item/reschedule", params=q, headers=AUTH, json={"countdown": 7200})
    assert moved.status_code == 200 and moved.json()["id"] == item_id
    assert client.delete("/api/v1/item", params=q, headers={**AUTH, **JSON}).json() == {
        "id": item_id,
        "cancelled": True,
    }
    assert web_store.get(item_id) is None


def test_the_page_finds_and_cancels_dot_dot(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore
) -> None:
    from playwright.sync_api import expect

    web_store.schedule("..", timedelta(hours=1), ITEM)
    dashboard = dashboard_factory("--no-auth")
    expect.set_options(timeout=15_000)
    page.goto(dashboard.base + "/")
    page.fill("#search-id", "..")
    page.click("#search button")
    expect(page.locator("#item-details")).to_contain_text("list / somewhere")
    page.click("#cancel-item")
    page.click("#cancel-item")
    expect(page.locator("#search-message")).to_have_text("Cancelled ...")
    wait_for(lambda: web_store.get("..") is None, 5, "the store to lose '..'")


def test_an_item_in_flight_is_reported_not_cancelled_or_moved(client: TestClient, web_store: DelayStore) -> None:
    """A forwarder holds it (claimed, maybe published): the API says so instead of a plain success."""
    web_store.schedule("flying", 1.0, ITEM)
    web_store.schedule("taken", 1.0, ITEM)
    for shard in {web_store.shard_of("flying"), web_store.shard_of("taken")}:
        web_store.claim(shard)
    moved = client.post("/api/v1/item/reschedule?id=taken", headers=AUTH, json={"countdown": 3600})
    assert moved.status_code == 409 and "in flight" in moved.json()["detail"], moved.text
    gone = client.delete("/api/v1/item?id=flying", headers=AUTH)
    assert gone.status_code == 409 and "may still run once" in gone.json()["detail"], gone.text
