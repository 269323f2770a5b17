"""``celery -A tests.test_celery.worker_app`` loads the tests' app from ``DQT_*`` variables."""

from tests.test_celery.tasks import app_from_env

app = app_from_env()
