"""Seeing what waits: ``celery -A proj delayq list|get`` and the dashboard's item view show a
Celery task's name, args, kwargs (JSON bodies only, never unpickled), eta, queue and priority.

A real worker and forwarder run on each broker (``celery_env``); the tasks here wait an hour.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from celery import Celery
from fastapi.testclient import TestClient

from delayq_backends.celery import StoredMessage, forget_store, store_for
from delayq_backends.celery.periodic import sync
from delayq_backends.cli.celery import _all_task_rows
from delayq_backends.envelope import Envelope
from delayq_backends.periodic.ops import item_id, remove
from delayq_backends.web import create_app
from tests.test_celery.harness import CeleryEnv, delayq_cli


def test_list_and_get_show_the_task_as_sent(celery_env: CeleryEnv, app: Celery) -> None:
    tag = uuid.uuid4().hex[:6]
    sent = app.send_task("dqt.record", args=[tag, 1, "ü"], kwargs={"k": [1.5, None]}, countdown=3600, priority=7)
    pickled = app.send_task("dqt.record", args=[tag, {1, 2}], countdown=3601, serializer="pickle")

    got = delayq_cli(celery_env, "get", sent.id, "--json")
    assert got.returncode == 0, got.stderr
    task = json.loads(got.stdout)
    assert (task["task"], task["args"], task["kwargs"]) == ("dqt.record", [tag, 1, "ü"], {"k": [1.5, None]})
    assert (task["queue"], task["priority"]) == (celery_env.queue, 7)
    assert task["eta"] == sent_eta(app, sent.id) and task["note"] is None

    other = json.loads(delayq_cli(celery_env, "get", pickled.id, "--json").stdout)
    assert other["args"] is None and other["content_type"] == "application/x-python-serialize"
    assert other["argsrepr"] == f"['{tag}', {{1, 2}}]" and "not decoded" in other["note"]

    listed = delayq_cli(celery_env, "list", "--limit", "10000", "--json")
    assert listed.returncode == 0, listed.stderr
    mine = {row["id"]: row for row in json.loads(listed.stdout) if row["id"] in (sent.id, pickled.id)}
    assert mine[sent.id]["args"] == [tag, 1, "ü"] and mine[pickled.id]["args"] is None

    table = delayq_cli(celery_env, "list", "--limit", "10000")
    assert table.returncode == 0 and sent.id[:8] in table.stdout and "dqt.record" in table.stdout

    missing = delayq_cli(celery_env, "get", "no-such-task")
    assert missing.returncode == 1 and "not waiting" in missing.stderr

    why = delayq_cli(celery_env, "why", sent.id)
    assert why.returncode == 0 and why.stdout == f"{sent.id}: {store_for(app).why(sent.id).line}\n", why
    assert why.stdout.startswith(f"{sent.id}: not due until ")
    assert json.loads(delayq_cli(celery_env, "why", sent.id, "--json").stdout)["state"] == "scheduled"
    assert delayq_cli(celery_env, "why", "no-such-task").returncode == 1


def test_list_and_get_show_a_periodic_entry_as_its_next_run(celery_env: CeleryEnv) -> None:
    # a prefix of its own: the env's forwarder syncs its (empty) beat_schedule at start, which
    # would remove this entry from the env's store
    env = replace(celery_env, prefix=f"{celery_env.prefix}p")
    app = env.app()
    name = f"hourly-{uuid.uuid4().hex[:6]}"
    app.conf.beat_schedule = {name: {"task": "dqt.record", "schedule": 3600.0, "args": [name], "kwargs": {"n": 1}}}
    try:
        assert sync(app).added == [name]
        got = delayq_cli(env, "get", item_id(name), "--json")
        assert got.returncode == 0, got.stderr
        task = json.loads(got.stdout)
        assert (task["task"], task["args"], task["kwargs"]) == ("dqt.record", [name], {"n": 1})
        assert (task["queue"], task["periodic"], task["id"]) == (env.queue, name, item_id(name))
        assert f"periodic: {name}" in delayq_cli(env, "get", item_id(name)).stdout
        listed = json.loads(delayq_cli(env, "list", "--json").stdout)
        assert [(row["id"], row["periodic"]) for row in listed] == [(item_id(name), name)]
    finally:
        remove(store_for(app), [name], force=True)
        forget_store(app)


def test_dashboard_item_view_has_the_task(celery_env: CeleryEnv, app: Celery) -> None:
    sent = app.send_task("dqt.record", args=["web"], kwargs={"x": 1}, countdown=3600, queue=celery_env.queue)
    with TestClient(create_app(store_for(app), token=None), base_url="http://127.0.0.1") as client:
        item = client.get("/api/v1/item", params={"id": sent.id}).json()
    task = item["task"]
    assert (task["task"], task["args"], task["kwargs"], task["queue"]) == (
        "dqt.record",
        ["web"],
        {"x": 1},
        celery_env.queue,
    )
    assert task["priority"] is None and task["eta"] == sent_eta(app, sent.id)


def sent_eta(app: Celery, task_id: str) -> str:
    item = store_for(app).get(task_id)
    assert item is not None
    return str(StoredMessage.from_envelope(Envelope.decode(item.envelope)).headers["eta"])


def test_list_task_filters_the_whole_store_and_pages_through_its_matches(celery_env: CeleryEnv, app: Celery) -> None:
    """Issue 22: --task filtered only the page read, so tasks behind others were never listed."""
    tag = uuid.uuid4().hex[:6]
    name = f"dqt.listed-{tag}"
    eta = datetime.now(timezone.utc) + timedelta(hours=2)
    for n in range(5):  # earlier than ours: they fill the first page of the store
        app.send_task("dqt.record", args=[f"{tag}-{n}"], countdown=3000)
    ours = [app.send_task(name, args=[n], eta=eta).id for n in range(3)]  # one eta: ties in score
    first = delayq_cli(celery_env, "list", "--task", name, "--limit", "2", "--json")
    assert first.returncode == 0, first.stderr
    rest = delayq_cli(celery_env, "list", "--task", name, "--limit", "2", "--offset", "2", "--json")
    shown = [row["id"] for row in json.loads(first.stdout) + json.loads(rest.stdout)]
    assert sorted(shown) == sorted(ours) and len(set(shown)) == 3
    table = delayq_cli(celery_env, "list", "--task", name, "--limit", "2")
    assert table.returncode == 0 and "more may follow: --offset 2" in table.stderr
    assert ours[0][:8] in table.stdout or ours[1][:8] in table.stdout
    walked = [row["id"] for row in _all_task_rows(store_for(app), page=2) if row["task"] == name]
    assert sorted(walked) == sorted(ours) and len(walked) == 3, "small pages lose or repeat no tie"
