"""Exactly-once hand-off of Celery messages to kombu's Redis transport on the delay store's server.

In the common single-Redis deployment the Celery broker (kombu's Redis transport) and the delay
store share one server and database. The forwarder then pushes each message onto kombu's queue
list and acks it in the store in one MULTI/EXEC, guarded by a WATCH on the batch's lease:
either both happen or neither does. A forwarder killed at any point, or one whose lease was
taken over before EXEC, leaves nothing published and nothing acked; the batch is claimed again.

The message is kombu's own: :class:`kombu.Producer` prepares it (serializer, headers,
properties, ``expiration``, declarations) and kombu's ``basic_publish`` routes it (exchange
bindings, direct/topic/fanout, priority sub-lists, ``x-expires``). Only kombu's final Redis
commands (``LPUSH``, ``PEXPIRE``, ``PUBLISH``) are collected, through the ``_publish_batch``
hook kombu >= 5.7 gives its own publish batches, and replayed in our transaction with
``global_keyprefix`` applied by kombu's rule. The one difference from kombu's own publish is the
random ``delivery_tag`` kombu draws per publish. Older kombu has no such hook: the target then
publishes, then acks (at-least-once), as on any other broker.

kombu's whole ``Producer.publish`` per message costs more than the rest of a hand-off, so a batch
is encoded by a :class:`BatchEncoder`: it builds the JSON message kombu's Redis channel pushes
(the properties as kombu builds them, :func:`.wire.publish_properties`) and routes it by the
commands kombu's channel gave one probe message to the same exchange, routing key and priority,
found once per batch. A message holding what only kombu handles goes through kombu as above.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from kombu import exceptions as kombu_errors
from kombu.messaging import Producer
from kombu.transport.virtual.exchange import STANDARD_EXCHANGE_TYPES
from kombu.utils.json import dumps as kombu_json_dumps

from ..models import DeliveryFailure
from ..store.lease import Lease
from ..targets import PublishReport
from . import wire

__all__ = ["BatchEncoder", "Command", "RedisHandOff"]


class Command(NamedTuple):
    """One Redis command kombu's publish would have sent, key prefix applied."""

    name: str
    args: tuple[Any, ...]


@dataclass
class _Recorder:
    """Collects kombu's final commands for one message (kombu's ``PublishBatch.add`` interface)."""

    commands: list[Command] = field(default_factory=list)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append(Command(name.upper(), args))


