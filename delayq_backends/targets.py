"""Where the forwarder delivers due items: the :class:`Target` protocol and the Redis-list target.

A target publishes a batch and reports, per item, what happened. It never raises for a broker
outage; it reports the items it could not send (``unsent``) so the forwarder releases them
without burning an attempt. Celery and RQ targets live with their adapters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, runtime_checkable

import redis

from .envelope import Envelope

__all__ = ["Delivery", "PublishReport", "RedisListTarget", "Target"]


@dataclass(frozen=True)
class Delivery:
    """A due item, decoded, on its way to a target."""

    id: str
    envelope: Envelope
    attempts: int
    ready_ms: int


@dataclass
class PublishReport:
    """What a target did with a batch.

    Attributes:
        published: ids the broker accepted; the forwarder acks them.
        failed: (id, error, permanent) for items this target cannot deliver; a permanent
            failure goes to the dead letters at once, others are retried with back-off.
        unsent: ids not sent because the broker is unreachable; released, attempt not counted.
        broker_error: the outage behind ``unsent``, if any; the forwarder backs off.
    """

    published: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, bool]] = field(default_factory=list)
    unsent: list[str] = field(default_factory=list)
    broker_error: Optional[BaseException] = None


@runtime_checkable
class Target(Protocol):
    """Delivers envelopes whose ``target`` equals :attr:`kind`."""

    kind: str

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport: ...

    def close(self) -> None: ...


class RedisListTarget:
    """RPUSH each item's body onto the Redis list named by its envelope's destination.

    Useful on its own (a consumer BLPOPs the list) and as the reference target in tests.
    Envelopes for it are made with :meth:`envelope`.
    """

    kind = "list"

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    @staticmethod
    def envelope(list_key: str, body: bytes) -> Envelope:
        return Envelope(target=RedisListTarget.kind, destination=list_key, body=body)

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        report = PublishReport()
        by_list: dict[str, list[Delivery]] = defaultdict(list)
        for d in deliveries:
            by_list[d.envelope.destination].append(d)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key, group in by_list.items():  # one RPUSH per list, in ready-time order
                    pipe.rpush(key, *(d.envelope.body for d in group))
                results = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            report.unsent = [d.id for d in deliveries]
            report.broker_error = exc
            return report
        for (key, group), result in zip(by_list.items(), results):
            ids = [d.id for d in group]
            if isinstance(result, (redis.ConnectionError, redis.TimeoutError)):
                report.unsent += ids
                report.broker_error = result
            elif isinstance(result, Exception):
                # WRONGTYPE: the destination key holds something else; retrying won't help.
                report.failed += [(i, f"RPUSH {key!r} failed: {result}", True) for i in ids]
            else:
                report.published += ids
        return report

    def close(self) -> None:
        self.client.close()
