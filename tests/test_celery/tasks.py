"""The Celery app of the tests: one factory for the test process and the worker subprocesses.

Every task records its execution (id, args, kwargs, start time, eta, priority, custom headers,
retries) as a JSON line on a Redis list, the *sink*, which the tests read.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from delayq_backends.celery import install

QUEUE_ENV = "DQT_QUEUE"


def make_app(
    *,
    broker: str,
    store: str,
    prefix: str,
    queue: str,
    sink: str,
    backend: str,
    records: str,
    transport_options: dict[str, Any] | None = None,
    dedupe: bool = False,
    acks_late: bool = False,
    conf: dict[str, Any] | None = None,
) -> Celery:
    """An app with the plugin installed; every task records to the list ``sink`` on the Redis at
    ``records`` (kept apart from the store and the broker, which fault tests restart); ``conf``:
    more settings (``task_acks_late``, ``delayq_slot_hold``)."""
    app = Celery("dqt")
    app.conf.update(
        broker_url=broker,
        result_backend=backend,
        delayq_url=store,
        delayq_prefix=prefix,
        delayq_shards=4,
        task_default_queue=queue,
        task_queue_max_priority=10,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        result_expires=600,
        broker_transport_options=transport_options or {},
        # Celery's prefetch reduction after a reconnect can leave a worker connected but idle
        # when the broker restarts with a task in flight (celery#9512 and kin); the chaos run
        # restarts RabbitMQ, and a stalled worker is Celery's fault, not a lost job
        worker_enable_prefetch_count_reduction=False,
    )
    if dedupe:
        app.conf.delayq_dedupe = True
    if acks_late:
        app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True)
    app.conf.update(conf or {})
    install(app)
    out = redis.Redis.from_url(records)

    def record(request: Any, tag: str, **extra: Any) -> None:
        out.rpush(
            sink,
            json.dumps(
                {
                    "id": request.id,
                    "tag": tag,
                    "args": list(request.args or ()),
                    "kwargs": dict(request.kwargs or {}),
                    "started_ms": time.time_ns() // 1_000_000,
                    "eta": request.eta,
                    "priority": (request.delivery_info or {}).get("priority"),
                    "exchange": (request.delivery_info or {}).get("exchange"),
                    "routing_key": (request.delivery_info or {}).get("routing_key"),
                    "expires": request.expires,
                    "custom": getattr(request, "x_custom", None),
                    # a periodic entry's run: its entry, period and kind (header ``delayq_periodic``)
                    "periodic": getattr(request, "delayq_periodic", None),
                    "retries": request.retries,
                    **extra,
                }
            ),
        )

    @app.task(bind=True, shared=False, name="dqt.record")
    def record_task(self: Any, tag: str, *args: Any, **kwargs: Any) -> str:
        group = getattr(self.request, "delayq_group", None)  # what the worker holds its groups by
        record(self.request, tag, **({} if group is None else {"group": group}))
        return tag

    @app.task(bind=True, shared=False, name="dqt.throttles")
    def throttles(self: Any, tag: str, group: str, seconds: float) -> str:
        # one of the task's groups told "429": throttled from inside the task, with its token
        from delayq_backends.celery import throttle

        throttle(group, retry_after=seconds)
        record(self.request, tag)
        return tag

    @app.task(bind=True, shared=False, name="dqt.step")
    def step(self: Any, previous: Any, tag: str) -> list[Any]:
        record(self.request, tag, previous=previous)
        return [*(previous or []), tag]

    @app.task(bind=True, shared=False, name="dqt.fail")
    def fail(self: Any, tag: str) -> None:
        record(self.request, tag)
        raise ValueError(f"{tag} fails on purpose")

    @app.task(bind=True, shared=False, name="dqt.on_error")
    def on_error(self: Any, failed_id: str, tag: str) -> None:
        # a bound errback is called old-style, as a task with the failed task's id
        record(self.request, tag, failed=failed_id)

    @app.task(bind=True, shared=False, name="dqt.flaky", max_retries=5)
    def flaky(self: Any, tag: str, failures: int, countdown: float) -> str:
        record(self.request, tag, slot=getattr(self.request, "delayq_slot", None))
        if self.request.retries < failures:
            raise self.retry(countdown=countdown)
        return tag

    @app.task(bind=True, shared=False, name="dqt.hold")
    def hold(self: Any, tag: str, seconds: float) -> str:
        # the task's own start-end interval: the slot tests compute the overlap of these
        began = time.time_ns() // 1_000_000
        time.sleep(seconds)
        record(self.request, tag, began_ms=began, ended_ms=time.time_ns() // 1_000_000)
        return tag

    @app.task(bind=True, shared=False, name="dqt.stall")
    def stall(self: Any, tag: str, seconds: float) -> str:
        # records each start; the first start of a task id runs ``seconds``, a later one (the task
        # given back after its worker was killed) returns at once
        first = out.incr(f"{sink}:starts:{self.request.id}") == 1
        record(self.request, tag, first=first)
        if first:
            time.sleep(seconds)
        return tag

    @app.task(bind=True, shared=False, name="dqt.batch_done")
    def batch_done(self: Any, summary: dict[str, Any], tag: str) -> None:
        # a batch's on_complete: the summary comes first, as a chord's callback gets its results
        record(self.request, tag, summary=summary)

    @app.task(bind=True, shared=False, name="dqt.span")
    def span(self: Any, tag: str, seconds: float) -> str:
        # a record at the start too, with the pool process: a task killed mid-run leaves its start
        pid = os.getpid()
        record(self.request, tag, phase="began", at_ms=time.time_ns() // 1_000_000, pid=pid)
        time.sleep(seconds)
        record(self.request, tag, phase="ended", at_ms=time.time_ns() // 1_000_000, pid=pid)
        return tag

    @app.task(bind=True, shared=False, name="dqt.throttle")
    def throttling(self: Any, tag: str, group: str, seconds: float) -> None:
        # delayq_backends.celery.throttle from inside the task: its outcome recorded
        from delayq_backends.celery import throttle
        from delayq_backends.errors import DelayqError

        try:
            throttle(group, retry_after=seconds)
            outcome = "throttled"
        except DelayqError as exc:
            outcome = f"refused: {exc}"
        record(self.request, tag, outcome=outcome, at_ms=time.time_ns() // 1_000_000)

    @app.task(bind=True, shared=False, name="dqt.ping")
    def ping(self: Any) -> str:
        out.rpush(f"{sink}:ready", "ok")
        return "pong"

    return app


def app_from_env() -> Celery:
    """The worker subprocess's app: the same factory, configured through ``DQT_*`` variables."""
    env = os.environ
    return make_app(
        broker=env["DQT_BROKER"],
        store=env["DQT_STORE"],
        prefix=env["DQT_PREFIX"],
        queue=env[QUEUE_ENV],
        sink=env["DQT_SINK"],
        backend=env["DQT_BACKEND"],
        records=env["DQT_RECORDS"],
        transport_options=json.loads(env.get("DQT_TRANSPORT_OPTIONS", "{}")),
        dedupe=env.get("DQT_DEDUPE") == "1",
        acks_late=env.get("DQT_ACKS_LATE") == "1",
        conf=json.loads(env.get("DQT_CONF", "{}")),
    )