class _RecordingChannel:
    """A kombu Redis channel whose ``basic_publish`` routes as kombu does but writes nothing:
    the commands land in :attr:`recorder`. Everything else (declarations, binding-table reads)
    goes to the real channel."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.recorder = _Recorder()

    def basic_publish(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        return self._channel.basic_publish(message, *args, _publish_batch=self.recorder, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


class RedisHandOff:
    """Publishes a claimed batch and acks it in one transaction on the store's server.

    Made by :meth:`for_channel`, which returns None where this cannot apply (not kombu's Redis
    transport, or a kombu without the publish hook). :meth:`applies` then says, per lease,
    whether the broker is the store's own server and database (the rule of
    :meth:`~delayq_backends.store.Lease.shares_server`, which the RQ target uses too).
    """

    def __init__(self, channel: Any, *, max_watch_retries: int = 20) -> None:
        #: on kombu's connection pool (its server, database, credentials), without the
        #: ``global_keyprefix`` kombu's own client adds: the store's keys must not get it
        self.client = redis.Redis(connection_pool=channel.pool)
        self.max_watch_retries = max_watch_retries
        self.channel = channel
        self._recording = _RecordingChannel(channel)
        self._producer = Producer(self._recording, auto_declare=False)
        prefix: Callable[[list[Any]], list[Any]] | None = getattr(channel.client, "_prefix_args", None)
        self._prefix = prefix

    @classmethod
    def for_channel(cls, channel: Any, **kwargs: Any) -> RedisHandOff | None:
        """A hand-off for ``channel`` if it is kombu's Redis transport with the publish hook."""
        try:
            from kombu.transport.redis import Channel as RedisChannel
        except ImportError:  # kombu without redis-py: not a Redis broker anyway
            return None
        if not isinstance(channel, RedisChannel) or not hasattr(channel, "create_publish_batch"):
            return None
        return cls(channel, **kwargs)

    def applies(self, lease: Lease) -> bool:
        return lease.shares_server(self.client)

    def commands(self, publish_kwargs: dict[str, Any]) -> list[Command]:
        """What kombu's ``Producer.publish(**publish_kwargs)`` would send, not sent.

        Declarations in ``declare`` do run (on the real channel, as kombu's publish runs them):
        they only write kombu's binding table, and must exist before the message can be routed
        (the target declares a batch's queues once, before, and passes none here).
        """
        self._recording.recorder = _Recorder()
        self._producer.publish(**publish_kwargs)
        return [self._prefixed(c) for c in self._recording.recorder.commands]

    def routed(self, message: dict[str, Any], exchange: str, routing_key: str) -> list[Command]:
        """What kombu's channel would send for ``message`` (prepared, as ``prepare_message``
        returns it) published to ``exchange`` with ``routing_key``, not sent."""
        self._recording.recorder = _Recorder()
        self._recording.basic_publish(message, exchange, routing_key)
        return [self._prefixed(c) for c in self._recording.recorder.commands]

    def encoder(self) -> BatchEncoder:
        """An encoder for one batch, routing as kombu's channel routes now (after the batch's
        declarations: a binding made later is seen by the next batch's encoder)."""
        return BatchEncoder(self)

    def _prefixed(self, command: Command) -> Command:
        """``global_keyprefix`` applied as kombu's prefixed client applies it."""
        if self._prefix is None:
            return command
        name, *args = self._prefix([command.name, *command.args])
        return Command(name, tuple(args))

    def push(self, messages: Iterable[list[Command]]) -> None:
        """Send each message's commands as kombu's publish batch sends them, for a broker that is
        not the store's server (no lease to commit with): one pipeline without MULTI, LPUSHes
        onto one list coalesced. A failure raises kombu's ``BatchPublishError`` as its batch does:
        delivery is uncertain, so the batch is released and sent again (at-least-once)."""
        with self.client.pipeline(transaction=False) as pipe:
            for command in _coalesced(c for commands in messages for c in commands):
                pipe.execute_command(command.name, *command.args)
            try:
                pipe.execute()
            except Exception as exc:
                raise kombu_errors.BatchPublishError("Redis publish batch failed; delivery is uncertain") from exc

    def send(self, messages: dict[str, list[Command]], lease: Lease, report: PublishReport) -> None:
        """Publish ``messages`` (id -> commands) and ack them in one MULTI/EXEC.

        Only ids still under ``lease`` are published; a lease change before EXEC (WATCH) runs the
        check again. Ids published are reported in both ``published`` and ``acked``; ids no
        longer ours are not reported (the forwarder must not touch them). Raises what Redis
        raises (an outage, OOM): then nothing was published or acked, or, if the connection broke
        after EXEC went out, both were; never one without the other.
        """
        ids = list(messages)
        with self.client.pipeline() as pipe:
            for _ in range(self.max_watch_retries):
                try:
                    pipe.watch(lease.watch_key)
                    held = lease.held(pipe, ids)
                    pipe.multi()
                    for command in _coalesced(c for item_id in held for c in messages[item_id]):
                        pipe.execute_command(command.name, *command.args)
                    lease.ack(held, pipeline=pipe)
                    if held:
                        pipe.execute()
                    break
                except redis.WatchError:
                    pipe.reset()
            else:
                why = f"the lease changed {self.max_watch_retries} times while being handed off"
                report.failed += [DeliveryFailure(i, why) for i in ids]
                return
        report.published += held
        report.acked += held


#: what kombu's channel adds to the properties itself: a message already holding one is left to kombu
_CHANNEL_PROPERTIES = frozenset({"delivery_info", "body_encoding", "delivery_tag"})


class _Payload:
    """Where a route's commands take the message's JSON (a key or a channel never is it)."""


_PAYLOAD = _Payload()


