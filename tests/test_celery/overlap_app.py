"""``celery -A tests.test_celery.overlap_app``: the tests' app with the entries of
:mod:`tests.test_celery.overlap_entries`, one per overlap policy."""

from tests.test_celery.overlap_entries import beat_schedule
from tests.test_celery.tasks import app_from_env

app = app_from_env()
app.conf.beat_schedule = beat_schedule()
