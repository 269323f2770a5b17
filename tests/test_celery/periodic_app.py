"""``celery -A tests.test_celery.periodic_app``: the tests' app with a ``beat_schedule`` of one
entry, ``tick``, that runs ``dqt.record("tick")`` every ``DQT_EVERY`` seconds (misfire policy
``DQT_MISFIRE``, default run_all)."""

import os

from tests.test_celery.tasks import app_from_env

app = app_from_env()
app.conf.beat_schedule = {
    "tick": {
        "task": "dqt.record",
        "schedule": float(os.environ.get("DQT_EVERY", "2")),
        "args": ["tick"],
        "options": {"delayq_misfire": os.environ.get("DQT_MISFIRE", "run_all")},
    }
}