class BatchEncoder:
    """kombu's Redis commands for the messages of one batch, without ``Producer.publish``.

    The message is the dict kombu's Redis channel JSON-encodes (``prepare_message``, then
    ``_inplace_augment_message``): body (in the channel's ``body_encoding``), content encoding and
    type, headers, and the properties with ``delivery_info``, ``priority`` (kombu's default when
    none or 0), ``body_encoding`` and a ``delivery_tag`` from the channel. kombu's virtual
    exchanges route by exchange, routing key and priority alone, so the commands kombu's channel
    gives one probe message (``LPUSH`` onto each queue's priority sub-list, ``PEXPIRE`` of queues
    with ``x-expires``, ``PUBLISH`` for fanout, key prefix applied) serve every message of the
    batch going there, with its own JSON in place of the probe's. What only kombu handles (a
    serializer, properties kombu's channel sets itself, a priority that is not an int) goes
    through :meth:`RedisHandOff.commands`.
    """

    def __init__(self, handoff: RedisHandOff) -> None:
        self._handoff = handoff
        self._channel = handoff.channel
        #: by (exchange, routing key, priority); None where kombu's commands do not carry the
        #: probe's JSON as it is (a transport of its own wrapping it): left to kombu
        self._routes: dict[tuple[str, str, int], list[Command] | None] = {}

    def commands(self, publish_kwargs: dict[str, Any]) -> list[Command]:
        """What kombu's ``Producer.publish(**publish_kwargs)`` would send, not sent."""
        message = self._message(publish_kwargs)
        route = None if message is None else self._route(message)
        if message is None or route is None:
            return self._handoff.commands(publish_kwargs)
        try:
            payload = json.dumps(message)  # kombu's JSON, without its encoder's Python hook
        except TypeError:  # a datetime, a UUID, bytes in a header: kombu's hook encodes it
            payload = kombu_json_dumps(message)
        return [Command(c.name, tuple(payload if a is _PAYLOAD else a for a in c.args)) for c in route]

    def _message(self, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The message kombu's channel would encode, or None to leave it to kombu."""
        found = wire.publish_properties(kwargs)
        if found is None or _CHANNEL_PROPERTIES.intersection(found.properties):
            return None
        channel = self._channel
        priority = found.priority or channel.default_priority
        if type(priority) is not int:  # kombu's int() of it picks the sub-list
            return None
        body, body_encoding = channel.encode_body(kwargs["body"], channel.body_encoding)
        properties = found.properties
        properties["delivery_info"] = {"exchange": kwargs["exchange"], "routing_key": kwargs["routing_key"]}
        properties["priority"] = priority
        properties["body_encoding"] = body_encoding
        properties["delivery_tag"] = channel._next_delivery_tag()
        return {
            "body": body,
            "content-encoding": kwargs["content_encoding"],
            "content-type": kwargs["content_type"],
            "headers": kwargs.get("headers") or {},
            "properties": properties,
        }

    def _route(self, message: dict[str, Any]) -> list[Command] | None:
        """The commands kombu's channel sends for ``message``, its JSON as :data:`_PAYLOAD`."""
        properties = message["properties"]
        delivery_info = properties["delivery_info"]
        key = (delivery_info["exchange"], delivery_info["routing_key"], properties["priority"])
        if key not in self._routes:
            exchange, routing_key, priority = key
            if not self._standard(exchange):
                self._routes[key] = None
                return None
            probe = {"body": b"", "headers": {}, "properties": {"delivery_info": {}, "priority": priority}}
            commands = self._handoff.routed(probe, exchange, routing_key)
            payload = kombu_json_dumps(probe)  # augmented by kombu's channel, as it encoded it
            route = [Command(c.name, tuple(_PAYLOAD if a == payload else a for a in c.args)) for c in commands]
            carried = not route or any(_PAYLOAD in c.args for c in route)
            self._routes[key] = route if carried else None
        return self._routes[key]

    def _standard(self, exchange: str) -> bool:
        """Whether ``exchange`` is of one of kombu's own types, which route by exchange, routing
        key and priority alone (a type of the user's own may route on anything: left to kombu)."""
        try:
            kind = type(self._channel.typeof(exchange))
        except KeyError:
            return False
        return kind in STANDARD_EXCHANGE_TYPES.values()


def _coalesced(commands: Iterable[Command]) -> Iterator[Command]:
    """``commands`` with each run of LPUSHes onto one list as one LPUSH of all their values
    (the same list, in the same order: LPUSH pushes its values one after the other), so a
    batch for one queue costs Redis one command and the client one reply to read."""
    key: Any = None
    values: list[Any] = []
    for command in commands:
        if command.name == "LPUSH" and values and command.args[0] == key:
            values += command.args[1:]
            continue
        if values:
            yield Command("LPUSH", (key, *values))
            values = []
        if command.name == "LPUSH":
            key, values = command.args[0], list(command.args[1:])
        else:
            yield command
    if values:
        yield Command("LPUSH", (key, *values))
