"""The example's Celery app: one task, and task starts recorded to the audit log.

Workers run it with ``celery -A reminders worker``; ``DELAYQ_AUDIT_DIR`` says where the records go.
"""

import os

import redis
from celery import Celery

from delayq_backends.celery.audit import record_executions

app = Celery("reminders")
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/1"),
    task_default_queue="reminders",
    worker_hijack_root_logger=False,
)
record_executions()  # DELAYQ_AUDIT_DIR or DELAYQ_AUDIT_STREAM; nothing if neither is set
sent = redis.Redis.from_url(os.environ.get("DELAYQ_URL", "redis://127.0.0.1:6379/0"))


@app.task(name="reminders.send")
def send(user: int, text: str) -> None:
    """Stands in for an e-mail: counts the reminders sent."""
    sent.incr("reminders:sent")
