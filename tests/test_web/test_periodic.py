"""Periodic entries over HTTP: add, change, pause, resume, run now, backfill and remove land in
the store as :mod:`delayq_backends.periodic.ops` writes them; the token guard, unknown names,
entries from code and bad definitions are 4xx that say what to do, and change nothing; an RQ
entry's function passes the allowlist. End to end, an entry added over HTTP is fired by a real
``delayq forward`` into a Redis broker's list: pause stops it, run now sends one run, resume
starts it again."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from celery import Celery
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from delayq_backends import DelayStore
from delayq_backends.celery import CeleryTarget
from delayq_backends.celery.periodic import PeriodicTarget, sync
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import periodic_trust_key
from delayq_backends.periodic import ops
from delayq_backends.periodic.firing import MANUAL, Run
from delayq_backends.periodic.registry import check_registry
from delayq_backends.periodic.schedules import Every, Period, run_task_id
from delayq_backends.periodic.state import state_of
from delayq_backends.timeutil import MAX_MS
from delayq_backends.web import create_app
from tests.harness import Launcher
from tests.harness.rq import Processes, runs
from tests.helpers import wait_for
from tests.test_web.conftest import ARTIFACTS, AUTH, RQ_JOBS, SHARDS, TOKEN
from tests.test_web.test_dashboard import TIMEOUT_MS

BACKFILL = {"start": "2030-01-01T00:00:00Z", "end": "2030-01-01T00:01:00Z"}
TICK = {"name": "tick", "task": "t.tick", "every": 30, "args": [1, "a"], "kwargs": {"k": 2}, "queue": "q1"}


def entry(client: TestClient, name: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/periodic/{name}", headers=AUTH)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def ready_ms(store: DelayStore, name: str) -> int:
    item = store.get(ops.item_id(name))
    assert item is not None
    return item.ready_ms


def test_add_show_and_change_an_entry(client: TestClient, web_store: DelayStore) -> None:
    added = client.post("/api/v1/periodic", headers=AUTH, json=TICK)
    assert added.status_code == 201, added.text
    assert added.json()["result"] == "added"
    shown = entry(client, "tick")
    assert (shown["kind"], shown["source"], shown["task"], shown["schedule"], shown["state"]) == (
        "celery",
        "runtime",
        "t.tick",
        "every 30s",
        "scheduled",
    )
    assert shown["enabled"] and not shown["finished"] and shown["next_run"]
    d = shown["definition"]
    assert (d["every"], d["args"], d["kwargs"], d["queue"], d["misfire"]) == (30, [1, "a"], {"k": 2}, "q1", "run_once")
    status = ops.get(web_store, "tick")
    assert status is not None and status.source == "runtime" and status.kind == "celery"

    again = client.post("/api/v1/periodic", headers=AUTH, json=TICK)
    assert (again.status_code, again.json()["result"]) == (200, "unchanged")
    cron = {k: v for k, v in TICK.items() if k != "every"} | {"cron": "30 2 * * 1-5", "tz": "Europe/Berlin"}
    changed = client.post("/api/v1/periodic", headers=AUTH, json=cron)
    assert (changed.status_code, changed.json()["result"]) == (200, "changed"), changed.text
    assert changed.json()["entry"]["schedule"] == "crontab 30 2 * * 1-5 (Europe/Berlin)"
    assert entry(client, "tick")["definition"]["cron"] == "30 2 * * 1-5"
    listed = client.get("/api/v1/periodic", headers=AUTH).json()
    assert [e["name"] for e in listed["entries"]] == ["tick"] and listed["hint"] is None


def test_pause_resume_run_backfill_and_remove(client: TestClient, web_store: DelayStore) -> None:
    assert client.post("/api/v1/periodic", headers=AUTH, json=TICK).status_code == 201
    scheduled_at = ready_ms(web_store, "tick")

    bare = client.post("/api/v1/periodic/tick/pause", headers=AUTH)
    assert bare.status_code == 415 and "must be JSON" in bare.json()["detail"], "an action's body is {}"
    paused = client.post("/api/v1/periodic/tick/pause", headers=AUTH, json={})
    assert paused.status_code == 200, paused.text
    assert (paused.json()["state"], paused.json()["enabled"], paused.json()["next_run"]) == ("paused", False, None)
    assert paused.json()["paused_at"] is not None
    assert ready_ms(web_store, "tick") == MAX_MS, "a paused entry's item is never due"

    resumed = client.post("/api/v1/periodic/tick/resume", headers=AUTH, json={}).json()
    assert (resumed["state"], resumed["enabled"]) == ("scheduled", True)
    assert ready_ms(web_store, "tick") == scheduled_at, "resumed before its next period: due at it"

    before = web_store.server_time_ms()
    ran = client.post("/api/v1/periodic/tick/run", headers=AUTH, json={}).json()
    assert ran["pending_runs"] == 1
    assert ready_ms(web_store, "tick") <= web_store.server_time_ms(), "a pending run makes the entry due now"
    [requested] = stored_state(web_store, "tick").run_now
    assert before <= requested <= web_store.server_time_ms()

    start = datetime.now(timezone.utc) - timedelta(minutes=10)
    body = {"start": start.isoformat(), "end": (start + timedelta(minutes=5)).isoformat()}
    backfilled = client.post("/api/v1/periodic/tick/backfill", headers=AUTH, json=body)
    assert backfilled.status_code == 200, backfilled.text
    assert backfilled.json()["pending_backfill"] == 1
    assert len(stored_state(web_store, "tick").backfill) == 1

    removed = client.delete("/api/v1/periodic/tick", headers=AUTH)
    assert removed.json() == {"name": "tick", "removed": True}
    assert ops.get(web_store, "tick") is None and web_store.get(ops.item_id("tick")) is None
    assert client.get("/api/v1/periodic", headers=AUTH).json()["entries"] == []


def stored_state(store: DelayStore, name: str) -> Any:
    item = store.get(ops.item_id(name))
    assert item is not None
    return state_of(Envelope.decode(item.envelope))


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/api/v1/periodic/nope"),
        ("POST", "/api/v1/periodic/nope/pause"),
        ("POST", "/api/v1/periodic/nope/resume"),
        ("POST", "/api/v1/periodic/nope/run"),
        ("POST", "/api/v1/periodic/nope/backfill"),
        ("DELETE", "/api/v1/periodic/nope"),
    ],
)
def test_an_unknown_name_is_a_404_naming_the_list(client: TestClient, method: str, path: str) -> None:
    body = {"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z"} if path.endswith("backfill") else {}
    response = client.request(method, path, headers=AUTH, json=body if method == "POST" else None)
    assert response.status_code == 404, response.text
    assert "no periodic entry 'nope'" in response.json()["detail"] and "periodic list" in response.json()["detail"]


def test_an_entry_from_code_is_changed_only_detached_and_removed_only_forced(
    client: TestClient, web_store: DelayStore
) -> None:
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {
        "nightly": {"task": "t.nightly", "schedule": 3600.0},
        "hourly": {"task": "t.hourly", "schedule": 3600.0},
    }
    assert sorted(sync(app, web_store).added) == ["hourly", "nightly"]
    assert entry(client, "nightly")["source"] == "code"

    refused = client.post("/api/v1/periodic", headers=AUTH, json={"name": "nightly", "task": "t.other", "every": 60})
    assert refused.status_code == 409, refused.text
    assert "detach" in refused.json()["detail"]
    assert entry(client, "nightly")["task"] == "t.nightly", "a refused change changes nothing"
    for verb in ("pause", "run", "resume"):  # runtime state a sync keeps: no detach needed
        assert client.post(f"/api/v1/periodic/nightly/{verb}", headers=AUTH, json={}).status_code == 200
    detached = client.post(
        "/api/v1/periodic", headers=AUTH, json={"name": "nightly", "task": "t.other", "every": 60, "detach": True}
    )
    assert (detached.status_code, detached.json()["result"]) == (200, "changed"), detached.text
    assert (detached.json()["entry"]["source"], detached.json()["entry"]["task"]) == ("runtime", "t.other")

    kept = client.delete("/api/v1/periodic/hourly", headers=AUTH)
    assert kept.status_code == 409 and "force" in kept.json()["detail"] and "adds it back" in kept.json()["detail"]
    assert ops.get(web_store, "hourly") is not None
    assert client.delete("/api/v1/periodic/hourly?force=true", headers=AUTH).json()["removed"] is True
    assert ops.get(web_store, "hourly") is None


def test_an_edit_keeps_an_intervals_alignment_unless_it_sets_it(client: TestClient, web_store: DelayStore) -> None:
    """Celery's schedule(relative=True) runs on multiples of its period: an edit that leaves
    ``aligned`` out (the dashboard's form before it had the box, a script) keeps that; one that
    sets it sets or clears it; a new entry is not aligned."""
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"rel": {"task": "t.rel", "schedule": 30.0, "relative": True}}
    sync(app, web_store)
    assert entry(client, "rel")["definition"]["aligned"] is True

    def edit(**fields: Any) -> dict[str, Any]:
        body = {"name": "rel", "task": "t.rel", "every": 60, "detach": True, **fields}
        response = client.post("/api/v1/periodic", headers=AUTH, json=body)
        assert response.status_code == 200, response.text
        shown = entry(client, "rel")
        assert shown["schedule"].startswith("every 0:01:00"), shown["schedule"]
        return shown

    kept = edit(args=[1])
    assert kept["definition"]["aligned"] is True and kept["schedule"] == "every 0:01:00 (aligned)"
    assert ready_ms(web_store, "rel") % 60_000 == 0  # on a multiple of the new period
    assert edit(aligned=False)["definition"]["aligned"] is False
    assert edit()["definition"]["aligned"] is False  # cleared stays cleared
    assert edit(aligned=True)["definition"]["aligned"] is True

    new = client.post("/api/v1/periodic", headers=AUTH, json={"name": "plain", "task": "t.p", "every": 60})
    assert new.status_code == 201 and entry(client, "plain")["definition"]["aligned"] is False
    cron = client.post(
        "/api/v1/periodic", headers=AUTH, json={"name": "c", "task": "t.c", "cron": "* * * * *", "aligned": True}
    )
    assert cron.status_code == 422 and "aligned applies to an interval" in cron.text
    assert entry(client, "rel")["definition"]["aligned"] is True, "a refused body changes nothing"


NAMES = ["reports/daily", "a b", "50%", "100%2F", "ünï/代码 ✓", "x/history", "/lead/", "a//b"]


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_route_addresses_any_name_encoded(client: TestClient, web_store: DelayStore, name: str) -> None:
    """A name encoded as encodeURIComponent does ('/' as %2F) is one name on every route."""
    assert client.post("/api/v1/periodic", headers=AUTH, json={**TICK, "name": name}).status_code == 201
    path = f"/api/v1/periodic/{quote(name, safe='')}"
    shown = client.get(path, headers=AUTH)
    assert shown.status_code == 200 and shown.json()["name"] == name, shown.text
    for verb, body in [("pause", {}), ("resume", {}), ("run", {}), ("backfill", BACKFILL)]:
        acted = client.post(f"{path}/{verb}", headers=AUTH, json=body)
        assert acted.status_code == 200 and acted.json()["name"] == name, (verb, acted.text)
    assert stored_state(web_store, name).run_now and stored_state(web_store, name).backfill
    history = client.get(f"{path}/history", headers=AUTH)
    assert history.status_code == 200 and history.json()["name"] == name, history.text
    assert client.delete(path, headers=AUTH).json() == {"name": name, "removed": True}
    assert client.get(path, headers=AUTH).status_code == 404 and ops.get(web_store, name) is None


def test_a_literal_slash_reaches_the_entry_and_a_suffix_route_wins(client: TestClient) -> None:
    """Unencoded, '/periodic/a/b/history' is the history of 'a/b'; the entry 'a/b/history' is
    then reached encoded (and by its actions and removal, which have no such twin)."""
    for name in ("a/b", "a/b/history"):
        assert client.post("/api/v1/periodic", headers=AUTH, json={**TICK, "name": name}).status_code == 201
    assert entry(client, "a/b")["name"] == "a/b"
    assert client.get("/api/v1/periodic/a/b/history", headers=AUTH).json()["name"] == "a/b"
    assert entry(client, "a%2Fb%2Fhistory")["name"] == "a/b/history"
    assert client.get("/api/v1/periodic/a%2Fb%2Fhistory/history", headers=AUTH).json()["name"] == "a/b/history"
    assert client.get("/api/v1/periodic/a%2Fb/history", headers=AUTH).json()["name"] == "a/b"
    paused = client.post("/api/v1/periodic/a/b/history/pause", headers=AUTH, json={})
    assert paused.json()["name"] == "a/b/history" and not paused.json()["enabled"]
    assert entry(client, "a/b")["enabled"], "only the one named"
    assert client.delete("/api/v1/periodic/a/b/history", headers=AUTH).json()["name"] == "a/b/history"
    assert client.get("/api/v1/periodic/a/b/history", headers=AUTH).json()["name"] == "a/b"  # its history still


def test_a_served_dashboard_routes_encoded_names(dashboard_factory: Callable[..., Any], web_store: DelayStore) -> None:
    """The same through uvicorn (the raw path as a real server hands it on)."""
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {name: {"task": "t.n", "schedule": 60.0} for name in ("x/history", "x")}
    sync(app, web_store)
    base = dashboard_factory().base + "/api/v1/periodic/"
    assert httpx.get(base + "x%2Fhistory", headers=AUTH).json()["name"] == "x/history"
    assert httpx.get(base + "x/history", headers=AUTH).json()["name"] == "x"  # the history of x


@pytest.mark.parametrize(
    "body, words",
    [
        ({"cron": "61 * * * *"}, "crontab '61 * * * *': use five fields"),
        ({"cron": "* * *"}, "use five fields"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "body.tz: Value error, time zone 'Mars/Olympus' is unknown: use"),
        ({"every": 60, "misfire": "sometimes"}, "'run_once', 'run_all' or 'skip'"),
        ({"every": 60, "overlap": "never"}, "'allow', 'skip' or 'buffer_one'"),
        ({}, "give exactly one schedule"),
        ({"every": 60, "cron": "* * * * *"}, "give exactly one schedule"),
        ({"every": 0}, "greater than or equal to 0.001"),
        ({"every": "60"}, "send a JSON number"),
        ({"at": "2030-01-01T00:00:00"}, "timezone"),
        ({"at": 1.9e9}, "send an ISO-8601 string"),
        ({"every": 60, "cron": None}, "null is not allowed here"),
        ({"every": 60, "func": "app.tasks.f"}, "kind 'celery' names its task, not a func"),
        ({"every": 60, "kind": "rq"}, "kind 'rq' names its func, not a task"),
        ({"every": 60, "jitter": -1}, "greater than or equal to 0"),
        ({"every": 60, "max_runs": 0}, "greater than or equal to 1"),
    ],
)
def test_a_bad_definition_is_a_422_that_says_what_to_fix(
    client: TestClient, web_store: DelayStore, body: dict[str, Any], words: str
) -> None:
    response = client.post("/api/v1/periodic", headers=AUTH, json={"name": "bad", "task": "t.bad", **body})
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]
    assert ops.get(web_store, "bad") is None, "a refused definition stores nothing"


def test_what_the_schema_cannot_rule_out_is_a_400(client: TestClient, web_store: DelayStore) -> None:
    tab = client.post("/api/v1/periodic", headers=AUTH, json={"name": "a\tb", "task": "t", "every": 1})
    assert tab.status_code == 422, "a control character is no name (the schema's pattern)"
    separator = client.post("/api/v1/periodic", headers=AUTH, json={"name": "a\u2028b", "task": "t", "every": 1})
    assert separator.status_code == 400 and "printable" in separator.json()["detail"], separator.text
    reversed_ = {"name": "r", "task": "t", "every": 1, "start": "2030-01-02T00:00:00Z", "end": "2030-01-01T00:00:00Z"}
    assert client.post("/api/v1/periodic", headers=AUTH, json=reversed_).json()["detail"].endswith("swap them")
    one_off = {"name": "once", "task": "t", "at": "2030-01-01T00:00:00Z", "max_runs": 2}
    assert client.post("/api/v1/periodic", headers=AUTH, json=one_off).json()["detail"].endswith("drop max_runs")
    assert client.post("/api/v1/periodic", headers=AUTH, json={**TICK, "every": 1}).status_code == 201
    day = {"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z"}  # 86,400 periods of 1 s
    wide = client.post("/api/v1/periodic/tick/backfill", headers=AUTH, json=day)
    assert wide.status_code == 400 and "split it into shorter ranges" in wide.json()["detail"]
    backwards = client.post(
        "/api/v1/periodic/tick/backfill", headers=AUTH, json={"start": day["end"], "end": day["start"]}
    )
    assert backwards.status_code == 400 and "swap the times" in backwards.json()["detail"]
    assert entry(client, "tick")["pending_backfill"] == 0


@pytest.mark.parametrize("func", ["os.system", "builtins.eval", "tests.test_rq.jobs._private"])
def test_an_rq_entry_runs_only_an_allowed_function(client: TestClient, web_store: DelayStore, func: str) -> None:
    body = {"name": "evil", "kind": "rq", "func": func, "every": 60}
    response = client.post("/api/v1/periodic", headers=AUTH, json=body)
    assert response.status_code == 403, response.text
    assert "--rq-allow" in response.json()["detail"] or "not allowed" in response.json()["detail"]
    assert ops.get(web_store, "evil") is None


def test_an_rq_entry_of_an_allowed_function(client: TestClient, web_store: DelayStore) -> None:
    body = {"name": "rq-tick", "kind": "rq", "func": f"{RQ_JOBS}.record", "args": ["x"], "every": 60, "queue": "jobs"}
    added = client.post("/api/v1/periodic", headers=AUTH, json=body)
    assert added.status_code == 201, added.text
    shown = entry(client, "rq-tick")
    assert (shown["kind"], shown["task"], shown["source"]) == ("rq", f"{RQ_JOBS}.record", "runtime")
    assert shown["definition"]["queue"] == "jobs" and shown["definition"]["args"] is None  # RQ's data: not read
    assert web_store.client.hget(periodic_trust_key(web_store.config.prefix), "rq-tick"), "its definition recorded"
    with TestClient(create_app(web_store, token=TOKEN)) as no_rq:
        refused = no_rq.post("/api/v1/periodic", headers=AUTH, json={**body, "name": "rq-2"})
    assert refused.status_code == 501 and "--rq-redis" in refused.json()["detail"]


def test_both_day_fields_read_as_either_day_for_an_rq_entry_and_both_for_a_celery_one(client: TestClient) -> None:
    """'0 9 1 * 1': an RQ entry runs on the 1st and every Monday (as cron and `rq cron`), a Celery
    entry on a 1st that is a Monday (as Celery's crontab)."""
    rq_body = {"name": "rq-days", "kind": "rq", "func": f"{RQ_JOBS}.record", "cron": "0 9 1 * 1", "queue": "jobs"}
    celery_body = {"name": "celery-days", "task": "t.days", "cron": "0 9 1 * 1"}
    for body in (rq_body, celery_body):
        added = client.post("/api/v1/periodic", headers=AUTH, json=body)
        assert added.status_code == 201, added.text
    rq_entry, celery_entry = entry(client, "rq-days"), entry(client, "celery-days")
    assert rq_entry["schedule"] == "crontab 0 9 1 * 1 (UTC, either day)"
    assert celery_entry["schedule"] == "crontab 0 9 1 * 1 (UTC)"
    rq_next, celery_next = (datetime.fromisoformat(e["next_run"]) for e in (rq_entry, celery_entry))
    assert (rq_next.day == 1 or rq_next.weekday() == 0) and rq_next - datetime.now(timezone.utc) <= timedelta(days=7)
    assert celery_next.day == 1 and celery_next.weekday() == 0


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/api/v1/periodic", TICK),
        ("POST", "/api/v1/periodic/tick/pause", {}),
        ("POST", "/api/v1/periodic/tick/run", {}),
        ("POST", "/api/v1/periodic/tick/backfill", {"start": "2030-01-01T00:00:00Z", "end": "2030-01-01T00:01:00Z"}),
        ("DELETE", "/api/v1/periodic/tick", None),
    ],
)
def test_writes_need_the_token_and_the_page_origin(
    client: TestClient, web_store: DelayStore, method: str, path: str, body: dict[str, Any] | None
) -> None:
    assert client.post("/api/v1/periodic", headers=AUTH, json={**TICK, "every": 45}).status_code == 201
    before = web_store.get(ops.item_id("tick"))
    for headers, code in [
        ({}, 401),
        ({"Authorization": "Bearer wrong-token-0123456789"}, 403),
        ({**AUTH, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, 403),
    ]:
        response = client.request(method, path, headers=headers, json=body)
        assert response.status_code == code, (headers, response.text)
    assert web_store.get(ops.item_id("tick")) == before, "a refused write changes nothing"


# -- end to end: a real forwarder, a Redis broker ---------------------------------------------------


@pytest.fixture
def broker(valkey_server: EmbeddedServer, prefix: str) -> Iterator[tuple[str, redis.Redis]]:
    """The Celery broker (database 1 of the test server) and a client of it; the test's queue,
    ``<prefix>-beat``, is deleted afterwards."""
    url = f"{valkey_server.url.rsplit('/', 1)[0]}/1"
    client = redis.Redis.from_url(url)
    yield url, client
    client.delete(f"{prefix}-beat")
    client.close()


def sent_ids(broker: redis.Redis, queue: str) -> list[str]:
    """The task ids of the messages in ``queue``'s list, oldest first (kombu LPUSHes)."""
    return [json.loads(raw)["headers"]["id"] for raw in reversed(broker.lrange(queue, 0, -1))]


def test_an_entry_added_over_http_fires_pauses_and_runs_now_at_a_real_forwarder(
    web_store: DelayStore,
    valkey_url: str,
    prefix: str,
    procs: Launcher,
    broker: tuple[str, redis.Redis],
    tmp_path: Path,
) -> None:
    url, lists = broker
    queue = f"{prefix}-beat"
    log = tmp_path / "forward.log"
    procs.delayq(
        "forward", "--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS), "--celery-broker", url,
        "--poll", "0.1", "--log-level", "warning", log=log,
    )  # fmt: skip
    with TestClient(create_app(web_store, token=TOKEN, celery_broker=url)) as client:
        added = client.post(
            "/api/v1/periodic", headers=AUTH, json={"name": "tick", "task": "t.tick", "every": 1, "queue": queue}
        )
        assert added.status_code == 201, added.text
        first = int(datetime.fromisoformat(added.json()["entry"]["next_run"]).timestamp() * 1000)
        scheduled = {run_task_id("tick", Period(str(at), at)) for at in range(first, first + 600_000, 1000)}
        wait_for(lambda: len(sent_ids(lists, queue)) >= 2, 20, lambda: f"two runs; forwarder log: {log.read_text()}")
        assert set(sent_ids(lists, queue)) <= scheduled, "each run is its period's, uuid5(name, period)"

        paused = client.post("/api/v1/periodic/tick/pause", headers=AUTH, json={})
        assert paused.json()["state"] == "paused"
        # pause waits out a firing in progress (its rearm comes first): nothing more is on its way
        before_run = sent_ids(lists, queue)

        asked = web_store.clock()  # the clock ops stamps a request with
        assert client.post("/api/v1/periodic/tick/run", headers=AUTH, json={}).json()["pending_runs"] == 1
        answered = web_store.clock()
        wait_for(lambda: len(sent_ids(lists, queue)) > len(before_run), 10, "the manual run")
        manual = {Run(Period(str(ms), ms), MANUAL).task_id("tick") for ms in range(asked, answered + 1)}
        wait_for(lambda: entry(client, "tick")["pending_runs"] == 0, 10, "the firing to clear the request")
        shown = entry(client, "tick")
        assert (shown["state"], shown["next_run"]) == ("paused", None), "a run now leaves a paused entry paused"
        # three periods with the entry paused: nothing but the one manual run went out
        quiet_until = web_store.server_time_ms() + 3000
        wait_for(lambda: web_store.server_time_ms() >= quiet_until, 10, "three periods")
        after_run = sent_ids(lists, queue)
        assert after_run[: len(before_run)] == before_run and len(after_run) == len(before_run) + 1, after_run
        assert after_run[-1] in manual, "the run now's id is uuid5(name, manual:<request ms>)"

        # due at its next period (at most 1 s away): a forwarder may already hold it when the answer is read
        resumed = client.post("/api/v1/periodic/tick/resume", headers=AUTH, json={}).json()["state"]
        assert resumed in ("scheduled", "firing"), resumed
        wait_for(lambda: len(sent_ids(lists, queue)) > len(after_run), 10, "a scheduled run after the resume")
        assert sent_ids(lists, queue)[len(after_run)] in scheduled


def test_an_rq_entry_added_over_http_runs_under_a_real_worker_until_removed(
    client: TestClient, web_store: DelayStore, processes: Processes, prefix: str
) -> None:
    """``delayq forward --rq-redis`` writes each run as a job a real ``rq worker`` runs; a run
    now while paused runs once; after the removal nothing more runs."""
    queue, conn = f"{prefix}-rq", web_store.client
    processes.forwarder("--poll", "0.1")
    processes.worker(queue)
    body = {"name": "rq-tick", "kind": "rq", "func": f"{RQ_JOBS}.record", "args": ["tick"], "every": 1, "queue": queue}
    added = client.post("/api/v1/periodic", headers=AUTH, json=body)
    assert added.status_code == 201, added.text
    first = int(datetime.fromisoformat(added.json()["entry"]["next_run"]).timestamp() * 1000)
    scheduled = {run_task_id("rq-tick", Period(str(at), at)) for at in range(first, first + 600_000, 1000)}
    wait_for(lambda: len(runs(conn, queue)) >= 2, 30, "two runs of the entry under the worker")  # type: ignore[arg-type]
    assert {r["id"] for r in runs(conn, queue)} <= scheduled and {r["tag"] for r in runs(conn, queue)} == {"tick"}  # type: ignore[arg-type]

    assert client.post("/api/v1/periodic/rq-tick/pause", headers=AUTH, json={}).json()["state"] == "paused"
    asked = web_store.clock()
    assert client.post("/api/v1/periodic/rq-tick/run", headers=AUTH, json={}).status_code == 200
    answered = web_store.clock()
    manual = {Run(Period(str(ms), ms), MANUAL).task_id("rq-tick") for ms in range(asked, answered + 1)}
    wait_for(lambda: any(r["id"] in manual for r in runs(conn, queue)), 30, "the run now under the worker")  # type: ignore[arg-type]

    assert client.delete("/api/v1/periodic/rq-tick", headers=AUTH).json()["removed"] is True
    done = len(runs(conn, queue))  # type: ignore[arg-type]
    quiet_until = web_store.server_time_ms() + 3000  # three periods: a removed entry runs no more
    wait_for(lambda: web_store.server_time_ms() >= quiet_until, 10, "three periods")
    assert len(runs(conn, queue)) == done and ops.get(web_store, "rq-tick") is None  # type: ignore[arg-type]


# -- the dashboard, in a real browser -----------------------------------------------------------------


def test_the_dashboard_adds_pauses_runs_edits_backfills_and_removes_an_entry(
    page: Any,
    dashboard_factory: Callable[..., Any],
    web_store: DelayStore,
    prefix: str,
    broker: tuple[str, redis.Redis],
) -> None:
    url, lists = broker
    queue = f"{prefix}-beat"
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"nightly": {"task": "t.nightly", "schedule": 3600.0}}
    sync(app, web_store)
    dashboard = dashboard_factory("--celery-broker", url)
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    rows = page.locator("#periodic tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("code")

    page.click("#periodic-add")
    page.fill("#entry-name", "report")
    page.fill("#entry-task", "proj.report")
    page.fill("#entry-queue", queue)
    page.fill("#entry-schedule", "3600")
    page.fill("#entry-args", '[1, "a"]')
    page.fill("#entry-kwargs", '{"k": 2}')
    page.select_option("#entry-misfire", "run_all")
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved report (added).")
    row = page.locator("#periodic tbody tr", has_text="report")
    for text in ("celery", "runtime", "proj.report", "every 1:00:00", "run_all", "scheduled"):
        expect(row).to_contain_text(text)
    added = ops.get(web_store, "report")
    assert added is not None and (added.source, added.task, added.enabled) == ("runtime", "proj.report", True)

    row.locator("button[data-action=pause]").click()
    expect(row).to_contain_text("paused")
    expect(row.locator("button[data-action=resume]")).to_be_visible()
    assert ready_ms(web_store, "report") == MAX_MS
    expect(page.locator("#upcoming")).to_contain_text("never (a paused or finished entry)")

    row.locator("button[data-action=run]").click()
    expect(row).to_contain_text("1 run now pending")
    target = CeleryTarget.from_url(url)
    forwarder = Forwarder(web_store, [PeriodicTarget(target)])
    wait_for(lambda: forwarder.run_once() == 1, 10, "a forwarder to fire the entry")
    target.close()
    [sent] = [json.loads(raw) for raw in lists.lrange(queue, 0, -1)]
    assert sent["headers"]["task"] == "proj.report" and json.loads(base64.b64decode(sent["body"]))[:2] == [
        [1, "a"],
        {"k": 2},
    ], "the run reached the broker, with the form's arguments"
    expect(row).not_to_contain_text("pending")
    expect(row).to_contain_text("paused")  # a run now leaves it paused

    row.locator("button[data-action=edit]").click()
    expect(page.locator("#entry-task")).to_have_value("proj.report")
    expect(page.locator("#entry-args")).to_have_value('[1,"a"]')
    expect(page.locator("#entry-detach-box")).to_be_hidden()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-periodic.png"), full_page=True)
    page.select_option("#entry-schedule-kind", "cron")
    page.fill("#entry-schedule", "0 6 * * *")
    page.fill("#entry-tz", "Europe/Berlin")
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved report (changed).")
    expect(row).to_contain_text("crontab 0 6 * * * (Europe/Berlin)")
    expect(row).to_contain_text("paused")  # the form kept it as it was (enabled unticked)

    row.locator("button[data-action=resume]").click()
    expect(row).to_contain_text("scheduled")
    row.locator("button[data-action=backfill]").click()
    page.fill("#backfill-from", "2030-01-01T00:00:00")
    page.fill("#backfill-to", "2030-01-03T00:00:00")
    page.click("#backfill-run")
    expect(page.locator("#periodic-message")).to_have_text("Asked for a backfill of report.")
    assert stored_state(web_store, "report").backfill == ((1893456000000, 1893628800000),)  # UTC in this browser

    page.locator("#periodic tbody tr", has_text="nightly").locator("button[data-action=edit]").click()
    expect(page.locator("#entry-detach-box")).to_be_visible()  # an entry from code: detach to change it
    page.click("#entry-cancel")

    remove = row.locator("button[data-action=remove]")
    remove.click()
    expect(remove).to_have_text("Really remove?")
    remove.click()
    expect(page.locator("#periodic-message")).to_have_text("Removed report.")
    expect(rows).to_have_count(1)
    assert ops.get(web_store, "report") is None


def test_the_dashboards_edit_keeps_an_intervals_alignment_and_can_clear_it(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore, broker: tuple[str, redis.Redis]
) -> None:
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"rel": {"task": "t.rel", "schedule": 30.0, "relative": True}}
    sync(app, web_store)
    dashboard = dashboard_factory("--celery-broker", broker[0])
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    row = page.locator("#periodic tbody tr", has_text="rel")
    expect(row).to_contain_text("every 30s (aligned)")

    row.locator("button[data-action=edit]").click()
    expect(page.locator("#entry-aligned")).to_be_checked()
    page.fill("#entry-schedule", "60")
    page.check("#entry-detach")
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved rel (changed).")
    expect(row).to_contain_text("every 0:01:00 (aligned)")
    assert stored_state(web_store, "rel").schedule == Every(60_000, aligned=True)

    row.locator("button[data-action=edit]").click()
    page.uncheck("#entry-aligned")
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved rel (changed).")
    expect(row).to_contain_text("every 0:01:00")
    expect(row).not_to_contain_text("aligned")
    assert stored_state(web_store, "rel").schedule == Every(60_000, aligned=False)


