"""``celery -A tests.test_celery.history_app``: the tests' app with two every-second entries,
``tick`` (``dqt.record``, succeeds) and ``boom`` (``dqt.fail``, fails), misfire policy
``run_once`` (periods missed while no forwarder ran are counted, one run sent)."""

from tests.test_celery.tasks import app_from_env

app = app_from_env()
app.conf.beat_schedule = {
    name: {"task": task, "schedule": 1.0, "args": [name], "options": {"delayq_misfire": "run_once"}}
    for name, task in (("tick", "dqt.record"), ("boom", "dqt.fail"))
}
