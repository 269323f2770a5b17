"""The system RabbitMQ the Celery tests and benches use, and whether it answers."""

from __future__ import annotations

import os

from kombu import Connection

__all__ = ["AMQP_URL", "amqp_problem"]

AMQP_URL = os.environ.get("DELAYQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def amqp_problem(url: str) -> str | None:
    """Why the broker at ``url`` cannot be used, or None when it answers."""
    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=3)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
