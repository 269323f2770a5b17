"""Publisher confirms streamed over one AMQP channel, collected per delivery tag.

Waiting for one confirm per message costs a round trip per message (RabbitMQ answers in well
under a millisecond, but a batch of 200 then takes 200 of them). Here a batch is published
without waiting, and the broker's ``basic.ack`` / ``basic.nack`` frames, which arrive in
any number and may cover many publishes at once (``multiple=True``), are matched to the
messages by delivery tag: after ``confirm.select`` the broker numbers the channel's publishes
1, 2, 3, ..., so the n-th publish on the channel has tag n.

Only py-amqp's own API is used (``confirm_select``, the ``basic_ack``/``basic_nack`` event
callbacks and ``connection.drain_events``), on the channel kombu opened, so kombu still
prepares and routes every message.
"""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar

__all__ = ["ConfirmTimeout", "Confirms"]

T = TypeVar("T")


class ConfirmTimeout(TimeoutError):
    """The broker did not confirm every publish in time: the unconfirmed ones are uncertain."""


class Confirms(Generic[T]):
    """The confirm-mode channel ``channel`` and its publishes waiting for their confirm.

    :meth:`sent` records each publish in the order it went out; :meth:`wait` drains the
    connection until each has its confirm. Confirmed items land in :attr:`acked` and refused
    ones (a nack: a full queue with ``x-overflow=reject-publish``, an internal error) in
    :attr:`nacked`; :meth:`take` hands both over.
    """

    def __init__(self, channel: Any) -> None:
        # a connection with ``confirm_publish`` (a user's own connect, broker_transport_options)
        # makes py-amqp wait for each publish's confirm itself, taking the broker's frames from
        # these callbacks: this channel publishes without waiting, as its class does
        getattr(channel, "__dict__", {}).pop("basic_publish", None)
        channel.confirm_select()
        self.channel = channel
        self._next = 1  # the delivery tag of the next publish
        self._low = 1  # no tag below this is waiting
        self._waiting: dict[int, T] = {}
        self.acked: list[T] = []
        self.nacked: list[T] = []
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def sent(self, item: T) -> None:
        """Record the publish that just went out on the channel."""
        self._waiting[self._next] = item
        self._next += 1

    @property
    def waiting(self) -> list[T]:
        """The items published and not yet confirmed, in publish order."""
        return list(self._waiting.values())

    def wait(self, timeout: float) -> None:
        """Read the broker's frames until every publish is confirmed.

        Raises:
            ConfirmTimeout: some were not confirmed within ``timeout`` seconds.
            What the connection raises: a connection lost, or a channel closed by the broker.
        """
        deadline = time.monotonic() + timeout
        drain = self.channel.connection.drain_events
        while self._waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConfirmTimeout(f"{len(self._waiting)} publishes not confirmed within {timeout:g} s")
            try:
                drain(timeout=left)
            except TimeoutError:  # socket.timeout: the deadline has passed
                continue

    def take(self) -> tuple[list[T], list[T]]:
        """The items acked and nacked since the last call."""
        acked, nacked, self.acked, self.nacked = self.acked, self.nacked, [], []
        return acked, nacked

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, self.acked)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, self.nacked)

    def _settle(self, tag: int, multiple: bool, into: list[T]) -> None:
        tags = range(self._low, tag + 1) if multiple else (tag,)
        for t in tags:
            item = self._waiting.pop(t, None)
            if item is not None:
                into.append(item)
        while self._low < self._next and self._low not in self._waiting:
            self._low += 1
