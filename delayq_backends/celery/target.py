"""The forwarder's Celery target: replay stored task messages to their broker through kombu.

It needs only the broker URL (or an app's connection settings), never the user's task code.
On AMQP the channel uses publisher confirms, so an ack in the delay store only follows a
publish the broker accepted: a batch is published without waiting, then its confirms are
collected per message (:mod:`.confirms`). A message counts as published only once its own
confirm arrived; a connection lost (or no confirm within ``confirm_timeout``) leaves the
unconfirmed ones ``unsent``, released and sent again (at-least-once, as any publish whose
confirm was lost). A broker that cannot be reached is reported as ``unsent`` (the forwarder
releases the batch without burning attempts), and so is a broker that refuses for now (a
resource alarm, a locked resource: see :mod:`delayq_backends.outages`); a message the broker
refuses (a channel error such as PRECONDITION_FAILED, or a nack) is a per-item failure, retried
with back-off and dead-lettered with the broker's words if it never succeeds.

When the broker is kombu's Redis transport on the delay store's own server and database, a
claimed batch is published and acked in one MULTI/EXEC (:mod:`.redis_handoff`): exactly once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from typing import Any, NamedTuple

from kombu.common import maybe_declare
from kombu.connection import Connection
from kombu.messaging import Producer

from ..connection import redact_url
from ..errors import EnvelopeError
from ..models import DeliveryFailure, RunRef
from ..store.lease import Lease
from ..targets import SLOT_TOKEN, Delivery, PublishReport
from . import wire
from .channel import BrokerChannel, streaming
from .confirms import Confirms
from .message import KIND, StoredMessage
from .redis_handoff import Command, RedisHandOff

__all__ = ["CeleryTarget"]

log = logging.getLogger("delayq.celery")


class _Prepared(NamedTuple):
    """A due message, checked and turned into ``Producer.publish`` arguments, its queue
    declarations apart: a batch declares each of its queues once, before any publish (kombu's
    publish would check, and copy, each message's declarations again)."""

    id: str
    task: str
    kwargs: dict[str, Any]
    declare: list[Any]


class CeleryTarget:
    """Publishes envelopes of kind ``"celery"`` to the broker they were meant for.

    Args:
        connect: makes a kombu :class:`~kombu.Connection` to the broker; called again after an
            outage. Use :meth:`from_url` or :meth:`from_app` rather than passing one.
        confirm_timeout: seconds to wait for a batch's publisher confirms on AMQP; the messages
            not confirmed by then are released (``unsent``), as after an outage.
        max_watch_retries: for the exactly-once hand-off on the store's server, how often a
            batch is tried again when its shard's leases change under it (another forwarder's
            claim) before its items are retried later instead.
    """

    kind = KIND

    def __init__(
        self, connect: Callable[[], Connection], *, confirm_timeout: float = 10.0, max_watch_retries: int = 20
    ) -> None:
        self.confirm_timeout = confirm_timeout
        self.channel: BrokerChannel[_Prepared] = BrokerChannel(connect, max_watch_retries)

    @classmethod
    def from_url(cls, url: str, *, transport_options: dict[str, Any] | None = None, **kwargs: Any) -> CeleryTarget:
        """A target for a broker URL (``amqp://``, ``redis://``, ...), as Celery's ``broker_url``."""

        def connect() -> Connection:
            return Connection(url, connect_timeout=4, transport_options=streaming(url, transport_options))

        return cls(connect, **kwargs)

    @classmethod
    def from_app(cls, app: Any, **kwargs: Any) -> CeleryTarget:
        """A target using a Celery app's broker settings (URL, SSL, transport options, ...)."""

        def connect() -> Connection:
            url = app.conf.broker_write_url or app.conf.broker_url or "amqp://"
            conn: Connection = app.connection_for_write(transport_options=streaming(url, None))
            return conn

        return cls(connect, **kwargs)

    def describe(self) -> str:
        """The broker URL, password hidden, for logs and banners (``***`` only where there is one:
        kombu's own ``as_uri()`` writes ``:**@`` into a URL without a password); the error when no
        connection can be made (a missing transport module: the start check says what to do)."""
        try:
            return redact_url(self.channel.connection().as_uri(include_password=True))
        except Exception as exc:
            return f"a broker this forwarder cannot use ({type(exc).__name__}: {exc})"

    @property
    def takes_leases(self) -> bool:
        """Whether :meth:`publish_claimed` may use the claim's lease (the Redis hand-off); not
        on AMQP, so the forwarder publishes a pass's claims in one call, which waits for the
        broker's confirms once, not once per claim (a wait of several ms each). Known without
        connecting: the transport is named by the broker URL."""
        try:
            return bool(self.channel.connection().transport.driver_type != "amqp")
        except Exception:  # no transport module: publish_claimed reports it, as before
            return True

    def check(self) -> None:
        """Connect and authenticate to the broker (a channel opened), as before a publish."""
        self.channel.producer()

    @staticmethod
    def trace_carrier(delivery: Delivery) -> Any:
        """The stored message's headers, where opentelemetry-instrumentation-celery wrote the
        producer's ``traceparent``: the forward's span links to it (:mod:`delayq_backends.tracing`).
        Only called when tracing is on. None for what holds no headers (a format 1 envelope, or
        details another tool wrote)."""
        try:
            details = json.loads(delivery.envelope.details) if delivery.envelope.details else None
        except ValueError:
            return None
        return details.get("h") if isinstance(details, dict) else None

    # -- publishing -------------------------------------------------------------------------

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        report = PublishReport()
        ready = self._prepare(deliveries, report)
        if not ready:
            return report
        try:
            ready = self._declared(ready, report)
            producer = self.channel.producer()  # after the declarations: on a new channel if one was refused
            if self.channel.confirms is not None:
                self._stream(ready, report)
            else:
                report.published += self._publish(producer, ready, report)
        except Exception as exc:  # an outage or overload (a memory alarm) releases what is left
            self._released(exc, ready, report)
        return report

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        """Publish a claimed batch; on kombu's Redis transport on the store's own server and
        database, the publish and the ack commit in one MULTI/EXEC (see :mod:`.redis_handoff`)."""
        try:
            handoff = self.channel.handoff()
        except Exception as exc:  # cannot connect: publish_many reports the outage as usual
            if not self.channel.is_outage(exc):
                raise
            handoff = None
        if handoff is None or not handoff.applies(lease):
            return self.publish_many(deliveries)
        report = PublishReport()
        ready = self._prepare(deliveries, report)
        try:
            ready = self._declared(ready, report)  # kombu's binding table, read to route
            handoff = self.channel.handoff() or handoff  # on a new channel if a declaration was refused
            messages = self._encoded(handoff, ready, report)
            if messages:
                handoff.send(messages, lease, report)
        except Exception as exc:  # nothing was published or acked: release
            self._released(exc, ready, report)
        return report

    def _encoded(
        self, handoff: RedisHandOff, ready: list[_Prepared], report: PublishReport
    ) -> dict[str, list[Command]]:
        """kombu's Redis commands for each message (id -> commands), routed by kombu and written
        by nobody yet; a message refused or that cannot be encoded fails alone."""
        encoder, messages = handoff.encoder(), dict[str, list[Command]]()
        for p in ready:
            try:
                messages[p.id] = encoder.commands(p.kwargs)
            except Exception as exc:
                if self.channel.is_outage(exc):
                    raise
                report.failed.append(DeliveryFailure(p.id, _refusal(p, exc, self.channel.channel_errors())))
        return messages

    def _prepare(self, deliveries: Sequence[Delivery], report: PublishReport) -> list[_Prepared]:
        """The deliveries as publish arguments; what cannot be replayed fails here, before any publish."""
        now = datetime.now(timezone.utc)
        ready: list[_Prepared] = []
        for d in deliveries:
            try:
                message = StoredMessage.from_envelope(d.envelope)
                kwargs = message.publish_kwargs(ready_ms=d.ready_ms, now=now)
                if d.slot_token:  # the worker reports its slot's start and end with it
                    kwargs["headers"][SLOT_TOKEN] = d.slot_token
                ready.append(_Prepared(d.id, message.task, kwargs, kwargs.pop("declare")))
            except (EnvelopeError, ValueError, TypeError, OverflowError) as exc:
                report.failed.append(DeliveryFailure(d.id, f"cannot replay this Celery message: {exc}", permanent=True))
            except Exception as exc:  # whatever else one message raises, it fails alone
                why = f"cannot replay this Celery message: {type(exc).__name__}: {exc}"
                report.failed.append(DeliveryFailure(d.id, why, permanent=True))
        return ready

    def _released(self, exc: Exception, ready: list[_Prepared], report: PublishReport) -> None:
        """Report what was not sent as ``unsent`` after an outage or overload; re-raise anything else."""
        if not self.channel.is_outage(exc):
            raise exc
        self.channel.reset()
        done = set(report.published) | {f.id for f in report.failed}
        report.unsent = [p.id for p in ready if p.id not in done]
        report.broker_error = exc

    def _publish(self, producer: Producer, ready: list[_Prepared], report: PublishReport) -> list[str]:
        """Publish each message on a broker without confirms (kombu's Redis transport, ...);
        returns the ids whose publish (or batch flush) succeeded.

        In a kombu batch (Redis transport, kombu >= 5.7) nothing is sent before the flush, so the
        batch's ids count only once it has flushed. There the batch's commands are kombu's, encoded
        without its publish per message (:class:`.redis_handoff.BatchEncoder`), and go out in one
        pipeline as kombu's batch sends them.
        """
        batched = hasattr(producer, "batch") and getattr(producer.channel, "supports_batch_publish", False)
        handoff = self.channel.handoff() if batched else None
        if handoff is not None:
            messages = self._encoded(handoff, ready, report)
            handoff.push(messages.values())
            return list(messages)
        sent: list[str] = []
        context: AbstractContextManager[Any] = producer.batch(max_size=len(ready)) if batched else nullcontext()
        with context:
            for p in ready:
                try:
                    producer.publish(**p.kwargs)
                except Exception as exc:  # the broker refused this one message, or it cannot be encoded
                    if self.channel.is_outage(exc):  # for now (a resource alarm), or refused us (no write access)
                        raise
                    report.failed.append(DeliveryFailure(p.id, _refusal(p, exc, self.channel.channel_errors())))
                    if not batched and isinstance(exc, self.channel.channel_errors()):
                        self.channel.renew()  # the channel is closed after a channel error
                        producer = self.channel.producer()
                    continue
                if batched:
                    sent.append(p.id)
                else:
                    report.published.append(p.id)
        return sent

    def _stream(self, ready: list[_Prepared], report: PublishReport) -> None:
        """Publish a batch on the confirm-mode AMQP channel, then collect its confirms.

        The queues were declared first and the exchanges are checked (:meth:`_declared`,
        :meth:`_exchanges_found`: round trips the broker answers, so a refusal there is those
        messages' alone). A channel error during the stream (the broker closes the channel: a
        ``user_id`` that is not the connection's, a message over the size limit, an exchange
        deleted since it was checked) cannot be told apart per message: the unconfirmed ones
        are then published again one at a time, each waiting for its confirm, so the culprit
        fails alone. One the broker took before the error but had not confirmed yet is then
        published twice (at-least-once, as after a lost connection).
        """
        ready = self._exchanges_found(ready, report)
        producer, confirms = self.channel.producer(), self.channel.confirms
        assert confirms is not None
        frames = wire.Frames(producer.channel)
        done = 0  # how many of ready were published or failed
        try:
            for p in ready:
                try:
                    _send(producer, frames, p)
                except Exception as exc:
                    if self.channel.is_outage(exc) or isinstance(exc, self.channel.channel_errors()):
                        raise
                    report.failed.append(DeliveryFailure(p.id, _refusal(p, exc, self.channel.channel_errors())))
                else:
                    confirms.sent(p)
                done += 1
            frames.flush()
            confirms.wait(self.confirm_timeout)
        except Exception as exc:
            if self.channel.is_outage(exc) or not isinstance(exc, self.channel.channel_errors()):
                raise
            self._settled(confirms, report)
            self._one_by_one([*confirms.waiting, *ready[done:]], report)
        finally:
            self._settled(confirms, report)

    def _one_by_one(self, uncertain: list[_Prepared], report: PublishReport) -> None:
        """Publish each message and wait for its own confirm, on a fresh channel after a refusal."""
        self.channel.renew()
        for p in uncertain:
            producer, confirms = self.channel.producer(), self.channel.confirms
            assert confirms is not None
            try:
                frames = wire.Frames(producer.channel)
                _send(producer, frames, p)
                frames.flush()
                confirms.sent(p)
                confirms.wait(self.confirm_timeout)
            except Exception as exc:
                if self.channel.is_outage(exc):
                    raise
                report.failed.append(DeliveryFailure(p.id, _refusal(p, exc, self.channel.channel_errors())))
                if isinstance(exc, self.channel.channel_errors()):
                    self.channel.renew()  # the broker closed the channel
            finally:
                self._settled(confirms, report)

    def _declared(self, ready: list[_Prepared], report: PublishReport) -> list[_Prepared]:
        """Declare the batch's queues, each once (kombu caches them per connection); the
        messages whose declaration the broker refused fail, the others are returned."""

        def declare(entity: Any) -> None:
            maybe_declare(entity, self.channel.producer().channel)

        return self._checked(ready, report, lambda p: {hash(e): e for e in p.declare}, declare)

    def _exchanges_found(self, ready: list[_Prepared], report: PublishReport) -> list[_Prepared]:
        """On AMQP, check once per connection that each exchange the batch publishes to exists
        (a passive declare, answered): a publish to a missing one would close the channel
        after the publishes behind it were written, refusing them all."""

        def check(name: str) -> None:
            self.channel.producer().channel.exchange_declare(name, "direct", passive=True)
            self.channel.exchanges.add(name)

        def needs(p: _Prepared) -> dict[Any, Any]:
            name = p.kwargs["exchange"]
            return {} if not name or name in self.channel.exchanges else {name: name}

        return self._checked(ready, report, needs, check)

    def _checked(
        self,
        ready: list[_Prepared],
        report: PublishReport,
        needs: Callable[[_Prepared], dict[Any, Any]],
        check: Callable[[Any], None],
    ) -> list[_Prepared]:
        """Run ``check`` once for each distinct thing (by key) the messages of ``ready`` need; the
        messages needing one the broker refused (a channel error) fail, the others are returned."""
        refused: dict[Any, BaseException] = {}
        for key, thing in {k: t for p in ready for k, t in needs(p).items()}.items():
            try:
                check(thing)
            except Exception as exc:
                if self.channel.is_outage(exc) or not isinstance(exc, self.channel.channel_errors()):
                    raise
                refused[key] = exc
                self.channel.renew()  # the broker closed the channel
        if not refused:
            return ready
        kept = []
        for p in ready:
            why = next((refused[k] for k in needs(p) if k in refused), None)
            if why is None:
                kept.append(p)
            else:
                report.failed.append(DeliveryFailure(p.id, _refusal(p, why, self.channel.channel_errors())))
        return kept

    @staticmethod
    def _settled(confirms: Confirms[_Prepared], report: PublishReport) -> None:
        """Move the confirms received so far into ``report``."""
        acked, nacked = confirms.take()
        report.published += [p.id for p in acked]
        report.failed += [DeliveryFailure(p.id, f"broker refused {p.task} {p.id}: nacked") for p in nacked]

    def run_of(self, delivery: Delivery) -> RunRef | None:
        """The run a worker with dedupe records for this message: its task id and ``retries``
        (see :mod:`.dedupe`). None when the task id is not the item's id (a periodic entry's
        run, whose record lies in another shard) or the message carries no protocol-2 headers."""
        try:
            headers = StoredMessage.from_envelope(delivery.envelope).headers
            retries = int(headers.get("retries") or 0)
        except (EnvelopeError, ValueError, TypeError):
            return None  # cannot be replayed either: _prepare reports it
        return RunRef(delivery.id, retries) if headers.get("id") == delivery.id else None

    def queue_depth(self, queue: str) -> int:
        """Messages ready in ``queue`` on the broker (see :meth:`.BrokerChannel.depth`)."""
        return self.channel.depth(queue)

    def close(self) -> None:
        self.channel.close()


def _send(producer: Producer, frames: wire.Frames, p: _Prepared) -> None:
    """Publish on AMQP: the message kombu would send, framed without kombu (:mod:`.wire`) into
    ``frames``; what only kombu handles goes through kombu after the frames before it."""
    if not frames.add(p.kwargs):
        frames.flush()
        producer.publish(**p.kwargs)


def _refusal(p: _Prepared, exc: BaseException, channel_errors: tuple[type[BaseException], ...]) -> str:
    """Why one message was not published: the broker's words, or what raised while encoding it
    (an AMQP header past 64 bits raises ``struct.error``)."""
    if isinstance(exc, channel_errors):
        return f"broker refused {p.task} {p.id}: {exc}"
    return f"cannot publish {p.task} {p.id}: {type(exc).__name__}: {exc}"
