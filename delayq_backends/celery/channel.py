"""The Celery target's hold on its broker: one connection, the producer on its channel (in
confirm mode on AMQP), the Redis hand-off on that channel, and a probe connection of its own for
queue depths; each dropped and made again after a channel error or an outage (see :mod:`.target`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from amqp import Channel as AmqpChannel
from kombu import exceptions as kombu_errors
from kombu.connection import Connection
from kombu.exceptions import OperationalError
from kombu.messaging import Producer

from ..outages import gives_back
from .confirms import Confirms
from .redis_handoff import RedisHandOff

__all__ = ["BrokerChannel", "streaming"]

log = logging.getLogger("delayq.celery")

#: kombu >= 5.7 raises this when a pipelined batch fails midway ("delivery is uncertain"): an
#: outage, so the batch is released and re-sent (at-least-once), never counted as a failure.
_UNCERTAIN: tuple[type[BaseException], ...] = tuple(
    e for e in [getattr(kombu_errors, "BatchPublishError", None)] if isinstance(e, type)
)

M = TypeVar("M")


class BrokerChannel(Generic[M]):
    """The connection and producer channel a target publishes on, made when first asked for.

    Args:
        connect: makes a kombu :class:`~kombu.Connection` to the broker; called again after an outage.
        max_watch_retries: the Redis hand-off's retries (:class:`.redis_handoff.RedisHandOff`).
    """

    def __init__(self, connect: Callable[[], Connection], max_watch_retries: int) -> None:
        self._connect = connect
        self.max_watch_retries = max_watch_retries
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        #: on AMQP: the producer's channel's confirms of messages ``M`` (else None)
        self.confirms: Confirms[M] | None = None
        #: on AMQP: the exchanges found on this connection
        self.exchanges: set[str] = set()
        self._handoff: RedisHandOff | None = None
        self._probe: Connection | None = None  # its own, so a probe error never drops a publish

    def connection(self) -> Connection:
        if self._connection is None:
            self._connection = self._connect()
        return self._connection

    def producer(self) -> Producer:
        if self._producer is None:
            conn = self.connection()
            # fail fast: the forwarder backs off and releases, it must not sit in kombu's retries
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
            channel = conn.channel()
            self._producer = Producer(channel, auto_declare=False)
            self.confirms = Confirms(channel) if isinstance(channel, AmqpChannel) else None
        return self._producer

    def renew(self) -> None:
        """Drop the producer's channel after a channel error; the next publish opens another on
        the same connection. (py-amqp reopens a channel the broker closed, without confirm mode.)"""
        channel = None if self._producer is None else self._producer.channel
        self._producer, self.confirms, self._handoff = None, None, None
        try:
            if channel is not None:
                channel.close()
        except Exception:  # the connection broke too: the next publish finds out
            log.debug("closing a refused channel failed", exc_info=True)

    def handoff(self) -> RedisHandOff | None:
        """The exactly-once hand-off on this target's channel, or None if the broker is not
        kombu's Redis transport (with kombu >= 5.7's publish hook)."""
        if self._handoff is None:
            channel = self.producer().channel
            self._handoff = RedisHandOff.for_channel(channel, max_watch_retries=self.max_watch_retries)
        return self._handoff

    def is_outage(self, exc: BaseException) -> bool:
        """A broker out of reach or refusing for now (overload, a memory alarm), or a configuration
        error (a refused login, a missing transport module): release, not fail. Asked before the
        connection's own error classes, which a missing transport module cannot give."""
        return gives_back(exc) or isinstance(exc, self._connection_errors())

    def _connection_errors(self) -> tuple[type[BaseException], ...]:
        conn = self.connection()
        return (*conn.connection_errors, *conn.recoverable_connection_errors, OperationalError, OSError, *_UNCERTAIN)

    def channel_errors(self) -> tuple[type[BaseException], ...]:
        conn = self.connection()
        refused = tuple(conn.channel_errors)
        return tuple(e for e in refused if not issubclass(e, self._connection_errors()))

    def depth(self, queue: str) -> int:
        """Messages ready in ``queue`` on the broker, by a passive declare (it never creates the queue).

        On AMQP that is RabbitMQ's ``message_count``; on kombu's Redis transport kombu answers
        with the LLEN of the queue's list and its priority sub-lists, so kombu's key naming stays
        kombu's business. A queue that does not exist yet holds nothing: 0.
        """
        if self._probe is None:
            self._probe = self._connect()
            self._probe.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
        probe = self._probe
        try:
            return int(probe.default_channel.queue_declare(queue=queue, passive=True).message_count)
        except Exception as exc:
            # any error may leave the channel closed (AMQP closes it on NOT_FOUND): start afresh
            self._probe = None
            _release(probe)
            if _not_found(exc):
                return 0
            raise

    def reset(self) -> None:
        """Drop the connection after an outage; the next batch connects afresh."""
        conn, self._connection, self._producer, self._handoff = self._connection, None, None, None
        self.confirms, self.exchanges = None, set()
        if conn is not None:
            _release(conn)

    def close(self) -> None:
        self.reset()
        probe, self._probe = self._probe, None
        if probe is not None:
            _release(probe)


def streaming(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """Transport options without py-amqp's confirm per publish on AMQP (``confirm_publish``
    makes every publish wait for its confirm): the target selects confirm mode on its own
    channel and collects the confirms per batch (:mod:`.confirms`)."""
    options = dict(options or {})
    if url.split("://", 1)[0].split("+")[0] in ("amqp", "amqps", "pyamqp"):
        options["confirm_publish"] = False
    return options


def _release(conn: Connection) -> None:
    try:
        conn.release()
    except Exception:  # already broken; nothing more to release
        log.debug("closing a broken broker connection failed", exc_info=True)


def _not_found(exc: BaseException) -> bool:
    """A passive declare's "no such queue": amqp's NotFound (code 404), or kombu's virtual
    transports' ChannelError, which carries the AMQP reply code "404" among its arguments."""
    return getattr(exc, "code", None) == 404 or "404" in getattr(exc, "args", ())
