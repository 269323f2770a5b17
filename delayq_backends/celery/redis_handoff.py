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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from kombu.messaging import Producer

from ..models import DeliveryFailure
from ..store.lease import Lease
from ..targets import PublishReport

__all__ = ["Command", "RedisHandOff"]


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

    def _prefixed(self, command: Command) -> Command:
        """``global_keyprefix`` applied as kombu's prefixed client applies it."""
        if self._prefix is None:
            return command
        name, *args = self._prefix([command.name, *command.args])
        return Command(name, tuple(args))

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
