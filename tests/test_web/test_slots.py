"""Concurrency slots over HTTP: every key's limit, items running and waiting, busiest first with
the totals over all; a limit set or removed lands in the store, a bad one is a 4xx that says what
to send; garbage in slot keys reads as empty, never a 5xx. (The dashboard shows slot keys as the
groups they are: tests/test_web/test_groups.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from delayq_backends import DelayStore
from delayq_backends.acl import acl_setuser
from delayq_backends.keys import slot_holds_key, slot_limit_key, slot_waiting_key
from delayq_backends.store import SlotAsk
from delayq_backends.web import create_app
from tests.harness import make_store
from tests.test_web.conftest import AUTH, SHARDS, TOKEN

HOLD = 600_000  # ms: no hold lapses while a test runs


def take(store: DelayStore, key: str, limit: int, asking: int) -> None:
    """``asking`` items of ``key`` ask for slots: ``limit`` of them run, the rest wait."""
    store.take_slots({key: SlotAsk(limit, [(f"{key}-{i}", i) for i in range(asking)])}, hold_ms=HOLD, wait_ms=HOLD)


def test_slots_busiest_first_with_totals_and_pages(client: TestClient, web_store: DelayStore) -> None:
    take(web_store, "busy", 2, 6)
    take(web_store, "k}odd", 1, 3)
    take(web_store, "a/b", 1, 1)
    web_store.set_slot_limit("idle", 4)
    listed = client.get("/api/v1/slots", headers=AUTH)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {
        "keys": 4,
        "running": 4,
        "waiting": 6,
        "slots": [
            {"key": "busy", "limit": None, "running": 2, "waiting": 4},
            {"key": "k}odd", "limit": None, "running": 1, "waiting": 2},
            {"key": "a/b", "limit": None, "running": 1, "waiting": 0},
            {"key": "idle", "limit": 4, "running": 0, "waiting": 0},
        ],
    }
    page = client.get("/api/v1/slots?offset=1&limit=2", headers=AUTH).json()
    assert [s["key"] for s in page["slots"]] == ["k}odd", "a/b"] and page["keys"] == 4
    assert client.get("/api/v1/slots/busy", headers=AUTH).json()["waiting"] == 4
    assert client.get("/api/v1/slots/a/b", headers=AUTH).json()["running"] == 1, "a slash is part of the key"
    assert client.get("/api/v1/slot", params={"key": "k}odd"}, headers=AUTH).json()["running"] == 1
    unused = client.get("/api/v1/slot", params={"key": ".."}, headers=AUTH).json()
    assert unused == {"key": "..", "limit": None, "running": 0, "waiting": 0}


def test_a_limit_set_and_removed_over_http_is_the_stores(client: TestClient, web_store: DelayStore) -> None:
    assert client.get("/api/v1/slots", headers=AUTH).json()["keys"] == 0  # the key list is now cached
    put = client.put("/api/v1/slots/customer-42/limit", headers=AUTH, json={"limit": 5})
    assert put.status_code == 200, put.text
    assert put.json() == {"key": "customer-42", "limit": 5, "running": 0, "waiting": 0}
    assert web_store.slot_status("customer-42").limit == 5
    assert [s["key"] for s in client.get("/api/v1/slots", headers=AUTH).json()["slots"]] == ["customer-42"], (
        "a key whose limit was just set is listed at once"
    )
    by_query = client.put("/api/v1/slot/limit", params={"key": "."}, headers=AUTH, json={"limit": 2})
    assert by_query.status_code == 200 and web_store.slot_status(".").limit == 2, "any key is reachable by query"
    removed = client.put("/api/v1/slots/customer-42/limit", headers=AUTH, json={"limit": None})
    assert removed.status_code == 200 and removed.json()["limit"] is None
    assert web_store.slot_status("customer-42").limit is None


@pytest.mark.parametrize(
    "body, words",
    [
        ({"limit": 0}, "greater than or equal to 1"),
        ({"limit": -3}, "greater than or equal to 1"),
        ({"limit": 1_000_001}, "less than or equal to 1000000"),
        ({"limit": "5"}, "send a JSON number"),
        ({"limit": True}, "send a JSON number"),
        ({"limit": 1.5}, "integer"),
        ({}, "body.limit: Field required"),
        ({"limit": 2, "extra": 1}, None),  # an unknown field is ignored, as in every body of the API
    ],
)
def test_a_bad_limit_is_a_422_that_says_what_to_send(
    client: TestClient, web_store: DelayStore, body: dict[str, Any], words: str | None
) -> None:
    web_store.set_slot_limit("k", 3)
    response = client.put("/api/v1/slots/k/limit", headers=AUTH, json=body)
    if words is None:
        assert response.status_code == 200
        return
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]
    assert web_store.slot_status("k").limit == 3, "a refused limit changes nothing"


def test_a_key_that_is_not_one_is_refused_with_the_rule(client: TestClient, web_store: DelayStore) -> None:
    for key in ("tab\there", "\u2028"):
        response = client.put("/api/v1/slot/limit", params={"key": key}, headers=AUTH, json={"limit": 2})
        assert response.status_code == 400, response.text
        assert "printable text" in response.json()["detail"]
    too_long = client.put("/api/v1/slot/limit", params={"key": "k" * 201}, headers=AUTH, json={"limit": 2})
    assert too_long.status_code == 422 and "at most 200 characters" in too_long.json()["detail"]
    assert web_store.slot_keys_in_use() == []


def test_garbage_in_slot_keys_reads_as_empty(client: TestClient, web_store: DelayStore) -> None:
    prefix, raw = web_store.config.prefix, web_store.client
    take(web_store, "good", 1, 2)
    raw.set(slot_holds_key(prefix, "junk-holds"), "not a sorted set")
    raw.hset(slot_waiting_key(prefix, "junk-line"), "a", "1")
    raw.set(slot_limit_key(prefix, "junk-limit"), "lots")
    raw.zadd(slot_holds_key(prefix, "bad\nkey"), {"m": web_store.server_time_ms() + HOLD})  # no valid key
    listed = client.get("/api/v1/slots", headers=AUTH)
    assert listed.status_code == 200, listed.text
    slots = {s["key"]: s for s in listed.json()["slots"]}
    assert slots["good"] == {"key": "good", "limit": None, "running": 1, "waiting": 1}
    assert slots["bad\nkey"]["running"] == 1
    for junk in ("junk-holds", "junk-line", "junk-limit"):
        assert slots[junk] == {"key": junk, "limit": None, "running": 0, "waiting": 0}
    assert client.get("/api/v1/slot", params={"key": "junk-holds"}, headers=AUTH).status_code == 200


def test_a_redis_user_without_scan_or_get_is_a_503_for_slots_only(web_store: DelayStore, valkey_url: str) -> None:
    """The ``forwarder`` role (the dashboard's, see docs/security.md) has no SCAN or SET: the slot
    routes say Redis refused, and the other routes answer."""
    prefix = web_store.config.prefix
    web_store.check_meta()
    name, password = f"fwd-{prefix[-8:]}", "pw-0123456789"
    web_store.client.execute_command(*acl_setuser(name, prefix, "forwarder", password=password))
    try:
        port = web_store.client.connection_pool.connection_kwargs["port"]
        user = make_store(f"redis://{name}:{password}@127.0.0.1:{port}/0", prefix, shards=SHARDS)
        with TestClient(create_app(user, token=TOKEN)) as client:
            assert client.get("/api/v1/stats", headers=AUTH).status_code == 200
            for method, path, body in [
                ("GET", "/api/v1/slots", None),
                ("PUT", "/api/v1/slot/limit?key=k", {"limit": 2}),
            ]:
                response = client.request(method, path, headers=AUTH, json=body)
                assert response.status_code == 503, response.text
                assert "refused the command" in response.json()["detail"]
    finally:
        web_store.client.execute_command("ACL", "DELUSER", name)
