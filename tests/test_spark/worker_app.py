"""``celery -A tests.test_spark.worker_app``: the Celery tests' app, recording task starts to the
audit log of ``DELAYQ_AUDIT_DIR``."""

from delayq_backends.celery.audit import record_executions
from tests.test_celery.tasks import app_from_env

app = app_from_env()
record_executions()
