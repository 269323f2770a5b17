"""``GET /api/v1/periodic/{name}/history``: an entry's runs and counters, behind the same token as
every route; a name with neither a registration nor history is a 404 naming the entry list."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from delayq_backends import DelayStore
from delayq_backends.keys import periodic_key
from delayq_backends.periodic.history import RunMark, record_finished, record_published, record_started
from tests.test_web.conftest import AUTH

DUE = 1_800_000_000_000


def test_an_entrys_runs_newest_first_with_its_counters(client: TestClient, web_store: DelayStore) -> None:
    web_store.clock = lambda: DUE + 2500
    for i, outcome in enumerate(("success", "failure")):
        mark = RunMark("nightly/report", DUE + i * 1000)
        record_published(web_store, mark, f"r{i}", missed=i)
        record_started(web_store, mark, f"r{i}")
        record_finished(web_store, mark, f"r{i}", outcome)
    answer = client.get("/api/v1/periodic/nightly/report/history", headers=AUTH)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [(r["run_id"], r["outcome"]) for r in body["runs"]] == [("r1", "failure"), ("r0", "success")]
    assert (body["missed"], body["late"], body["last_success_age_ms"]) == (1, 2, 0)
    assert body["runs"][1] == {
        "run_id": "r0", "kind": "scheduled", "due": "2027-01-15T08:00:00.000Z", "published": "2027-01-15T08:00:02.500Z",
        "lateness_ms": 2500, "started": "2027-01-15T08:00:02.500Z", "finished": "2027-01-15T08:00:02.500Z",
        "outcome": "success",
    }  # fmt: skip
    assert len(client.get("/api/v1/periodic/nightly/report/history?limit=1", headers=AUTH).json()["runs"]) == 1


def test_a_registered_entry_without_runs_is_empty_an_unknown_one_a_404(
    client: TestClient, web_store: DelayStore
) -> None:
    web_store.client.hset(periodic_key(web_store.config.prefix), "fresh", "periodic:fresh")
    body = client.get("/api/v1/periodic/fresh/history", headers=AUTH).json()
    assert body["runs"] == [] and body["last_success"] is None
    missing = client.get("/api/v1/periodic/nope/history", headers=AUTH)
    assert missing.status_code == 404 and "no periodic entry 'nope'" in missing.json()["detail"]  # as every 404
    too_long = client.get(f"/api/v1/periodic/{'x' * 510}/history", headers=AUTH)
    assert too_long.status_code == 400 and "entry name" in too_long.json()["detail"]


def test_the_history_needs_the_token(app: FastAPI) -> None:
    with TestClient(app) as anonymous:
        assert anonymous.get("/api/v1/periodic/x/history").status_code == 401
