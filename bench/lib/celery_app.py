"""``celery -A lib.celery_app`` loads the benches' Celery app from ``DQB_*`` variables (set by
:class:`lib.celery_run.CeleryRun`)."""

from __future__ import annotations

import json
import os

from .celery_run import make_app

env = os.environ
app = make_app(
    broker=env["DQB_BROKER"],
    store=env["DQB_STORE"],
    prefix=env["DQB_PREFIX"],
    queue=env["DQB_QUEUE"],
    sink=env["DQB_SINK"],
    backend=env["DQB_BACKEND"],
    records=env["DQB_RECORDS"],
    transport_options=json.loads(env.get("DQB_TRANSPORT_OPTIONS", "{}")),
    dedupe=env.get("DQB_DEDUPE") == "1",
)
