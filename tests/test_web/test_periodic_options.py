"""Periodic entries' run options over HTTP and in the dashboard's form: the same fields as the
CLI's flags, all three generated from ``periodic/options.py``'s one table (``OPTION_FIELDS``);
set with ``POST /api/v1/periodic``, read back in the entry's definition; an option of the other
kind, or a callback outside the RQ allowlist, refused with nothing stored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect

from delayq_backends import DelayStore
from delayq_backends.cli import main
from delayq_backends.periodic import ops
from delayq_backends.periodic.options import OPTION_FIELDS
from tests.test_web.conftest import AUTH, RQ_JOBS, TOKEN
from tests.test_web.test_dashboard import TIMEOUT_MS

CELERY = {"name": "opt", "task": "t.tick", "every": 30}
RQ = {"name": "rq-opt", "kind": "rq", "func": f"{RQ_JOBS}.record", "every": 30, "queue": "jobs"}


def post(client: TestClient, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/periodic", headers=AUTH, json=body)


def definition(client: TestClient, name: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/periodic/{name}", headers=AUTH)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["definition"]
    return found


def test_the_cli_the_api_and_the_form_take_the_same_options(client: TestClient) -> None:
    flags = {opt for param in main.commands["periodic"].commands["add"].params for opt in param.opts}  # type: ignore[attr-defined]
    schema = client.get("/api/v1/openapi.json", headers=AUTH).json()["components"]["schemas"]["EntryIn"]["properties"]
    page = client.get("/").text
    for f in OPTION_FIELDS:
        assert f.flag in flags, f"the CLI lacks {f.flag}"
        assert f.name in schema and f.help in schema[f.name]["description"], f"the API lacks {f.name}"
        assert f'data-option="{f.name}" data-value="{f.value}"' in page, f"the form lacks {f.name}"
        assert f'class="run-option" data-kind="{f.kind}"' in page


def test_celery_options_are_set_and_read_back(client: TestClient, web_store: DelayStore) -> None:
    options = {"expires": 30, "priority": 5, "headers": {"team": "ops"}, "exchange": "ex", "routing_key": "rk"}
    assert post(client, {**CELERY, **options}).status_code == 201
    assert definition(client, "opt")["options"] == {**options, "expires": 30.0}
    at = {"expires": "2030-01-31T09:00:00+00:00"}
    changed = post(client, {**CELERY, **at})
    assert changed.status_code == 200 and changed.json()["result"] == "changed"
    assert definition(client, "opt")["options"] == at
    assert post(client, {**CELERY, **at}).json()["result"] == "unchanged"
    assert post(client, CELERY).json()["result"] == "changed"  # left out: not set any more
    assert definition(client, "opt")["options"] == {}


def test_rq_options_are_set_and_read_back(client: TestClient, web_store: DelayStore) -> None:
    options = {
        "timeout": 60, "result_ttl": 600, "ttl": 30, "failure_ttl": 3600, "meta": {"owner": "ops"}, "retry_max": 3,
        "retry_intervals": [5, 10, 20], "on_success": f"{RQ_JOBS}.on_success", "on_failure": f"{RQ_JOBS}.on_failure",
    }  # fmt: skip
    added = post(client, {**RQ, **options})
    assert added.status_code == 201, added.text
    assert definition(client, "rq-opt")["options"] == options
    status = ops.get(web_store, "rq-opt")
    assert status is not None and status.options == options


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({**CELERY, "timeout": 5}, "timeout is an option of rq entries, not celery ones"),
        ({**RQ, "priority": 5}, "priority is an option of celery entries, not rq ones"),
        ({**CELERY, "priority": 256}, "less than or equal to 255"),
        ({**CELERY, "expires": "tomorrow"}, "expires"),
        ({**CELERY, "headers": None}, "null is not allowed here"),
        ({**RQ, "retry_intervals": [5]}, "retry_intervals need retry_max"),
        ({**RQ, "on_success": "not a path"}, "on_success"),
    ],
)
def test_a_bad_option_is_a_422_and_stores_nothing(
    client: TestClient, web_store: DelayStore, body: dict[str, Any], says: str
) -> None:
    response = post(client, body)
    assert response.status_code == 422 and says in response.text, response.text
    assert ops.get(web_store, body["name"]) is None


def test_a_callback_outside_the_allowlist_is_refused(client: TestClient, web_store: DelayStore) -> None:
    response = post(client, {**RQ, "on_failure": "os.system"})
    assert response.status_code == 403, response.text
    assert ops.get(web_store, "rq-opt") is None


def test_the_docs_table_lists_every_option_as_the_definition_has_it() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "celery-periodic.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `--") and " / `" in line]
    listed = [(line.split("`")[1], line.split("`")[3], line.split("|")[2].strip()) for line in rows]
    assert listed == [(f.flag, f.name, f.kind) for f in OPTION_FIELDS]


def test_the_dashboard_form_sets_shows_and_edits_an_entrys_run_options(
    page: Any, dashboard_factory: Callable[..., Any], web_store: DelayStore, valkey_url: str
) -> None:
    dashboard = dashboard_factory("--rq-redis", valkey_url, "--rq-allow", RQ_JOBS)
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(dashboard.base + "/")
    page.fill("#token", TOKEN)
    page.click("#connect")

    page.click("#periodic-add")
    expect(page.locator("#entry-option-timeout")).to_be_hidden()  # a Celery entry: RQ's options hidden
    page.fill("#entry-name", "opt")
    page.fill("#entry-task", "proj.report")
    page.fill("#entry-schedule", "3600")
    page.fill("#entry-option-expires", "30")
    page.fill("#entry-option-priority", "5")
    page.fill("#entry-option-headers", '{"team": "ops"}')
    page.fill("#entry-option-routing_key", "rk")
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved opt (added).")
    status = ops.get(web_store, "opt")
    assert status is not None
    assert status.options == {"expires": 30.0, "priority": 5, "headers": {"team": "ops"}, "routing_key": "rk"}

    page.locator("#periodic tbody tr", has_text="opt").locator("button[data-action=edit]").click()
    expect(page.locator("#entry-option-expires")).to_have_value("30")
    expect(page.locator("#entry-option-headers")).to_have_value('{"team":"ops"}')
    page.fill("#entry-option-priority", "")  # cleared: no longer set
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved opt (changed).")
    status = ops.get(web_store, "opt")
    assert status is not None and "priority" not in status.options and status.options["routing_key"] == "rk"

    page.click("#periodic-add")
    page.fill("#entry-name", "rq-opt")
    page.select_option("#entry-kind", "rq")
    expect(page.locator("#entry-option-priority")).to_be_hidden()
    page.fill("#entry-task", f"{RQ_JOBS}.record")
    page.fill("#entry-queue", "jobs")
    page.fill("#entry-schedule", "3600")
    page.fill("#entry-option-timeout", "60")
    page.fill("#entry-option-retry_max", "3")
    page.fill("#entry-option-retry_intervals", "5,10")
    page.fill("#entry-option-meta", '{"owner": "ops"}')
    page.click("#entry-save")
    expect(page.locator("#periodic-message")).to_have_text("Saved rq-opt (added).")
    rq_status = ops.get(web_store, "rq-opt")
    assert rq_status is not None
    assert rq_status.options == {"timeout": 60, "retry_max": 3, "retry_intervals": [5, 10], "meta": {"owner": "ops"}}
