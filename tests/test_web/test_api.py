"""The HTTP API: auth on every data route, clear 4xx for bad input, 503 for an unreachable store,
and items scheduled over HTTP that Celery and RQ workers take for their own."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery
from fastapi import FastAPI
from fastapi.testclient import TestClient

from bench.lib.proxy import TcpProxy
from delayq_backends import Config, DelayStore
from delayq_backends.audit import FORWARDED, AuditRecord, RedisStreamAudit
from delayq_backends.celery import CeleryTarget
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.models import FailedDelivery
from delayq_backends.rq import RQTarget
from delayq_backends.web import create_app
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for
from tests.test_celery.test_replay import drain
from tests.test_web.conftest import AUTH, TOKEN

ITEM = Envelope("list", "somewhere", b"x")
LOCAL = "http://127.0.0.1"


def data_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) of the API, path and query ids filled in."""
    schema = app.openapi()
    return [
        (
            method.upper(),
            path.replace("{item_id}", "some-id").replace("{name}", "some-name")
            + ("?id=some-id" if path.endswith(("/item", "/reschedule", "/why")) else ""),
        )
        for path, operations in schema["paths"].items()
        for method in operations
    ]


def test_the_schema_lists_every_route(app: FastAPI) -> None:
    assert (
        len(data_routes(app)) == 42
    )  # the groups joined the periodic entry actions and history, batches, slots, items, dead letters, producers; why
    assert app.openapi()["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    text = json.dumps(app.openapi())
    assert '"ge"' not in text and '"le"' not in text, "every bound is a JSON Schema minimum/maximum"


@pytest.mark.parametrize(
    "headers, code",
    [({}, 401), ({"Authorization": "Bearer wrong-token-0123456789"}, 403), ({"Authorization": f"Basic {TOKEN}"}, 401)],
)
def test_every_data_route_needs_the_token(client: TestClient, app: FastAPI, headers: dict[str, str], code: int) -> None:
    for method, path in data_routes(app):
        response = client.request(method, path, headers=headers, json={})
        assert response.status_code == code, (method, path, response.text)
        assert "token" in response.json()["detail"]


def test_the_page_and_the_schema_need_no_token_but_hold_no_data(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "delayq" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/api/v1/openapi.json").status_code == 200
    assert client.get("/static/dashboard.js").status_code == 200


def test_without_auth_calls_go_through_for_loopback_names_only(web_store: DelayStore) -> None:
    with TestClient(create_app(web_store, token=None), base_url=LOCAL) as client:
        assert client.get("/api/v1/stats").status_code == 200
        assert client.get("/api/v1/stats", headers={"Host": "localhost:8765"}).status_code == 200
        rebound = client.get("/api/v1/stats", headers={"Host": "attacker.example:8765"})
        assert rebound.status_code == 400, "a DNS-rebound page must not reach an API without a token"


def test_a_newer_format_item_is_named_newer_not_corrupt(client: TestClient, web_store: DelayStore) -> None:
    newer = bytearray(ITEM.encode() if isinstance(ITEM, Envelope) else ITEM)
    newer[2] = 99  # format version byte: a newer release's producer wrote it
    web_store.schedule("newer", timedelta(hours=1), bytes(newer))
    item = client.get("/api/v1/items/newer", headers=AUTH).json()
    assert item["corrupt"] is None and item["newer_format"] == 99


def test_get_cancel_reschedule_by_id(client: TestClient, web_store: DelayStore) -> None:
    web_store.schedule("a/b c", timedelta(hours=1), ITEM, rank=7)
    item = client.get("/api/v1/items/a%2Fb%20c", headers=AUTH).json()
    assert item["id"] == "a/b c" and item["target"] == "list" and item["destination"] == "somewhere"
    assert item["rank"] == 7
    moved = client.post(
        "/api/v1/items/a%2Fb%20c/reschedule", headers=AUTH, json={"eta": "2031-02-03T04:05:06.789+01:00"}
    )
    assert moved.status_code == 200 and moved.json()["ready"] == "2031-02-03T03:05:06.789Z"
    expected = datetime(2031, 2, 3, 3, 5, 6, 789000, tzinfo=timezone.utc)
    assert web_store.get("a/b c").ready_ms == int(expected.timestamp() * 1000)  # type: ignore[union-attr]
    assert client.delete("/api/v1/items/a%2Fb%20c", headers=AUTH).json() == {"id": "a/b c", "cancelled": True}
    assert web_store.get("a/b c") is None
    for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/reschedule")]:
        gone = client.request(method, f"/api/v1/items/a%2Fb%20c{path}", headers=AUTH, json={"countdown": 1})
        assert gone.status_code == 404 and "a/b c" in gone.json()["detail"]


def test_why_answers_for_every_id(client: TestClient, web_store: DelayStore) -> None:
    """The same answer as ``Reader.why``, as JSON; an id the store lacks is an answer too, and
    ids a path would split (``a/b``, ``..``) reach it by ``?id=``."""
    web_store.schedule("a/b", 2_000_000_000, ITEM)
    bury(web_store, [".."])
    later = client.get("/api/v1/item/why", params={"id": "a/b"}, headers=AUTH)
    assert later.status_code == 200, later.text
    assert later.json() | {"running_ids": []} == {
        "id": "a/b", "state": "scheduled", "line": "not due until 2033-05-18T03:33:20.000Z",
        "until": "2033-05-18T03:33:20.000Z", "since": None, "ready": "2033-05-18T03:33:20.000Z", "attempts": None,
        "group": None, "running": None, "running_ids": [], "limit": None, "ahead": None, "queue": "somewhere",
        "forwarder": None, "reason": None,
    }  # fmt: skip
    dead = client.get("/api/v1/item/why", params={"id": ".."}, headers=AUTH).json()
    assert (dead["state"], dead["reason"], dead["attempts"]) == ("dead", "broken on purpose", 1)
    unknown = client.get("/api/v1/item/why", params={"id": "nope"}, headers=AUTH)
    assert unknown.status_code == 200 and unknown.json()["state"] == "unknown"
    bad = client.get("/api/v1/item/why", params={"id": "bad\u202eid"}, headers=AUTH)
    assert bad.status_code == 400 and "U+202E" in bad.json()["detail"]


def test_stats_due_and_listing(client: TestClient, web_store: DelayStore) -> None:
    now = web_store.server_time_ms()
    web_store.schedule_many([(f"i{n}", (now + n * 60_000 + 90_000) / 1000, ITEM) for n in range(30)])
    web_store.schedule("late", 1.0, ITEM)
    stats = client.get("/api/v1/stats", headers=AUTH).json()
    assert stats["totals"]["scheduled"] == 31 and stats["totals"]["due"] == 1 and len(stats["shards"]) == 4
    due = client.get("/api/v1/due?minutes=60&bucket_minutes=10", headers=AUTH).json()
    assert due["overdue"] == 1 and len(due["counts"]) == 6 and sum(due["counts"]) == 30
    listed = client.get("/api/v1/items?limit=3", headers=AUTH).json()["items"]
    assert [i["id"] for i in listed] == ["late", "i0", "i1"]
    for _ in range(4):
        web_store.debounce("doc-9", 2.0, ITEM)
    listed = client.get("/api/v1/items?limit=2", headers=AUTH).json()["items"]
    assert [(i["id"], i["collapsed"]) for i in listed] == [
        ("late", None),
        ("debounce:doc-9", {"mode": "debounce", "key": "doc-9", "calls": 4}),
    ]
    assert client.get("/api/v1/item?id=debounce:doc-9", headers=AUTH).json()["collapsed"]["calls"] == 4


def test_dead_letters_list_requeue_and_purge(client: TestClient, web_store: DelayStore) -> None:
    bury(web_store, ["d1", "d2", "d3"])
    dead = client.get("/api/v1/dead", headers=AUTH).json()["items"]
    assert sorted(d["id"] for d in dead) == ["d1", "d2", "d3"] and dead[0]["error"] == "broken on purpose"
    assert client.post("/api/v1/dead/requeue", headers=AUTH, json={"ids": ["d1"]}).json() == {"done": 1}
    assert web_store.get("d1") is not None
    assert client.post("/api/v1/dead/purge", headers=AUTH, json={"all": True}).json() == {"done": 2}
    assert client.get("/api/v1/dead", headers=AUTH).json()["items"] == []


def bury(store: DelayStore, ids: list[str]) -> None:
    """Make dead letters of ``ids``: scheduled due, claimed, failed for good."""
    store.schedule_many([(i, 1.0, ITEM) for i in ids])
    for shard in range(store.shards):
        claim = store.claim(shard)
        store.fail(claim, [FailedDelivery(item.id, None, "broken on purpose") for item in claim.items])


@pytest.mark.parametrize(
    "path, body, code, words",
    [
        ("/api/v1/celery", {"task": "t", "eta": "2030-01-01T00:00:00"}, 422, "timezone"),
        ("/api/v1/celery", {"task": "t"}, 422, "exactly one of eta"),
        ("/api/v1/celery", {"task": "t", "countdown": 1, "eta": "2030-01-01T00:00:00Z"}, 422, "exactly one of eta"),
        ("/api/v1/celery", {"task": "t", "countdown": -1}, 422, "greater than or equal to 0"),
        ("/api/v1/celery", {"task": "t", "eta": "1960-01-01T00:00:00Z"}, 400, "before 1970"),
        ("/api/v1/celery", {"task": "t", "countdown": 1, "args": "notalist"}, 422, "list"),
        ("/api/v1/rq", {"func": "print", "countdown": 1}, 422, "func"),
        ("/api/v1/rq", {"func": "tests.test_rq.jobs.record", "countdown": 1, "id": "has space"}, 400, "has space"),
        ("/api/v1/items/x/reschedule", {"eta": "not a time"}, 422, "eta"),
        ("/api/v1/celery", {"task": "t", "eta": 255}, 422, "send an ISO-8601 string"),  # not seconds since 1970
        ("/api/v1/items/x/reschedule", {"eta": 1.7e9}, 422, "send an ISO-8601 string"),
        ("/api/v1/dead/requeue", {"ids": ["a"], "all": True}, 422, "not both"),
    ],
)
def test_bad_input_is_a_4xx_that_says_what_to_fix(
    client: TestClient, path: str, body: dict[str, Any], code: int, words: str
) -> None:
    response = client.post(path, headers=AUTH, json=body)
    assert response.status_code == code, response.text
    assert words in response.json()["detail"]


@pytest.mark.parametrize(
    "raw", [b'{"task": "t", "countdown": NaN}', b'{"task": "t", "countdown": 1, "args": [Infinity]}']
)
def test_nan_and_infinity_are_refused(client: TestClient, raw: bytes) -> None:
    response = client.post("/api/v1/celery", headers={**AUTH, "Content-Type": "application/json"}, content=raw)
    assert response.status_code == 422, response.text


def test_an_unreachable_store_is_a_503_that_says_what_to_do(valkey_server: EmbeddedServer, prefix: str) -> None:
    proxy = TcpProxy("127.0.0.1", valkey_server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    store = DelayStore(
        redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2), Config(url=url, prefix=prefix, shards=4)
    )
    try:
        with TestClient(create_app(store, token=None), base_url=LOCAL) as client:
            assert client.get("/api/v1/stats").status_code == 200
            proxy.cut()
            response = client.get("/api/v1/stats")
    finally:
        proxy.close()
    assert response.status_code == 503, response.text
    assert "cannot be reached" in response.json()["detail"] and "--url" in response.json()["detail"]


def test_rq_without_its_redis_is_a_501(web_store: DelayStore) -> None:
    with TestClient(create_app(web_store, token=None), base_url=LOCAL) as client:
        response = client.post("/api/v1/rq", json={"func": "m.f", "countdown": 1})
    assert response.status_code == 501 and "--rq-redis" in response.json()["detail"]


def test_lateness_from_the_audit_stream(web_store: DelayStore, prefix: str) -> None:
    stream = f"{prefix}:audit"
    audit = RedisStreamAudit(web_store.config.url, stream, background=False)
    audit.record(
        [AuditRecord(FORWARDED, f"i{n}", "list", "q", 1_000_000, 1_000_000 + n * 10, 1, "f") for n in range(1, 21)]
    )
    audit.close()
    with TestClient(create_app(web_store, token=None, audit_stream=stream), base_url=LOCAL) as client:
        late = client.get("/api/v1/lateness").json()
    assert late["count"] == 20 and late["p50_ms"] == 100 and late["p95_ms"] == 190 and late["max_ms"] == 200
    assert late["records"][0]["id"] == "i20", "latest first"


# -- scheduled over HTTP, run by the frameworks ---------------------------------------------------


def test_a_celery_task_scheduled_over_http_is_the_message_celery_sends(
    web_store: DelayStore, valkey_server: EmbeddedServer, prefix: str
) -> None:
    """Forwarded to a Redis broker, the API's task equals Celery's own ``send_task`` of the same call."""
    broker = f"{valkey_server.url.rsplit('/', 1)[0]}/1"
    queue = f"{prefix}-celery"
    eta = datetime.now(timezone.utc).replace(microsecond=123000) + timedelta(seconds=1)
    call: dict[str, Any] = {"args": [1, "ü", {"k": [1.5, None]}], "kwargs": {"z": True}}
    native = Celery("native", broker=broker, set_as_current=False)
    with TestClient(create_app(web_store, token=TOKEN, celery_broker=broker)) as client:
        response = client.post(
            "/api/v1/celery",
            headers=AUTH,
            json={"task": "dqt.record", "id": "same-id", "queue": queue, "priority": 3, "eta": eta.isoformat(), **call},
        )
    assert response.status_code == 201, response.text
    native.send_task("dqt.record", task_id="same-id", eta=eta, queue=queue, priority=3, reply_to="r", **call)
    forwarder = Forwarder(web_store, [CeleryTarget.from_url(broker)])
    wait_for(lambda: forwarder.run_once() == 1, 10, "the task to fall due and be forwarded")
    native_msg, replayed = drain(broker, queue, 2)
    native.close()
    assert replayed.body == native_msg.body
    assert replayed.headers == native_msg.headers, "every header, eta included"
    assert replayed.properties["priority"] == native_msg.properties["priority"] == 3
    assert json.loads(replayed.body)[:2] == [call["args"], call["kwargs"]]


def test_an_rq_job_scheduled_over_http_runs_under_a_real_worker(
    client: TestClient, web_store: DelayStore, processes: Processes, prefix: str
) -> None:
    queue = f"{prefix}-q"
    response = client.post(
        "/api/v1/rq",
        headers=AUTH,
        json={"func": "tests.test_rq.jobs.record", "args": ["from-http"], "queue": queue, "id": "job-1",
              "countdown": 0, "timeout": 30, "result_ttl": 600},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    assert response.json()["result"] == "added"
    conn = web_store.client
    forwarder = Forwarder(web_store, [RQTarget(conn)])  # type: ignore[arg-type]
    wait_for(lambda: forwarder.run_once() == 1, 10, "the job to be forwarded into its queue")
    worker = processes.worker(queue, burst=True)
    assert worker.wait(timeout=60) == 0, worker.stderr.read().decode() if worker.stderr else ""
    assert [(r["id"], r["tag"]) for r in runs(conn, queue)] == [("job-1", "from-http")]  # type: ignore[arg-type]


@pytest.mark.parametrize("query", ["offset=0.0", "limit=1e3", "limit=-1", "offset=%EF%BC%91"])
def test_query_numbers_are_digits(client: TestClient, query: str) -> None:
    response = client.get(f"/api/v1/dead?{query}", headers=AUTH)
    assert response.status_code == 422, response.text


def test_periodic_entries_with_schedule_last_and_next_run(client: TestClient, web_store: DelayStore) -> None:
    from celery import Celery

    from delayq_backends.celery.periodic import sync

    empty = client.get("/api/v1/periodic", headers=AUTH).json()
    assert empty["entries"] == [] and "periodic sync" in empty["hint"]  # the dashboard says what to do
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"tick": {"task": "t.tick", "schedule": 30.0}}
    assert sync(app, web_store).added == ["tick"]
    listed = client.get("/api/v1/periodic", headers=AUTH).json()
    assert listed["hint"] is None
    [entry] = listed["entries"]
    assert (entry["name"], entry["task"], entry["schedule"], entry["state"]) == (
        "tick",
        "t.tick",
        "every 30s",
        "scheduled",
    )
    assert entry["last_run"] is None and entry["next_run"] and entry["runs"] == 0


def test_the_item_view_decodes_a_periodic_entry_as_its_next_run(client: TestClient, web_store: DelayStore) -> None:
    from celery import Celery

    from delayq_backends.celery.periodic import KIND, sync
    from delayq_backends.periodic.ops import item_id

    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "beat-q"
    app.conf.beat_schedule = {"tick": {"task": "t.tick", "schedule": 30.0, "args": [1, "a"], "kwargs": {"k": 2}}}
    sync(app, web_store)
    item = client.get("/api/v1/item", params={"id": item_id("tick")}, headers=AUTH).json()
    task = item["task"]
    assert (item["target"], task["task"], task["args"], task["kwargs"]) == (KIND, "t.tick", [1, "a"], {"k": 2})
    assert (task["queue"], task["periodic"], task["note"]) == ("beat-q", "tick", None)
    assert task["id"] != "00000000-0000-0000-0000-000000000000"  # the next run's own task id
    plain = client.get("/api/v1/items", headers=AUTH).json()["items"]
    assert [i["task"]["periodic"] for i in plain] == ["tick"]


def test_a_garbage_periodic_registry_field_is_listed_with_its_fix(client: TestClient, web_store: DelayStore) -> None:
    """A non-UTF-8 registry field is one row naming the HDEL that removes it, not a 503."""
    from delayq_backends.celery.periodic import sync
    from delayq_backends.keys import periodic_key

    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"tick": {"task": "t.tick", "schedule": 30.0}}
    sync(app, web_store)
    web_store.client.hset(periodic_key(web_store.config.prefix), b"\xff", b"x")
    response = client.get("/api/v1/periodic", headers=AUTH)
    assert response.status_code == 200, response.text
    states = {e["name"]: e["state"] for e in response.json()["entries"]}
    assert states["tick"] == "scheduled" and "HDEL" in states['"\\xff"']
