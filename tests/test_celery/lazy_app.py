"""``celery -A tests.test_celery.lazy_app``: the tests' app with one entry, ``lazy``, that runs
``dqt.record("lazy", at=<time.time() when the forwarder sends the run>)`` every second."""

import time

from celery.beat import BeatLazyFunc

from tests.test_celery.tasks import app_from_env

app = app_from_env()
app.conf.beat_schedule = {
    "lazy": {
        "task": "dqt.record",
        "schedule": 1.0,
        "args": ["lazy"],
        "kwargs": {"at": BeatLazyFunc(time.time)},
        "options": {"delayq_misfire": "run_all"},
    }
}