def test_the_dashboard_acts_on_names_with_slashes_spaces_percent_and_unicode(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore
) -> None:
    names = ["reports/daily", "50% ünï/x history"]
    app = Celery("web", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {name: {"task": "t.n", "schedule": 3600.0} for name in names}
    sync(app, web_store)
    dashboard = dashboard_factory()
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")
    for name in names:
        row = page.locator("#periodic tbody tr", has=page.get_by_text(name, exact=True))
        row.locator("button[data-action=pause]").click()
        expect(page.locator("#periodic-message")).to_have_text(f"Paused {name}.")
        assert not stored_state(web_store, name).enabled
        row.locator("button[data-action=edit]").click()
        expect(page.locator("#entry-form-title")).to_have_text(f"Edit {name}")
        expect(page.locator("#entry-task")).to_have_value("t.n")
        page.click("#entry-cancel")


def test_an_entry_whose_item_is_garbage_is_named_not_a_500(client: TestClient, web_store: DelayStore) -> None:
    web_store.client.hset(check_registry(web_store), "junk", ops.item_id("junk"))
    web_store.schedule(ops.item_id("junk"), timedelta(hours=1), Envelope("list", "k", b"not an entry"))
    [listed] = client.get("/api/v1/periodic", headers=AUTH).json()["entries"]
    assert listed["state"].startswith("unreadable") and listed["kind"] is None
    shown = entry(client, "junk")
    assert shown["definition"] is None and shown["state"].startswith("unreadable")
    paused = client.post("/api/v1/periodic/junk/pause", headers=AUTH, json={})
    assert paused.status_code == 400 and "delayq cancel periodic:junk" in paused.json()["detail"], paused.text
    assert client.delete("/api/v1/periodic/junk", headers=AUTH).json()["removed"] is True, "removing it is the fix"


def test_nan_in_an_entrys_arguments_is_refused(client: TestClient, web_store: DelayStore) -> None:
    raw = b'{"name": "n", "task": "t", "every": 1, "kwargs": {"x": NaN}}'
    response = client.post("/api/v1/periodic", headers={**AUTH, "Content-Type": "application/json"}, content=raw)
    assert response.status_code == 422 and "NaN and Infinity are not JSON" in response.json()["detail"], response.text
    assert ops.get(web_store, "n") is None
