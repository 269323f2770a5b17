"""The example's Celery app: an ordinary app plus one line, ``install(app)``."""

import os

from celery import Celery

from delayq_backends.celery import install

app = Celery("proj", include=["proj.tasks"])
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    # Where delayed tasks wait until they are due (defaults to the broker URL when that is Redis).
    delayq_url=os.environ.get("DELAYQ_URL", "redis://127.0.0.1:6379/0"),
    delayq_prefix=os.environ.get("DELAYQ_PREFIX", "delayq"),
)
install(app)
