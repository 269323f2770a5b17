"""Groups over HTTP and on the dashboard: every group's policy, items running and parked, busiest
first a page at a time with the totals over all; a policy set, a pause and a resume land in the
store (and a real forwarder obeys them); a bad policy is a 4xx that says what to send and
changes nothing; garbage in a group's keys never makes a 5xx."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from delayq_backends import DelayStore
from delayq_backends.acl import acl_setuser
from delayq_backends.keys import group_policy_key, slot_holds_key
from delayq_backends.store import SlotAsk
from delayq_backends.targets import RedisListTarget
from delayq_backends.web import create_app
from tests.harness import Launcher, make_store
from tests.helpers import wait_for
from tests.test_web.conftest import ARTIFACTS, AUTH, SHARDS, TOKEN
from tests.test_web.test_dashboard import TIMEOUT_MS

HOLD = 600_000  # ms: no hold lapses while a test runs


def run(store: DelayStore, key: str, running: int) -> None:
    """``running`` items of group ``key`` hold a place in its limit (taken as a forwarder takes them)."""
    store.take_slots({key: SlotAsk(running, [(f"{key}-{i}", i) for i in range(running)])}, hold_ms=HOLD, wait_ms=HOLD)


def keys(page: dict[str, Any]) -> list[str]:
    return [g["key"] for g in page["page"]]


def test_groups_busiest_first_with_totals_and_pages(client: TestClient, web_store: DelayStore) -> None:
    run(web_store, "busy", 4)
    run(web_store, "k}odd", 2)
    run(web_store, "a/b", 1)
    web_store.set_group("idle", limit=4, rate="10/s", weight=3)
    web_store.pause_group("paused")
    listed = client.get("/api/v1/groups", headers=AUTH)
    assert listed.status_code == 200, listed.text
    board = listed.json()
    assert {k: board[k] for k in ("groups", "running", "parked", "paused", "throttled")} == {
        "groups": 5,
        "running": 7,
        "parked": 0,
        "paused": 1,
        "throttled": 0,
    }
    assert keys(board) == ["busy", "k}odd", "a/b", "idle", "paused"], "busiest first, then by key"
    assert board["page"][0] == {
        "key": "busy",
        "limit": None,
        "rate": None,
        "weight": None,
        "paused_by": None,
        "throttled_until": None,
        "throttled_by": None,
        "held": None,
        "running": 4,
        "parked": 0,
    }
    idle = board["page"][3]
    assert (idle["limit"], idle["rate"], idle["weight"], idle["held"]) == (4, "10/s", 3, None)
    assert board["page"][4]["paused_by"] == "operator" and board["page"][4]["held"] == "paused"

    page = client.get("/api/v1/groups?offset=1&limit=2", headers=AUTH).json()
    assert keys(page) == ["k}odd", "a/b"] and page["groups"] == 5 and page["running"] == 7, "totals cover all"
    assert client.get("/api/v1/groups?offset=5", headers=AUTH).json()["page"] == []
    assert client.get("/api/v1/groups/busy", headers=AUTH).json()["running"] == 4
    assert client.get("/api/v1/groups/a/b", headers=AUTH).json()["running"] == 1, "a slash is part of the key"
    assert client.get("/api/v1/group", params={"key": "k}odd"}, headers=AUTH).json()["running"] == 2
    unused = client.get("/api/v1/group", params={"key": ".."}, headers=AUTH).json()
    assert (unused["key"], unused["running"], unused["limit"], unused["held"]) == ("..", 0, None, None)
    for bad in ("offset=-1", "offset=1.0", "limit=0", "limit=1001"):
        assert client.get(f"/api/v1/groups?{bad}", headers=AUTH).status_code == 422, bad


def test_a_policy_set_paused_and_resumed_over_http_is_the_stores(client: TestClient, web_store: DelayStore) -> None:
    assert client.get("/api/v1/groups", headers=AUTH).json()["groups"] == 0  # the group list is now cached
    put = client.post("/api/v1/groups/tenant-7", headers=AUTH, json={"limit": 5, "rate": "600/m"})
    assert put.status_code == 200, put.text
    assert (put.json()["limit"], put.json()["rate"], put.json()["weight"]) == (5, "600/m", None)
    policy = web_store.group_policy("tenant-7")
    assert (policy.limit, policy.rate) == (5, "600/m")
    assert keys(client.get("/api/v1/groups", headers=AUTH).json()) == ["tenant-7"], "a group just set is listed at once"

    weight = client.post("/api/v1/groups/tenant-7", headers=AUTH, json={"weight": 2.5})
    assert (weight.json()["limit"], weight.json()["weight"]) == (5, 2.5), "a part left out stays as it is"
    removed = client.post("/api/v1/groups/tenant-7", headers=AUTH, json={"rate": None})
    assert (removed.json()["rate"], removed.json()["limit"]) == (None, 5), "null removes that part only"
    assert web_store.group_policy("tenant-7").rate is None

    paused = client.post("/api/v1/groups/tenant-7/pause", headers=AUTH, json={"by": "alice"})
    assert paused.status_code == 200, paused.text
    assert (paused.json()["paused_by"], paused.json()["held"]) == ("alice", "paused")
    assert web_store.group_policy("tenant-7").paused
    assert client.get("/api/v1/groups", headers=AUTH).json()["paused"] == 1
    resumed = client.post("/api/v1/groups/tenant-7/resume", headers=AUTH, json={})
    assert resumed.status_code == 200 and resumed.json()["paused_by"] is None
    assert not web_store.group_policy("tenant-7").paused
    assert web_store.group_policy("tenant-7").limit == 5, "a resume keeps the policy"

    # any key by query, one that looks like a route's tail included
    by_query = client.post("/api/v1/group", params={"key": "x/pause"}, headers=AUTH, json={"limit": 2})
    assert by_query.status_code == 200 and web_store.group_policy("x/pause").limit == 2
    assert not web_store.group_policy("x").paused, "the query form pauses nothing else"
    bare = client.post("/api/v1/group/pause", params={"key": "."}, headers=AUTH, json={})
    assert bare.status_code == 200 and bare.json()["paused_by"] == "operator", "by no one named: the operator"
    assert client.post("/api/v1/group/resume", params={"key": "."}, headers=AUTH, json={}).json()["held"] is None


def test_a_throttled_group_shows_until_when_and_by_whom(client: TestClient, web_store: DelayStore) -> None:
    web_store.throttle_group("llm", 30, by="429 from upstream")
    shown = client.get("/api/v1/groups/llm", headers=AUTH).json()
    assert shown["held"] == "throttled" and shown["throttled_by"] == "429 from upstream"
    until = datetime.fromisoformat(shown["throttled_until"])
    left = (until - datetime.now(timezone.utc)).total_seconds()
    assert 20 < left <= 31, shown
    assert client.get("/api/v1/groups", headers=AUTH).json()["throttled"] == 1


@pytest.mark.parametrize(
    "body, words",
    [
        ({"limit": 0}, "greater than or equal to 1"),
        ({"limit": "5"}, "send a JSON number"),
        ({"limit": True}, "send a JSON number"),
        ({"limit": 1.5}, "integer"),
        ({"rate": "10"}, "should match pattern"),
        ({"rate": "10/d"}, "should match pattern"),
        ({"rate": 10}, "valid string"),
        ({"weight": 0}, "greater than 0"),
        ({"weight": -1}, "greater than 0"),
        ({"weight": "3"}, "send a JSON number"),
        ({}, "send at least one of limit, rate, weight"),
        ({"extra": 1}, "send at least one of limit, rate, weight"),
    ],
)
def test_a_bad_policy_is_a_422_that_says_what_to_send(
    client: TestClient, web_store: DelayStore, body: dict[str, Any], words: str
) -> None:
    web_store.set_group("k", limit=3, rate="5/s", weight=2)
    response = client.post("/api/v1/groups/k", headers=AUTH, json=body)
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]
    policy = web_store.group_policy("k")
    assert (policy.limit, policy.rate, policy.weight) == (3, "5/s", 2), "a refused policy changes nothing"


def test_a_policy_the_schema_allows_and_the_store_refuses_is_a_400_naming_the_rule(
    client: TestClient, web_store: DelayStore
) -> None:
    web_store.set_group("k", rate="5/s")
    for body, words in (({"rate": "0/s"}, "N > 0"), ({"rate": "2000000/s"}, "at most 1e+06/s")):
        response = client.post("/api/v1/groups/k", headers=AUTH, json=body)
        assert response.status_code == 400, response.text
        assert words in response.json()["detail"]
    assert web_store.group_policy("k").rate == "5/s", "nothing written"


def test_a_key_that_is_not_one_is_refused_with_the_rule(client: TestClient, web_store: DelayStore) -> None:
    for key in ("tab\there", "\u2028"):
        for path, body in (("/api/v1/group", {"limit": 2}), ("/api/v1/group/pause", {})):
            response = client.post(path, params={"key": key}, headers=AUTH, json=body)
            assert response.status_code == 400, response.text
            assert "printable text" in response.json()["detail"]
    too_long = client.post("/api/v1/group", params={"key": "k" * 201}, headers=AUTH, json={"limit": 2})
    assert too_long.status_code == 422 and "at most 200 characters" in too_long.json()["detail"]
    assert web_store.groups_in_use() == []


def test_garbage_in_a_groups_keys_never_makes_a_5xx(client: TestClient, web_store: DelayStore) -> None:
    prefix, raw = web_store.config.prefix, web_store.client
    run(web_store, "good", 1)
    raw.set(group_policy_key(prefix, "junk-policy"), "not a hash")
    raw.hset(group_policy_key(prefix, "odd-policy"), mapping={"limit": "lots", "rate": "fast", "weight": "-1"})
    raw.set(slot_holds_key(prefix, "junk-holds"), "not a sorted set")
    listed = client.get("/api/v1/groups", headers=AUTH)
    assert listed.status_code == 200, listed.text
    groups = {g["key"]: g for g in listed.json()["page"]}
    assert groups["good"]["running"] == 1
    for junk in ("junk-policy", "odd-policy", "junk-holds"):
        assert groups[junk]["running"] == 0 and groups[junk]["limit"] is None, groups[junk]
    assert client.get("/api/v1/group", params={"key": "odd-policy"}, headers=AUTH).status_code == 200


def test_a_redis_user_that_may_not_write_policies_gets_a_503_and_the_reads_answer(
    web_store: DelayStore, valkey_url: str
) -> None:
    """A dashboard on the ``reader`` role (read-only): it lists and shows groups; a write says
    Redis refused it, and changes nothing."""
    prefix = web_store.config.prefix
    web_store.check_meta()
    web_store.set_group("k", limit=3)
    name, password = f"rd-{prefix[-8:]}", "pw-0123456789"
    web_store.client.execute_command(*acl_setuser(name, prefix, "reader", password=password))
    try:
        port = web_store.client.connection_pool.connection_kwargs["port"]
        user = make_store(f"redis://{name}:{password}@127.0.0.1:{port}/0", prefix, shards=SHARDS)
        with TestClient(create_app(user, token=TOKEN)) as client:
            listed = client.get("/api/v1/groups", headers=AUTH)
            assert listed.status_code == 200, listed.text
            assert keys(listed.json()) == ["k"]
            for path, body in [("/api/v1/group?key=k", {"limit": 9}), ("/api/v1/group/pause?key=k", {})]:
                response = client.post(path, headers=AUTH, json=body)
                assert response.status_code == 503, response.text
                assert "refused the command" in response.json()["detail"]
        policy = web_store.group_policy("k")
        assert policy.limit == 3 and not policy.paused
    finally:
        web_store.client.execute_command("ACL", "DELUSER", name)


# -- the dashboard, in a real Chromium, over a real forwarder --------------------------------


def test_the_dashboard_shows_groups_and_sets_a_policy_the_forwarder_obeys(
    page: Any,
    dashboard_factory: Callable[..., Any],
    web_store: DelayStore,
    valkey_url: str,
    prefix: str,
    procs: Launcher,
) -> None:
    """Grouped items released by a real ``delayq forward``: the page shows each group's policy,
    running (a bar against the limit) and state; a limit set on the page lands in the store and
    the forwarder lets one more in; a pause and a resume on the page land in the store."""
    out = f"{prefix}:out"
    now = datetime.now(timezone.utc) - timedelta(seconds=5)
    for i in range(6):
        web_store.schedule(
            f"c42-{i}", now, RedisListTarget.envelope(out, b"x"), slot={"key": "customer-42", "limit": 2}
        )
    web_store.schedule("eu-0", now, RedisListTarget.envelope(out, b"x"), slot={"key": "acme/eu", "limit": 1})
    web_store.set_group("idle", limit=9, rate="10/s", weight=2)
    procs.delayq("forward", "--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--log-level", "error")
    c42 = lambda: web_store.group_statuses(["customer-42"])[0]  # noqa: E731
    wait_for(lambda: c42().running == 2, 30, lambda: f"2 running: {c42()}")
    dashboard = dashboard_factory()
    expect.set_options(timeout=TIMEOUT_MS)

    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    rows = page.locator("#groups tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator("#groups-summary")).to_contain_text("(3 groups · 3 running · ")
    cells = lambda n: [rows.nth(n).locator("td").nth(i) for i in range(7)]  # noqa: E731
    key, limit, rate, weight, running, _, state = cells(0)  # busiest first
    expect(key).to_have_text("customer-42")
    expect(limit).to_have_text("–")
    expect(running).to_have_text("2")
    expect(state).to_have_text("releasing")
    expect(rows.nth(1)).to_contain_text("acme/eu")
    _, idle_limit, idle_rate, idle_weight, idle_running, _, _ = cells(2)
    expect(idle_limit).to_have_text("9")
    expect(idle_rate).to_have_text("10/s")
    expect(idle_weight).to_have_text("2")
    expect(idle_running).to_have_text("0 / 9")
    expect(idle_running.locator("meter")).to_have_attribute("max", "9")

    page.click("#groups button[data-action=edit-group][data-key=customer-42]")
    expect(page.locator("#group-key")).to_have_value("customer-42")
    page.fill("#group-limit", "0")
    page.click("#group-set")
    expect(page.locator("#group-message")).to_contain_text("greater than or equal to 1")
    assert web_store.group_policy("customer-42").limit is None, "a refused limit changes nothing"
    page.fill("#group-limit", "3")
    page.fill("#group-weight", "4")
    page.click("#group-set")
    expect(page.locator("#group-message")).to_have_text("customer-42: limit 3, weight 4.")
    assert (web_store.group_policy("customer-42").limit, web_store.group_policy("customer-42").weight) == (3, 4)
    wait_for(lambda: c42().running == 3, 15, lambda: f"the forwarder to let a third in: {c42()}")
    key, limit, _, weight, running, _, _ = cells(0)
    expect(limit).to_have_text("3")
    expect(weight).to_have_text("4")
    expect(running).to_have_text("3 / 3")
    expect(running.locator("meter")).to_have_attribute("value", "3")

    page.click("#groups button[data-action=pause-group][data-key=customer-42]")
    expect(page.locator("#group-message")).to_have_text("Paused customer-42.")
    expect(cells(0)[6]).to_have_text("paused by operator")
    expect(page.locator("#groups-summary")).to_contain_text("· 1 paused ·")
    assert web_store.group_policy("customer-42").paused
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#groups").locator("xpath=..").screenshot(path=str(ARTIFACTS / "dashboard-groups.png"))
    page.click("#groups button[data-action=resume-group][data-key=customer-42]")
    expect(page.locator("#group-message")).to_have_text("Resumed customer-42.")
    expect(cells(0)[6]).to_have_text("releasing")
    assert not web_store.group_policy("customer-42").paused

    page.fill("#group-key", "customer-42")
    for part in ("limit", "rate", "weight"):
        page.fill(f"#group-{part}", "")
    page.fill("#group-limit", "none")
    page.click("#group-set")
    expect(page.locator("#group-message")).to_have_text("customer-42: limit removed.")
    assert web_store.group_policy("customer-42").limit is None


def test_the_groups_panel_pages_through_many_groups(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore
) -> None:
    """120 groups: 50 a page, busiest first; Next and First page turn it, the last page says so."""
    for i in range(120):
        run(web_store, f"t-{i:03d}", 1 + (i == 7) * 5)
    dashboard = dashboard_factory()
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    rows = page.locator("#groups tbody tr")
    expect(rows).to_have_count(50)
    expect(rows.first).to_contain_text("t-007")
    expect(rows.nth(1)).to_contain_text("t-000")
    expect(page.locator("#groups-summary")).to_contain_text("120 groups · 125 running")
    expect(page.locator("#groups-first")).to_be_hidden()
    page.click("#groups-next")
    expect(page.locator("#groups-page")).to_have_text("page 2")
    expect(rows.first).to_contain_text("t-050")
    page.click("#groups-next")
    expect(page.locator("#groups-page")).to_have_text("page 3 (the last)")
    expect(rows).to_have_count(20)
    expect(page.locator("#groups-next")).to_be_hidden()
    page.click("#groups-first")
    expect(rows.first).to_contain_text("t-007")
