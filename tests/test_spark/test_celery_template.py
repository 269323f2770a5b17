"""``TaskTemplate`` fills one message Celery built; the result must equal Celery's own, byte for byte."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from celery import Celery

from delayq_backends.celery.message import StoredMessage
from delayq_backends.celery.template import TaskTemplate
from delayq_backends.errors import ConfigError
from delayq_backends.timeutil import from_ms

pytestmark = pytest.mark.spark

TASK = "dqt.remind"


class Capture:
    def publish(self, body: Any, **kwargs: Any) -> None:
        self.body, self.kwargs = body, kwargs


def celerys_own(app: Celery, task_id: str, ready_ms: int, args: Any, kwargs: Any, **options: Any) -> bytes:
    """The envelope the plugin would store: Celery's builder and sender for this one call, captured."""
    message = app.amqp.as_task_v2(
        task_id, TASK, args=args, kwargs=kwargs, eta=from_ms(ready_ms), reply_to=app.thread_oid, ignore_result=None
    )
    capture = Capture()
    app.amqp.send_task_message(capture, TASK, message, **app.amqp.router.route(dict(options), TASK))
    return StoredMessage.capture(capture.body, capture.kwargs).to_envelope().encode()


def text(rng: random.Random) -> str:
    return "".join(rng.choice("ab'\"\\é\n\t😀 x{}") for _ in range(rng.randint(0, 40)))


def value(rng: random.Random) -> Any:
    return rng.choice([rng.randint(-(10**20), 10**20), text(rng), None, True, 1.5, [1, text(rng)], {"k": text(rng)}])


@pytest.mark.parametrize(
    "config, options",
    [
        ({"task_default_queue": "default"}, {}),
        ({}, {"queue": "q1", "priority": 7, "headers": {"x_custom": "h"}}),
        ({"task_routes": {TASK: {"queue": "routed"}}, "task_compression": "gzip"}, {}),
    ],
)
def test_envelopes_equal_celerys_own_for_any_values(config: dict[str, Any], options: dict[str, Any]) -> None:
    app = Celery("dqt-template", set_as_current=False)
    app.conf.update(broker_url="redis://127.0.0.1:1/0", **config)
    template = TaskTemplate(app, TASK, **options)
    rng = random.Random(5)
    for n in range(300):
        task_id = str(uuid.uuid4()) if n % 3 else text(rng) or "x"
        args = [value(rng) for _ in range(rng.randint(0, 4))]
        kwargs = {text(rng): value(rng) for _ in range(rng.randint(0, 3))}
        ready = 1_700_000_000_000 + rng.randint(0, 10**10)
        ours = template.envelope(task_id, ready, args, kwargs)
        assert ours == celerys_own(app, task_id, ready, args, kwargs, **options), (task_id, args, kwargs)


def test_other_serializers_are_refused() -> None:
    app = Celery("dqt-template", set_as_current=False)
    app.conf.update(broker_url="redis://127.0.0.1:1/0", task_serializer="pickle")
    with pytest.raises(ConfigError, match="serializer"):
        TaskTemplate(app, TASK)
