"""Where the forwarder delivers due items: the :class:`Target` protocol and the Redis-list target.

A target publishes a batch and reports, per item, what happened. It never raises for a broker
outage; it reports the items it could not send (``unsent``) so the forwarder releases them
without burning an attempt. Celery and RQ targets live with their adapters.

A target may also implement :class:`ClaimTarget`: the forwarder then hands it the batch's
:class:`~delayq_backends.store.Lease`, so a target whose broker is the delay store's own Redis can commit its publish
and the ack in one MULTI/EXEC (an exactly-once hand-off), and a target can write follow-ups
(the next run of a periodic job) to the store.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import redis

from .envelope import Envelope
from .models import DeliveryFailure, RunRef
from .outages import gives_back

if TYPE_CHECKING:
    from .store.lease import Lease

__all__ = [
    "BuryTarget",
    "Buried",
    "CheckedTarget",
    "ClaimTarget",
    "Delivery",
    "DepthTarget",
    "PublishReport",
    "RedisListTarget",
    "RunTarget",
    "SLOT_TOKEN",
    "Skipped",
    "Target",
]

#: The Celery message header, and the RQ job hash field, that carries a delivery's
#: :attr:`Delivery.slot_token` to its worker (:mod:`delayq_backends.slots`).
SLOT_TOKEN = "delayq_slot_token"


@dataclass(slots=True)
class Delivery:
    """A due item, decoded, on its way to a target. Read-only by convention, not frozen: one is
    made per forwarded item, and a frozen dataclass's ``__init__`` costs several times more.
    ``slot_token``: the token of the concurrency slot taken for it (set by the forwarder's slot
    hook; "" without one), which a Celery or RQ target passes to its worker in the message."""

    id: str
    envelope: Envelope
    attempts: int
    ready_ms: int
    slot_token: str = ""


class Skipped(NamedTuple):
    """Periods of a periodic entry (or RQ job) its overlap policy skipped, reported with the item
    whose firing or move counted them: what the metrics' ``delayq_periodic_skipped`` adds up."""

    id: str
    entry: str
    periods: int


@dataclass
class PublishReport:
    """What a target did with a batch.

    Attributes:
        published: ids the broker accepted; the forwarder acks them.
        failed: items this target cannot deliver; a permanent failure goes to the dead
            letters at once, others are retried with back-off.
        unsent: ids not sent because the broker is unreachable; released, attempt not counted.
        broker_error: the outage behind ``unsent``, if any; the forwarder backs off.
        acked: ids of ``published`` that a :class:`ClaimTarget` already acked inside its own
            transaction; the forwarder does not ack them again.
        later: (id, not-before epoch ms) of items this target will not send until an operator
            acts (an RQ class off the allowlist); they wait in the store, attempt not counted.
        skipped: the periods overlap policies skipped, by the item that counted them.

    Every attribute but ``broker_error`` is a list of entries naming one item each, so
    :meth:`merge` and :meth:`split` carry a new one with no change.
    """

    published: list[str] = field(default_factory=list)
    failed: list[DeliveryFailure] = field(default_factory=list)
    unsent: list[str] = field(default_factory=list)
    broker_error: BaseException | None = None
    acked: list[str] = field(default_factory=list)
    later: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def merge(self, other: PublishReport) -> PublishReport:
        """Two calls' reports as one (this one's entries first, and its broker error if any)."""
        lists = {name: getattr(self, name) + getattr(other, name) for name in _ITEM_LISTS}
        return PublishReport(**lists, broker_error=self.broker_error or other.broker_error)

    def split(self, owners: Mapping[str, PublishReport]) -> None:
        """Add each entry of this report (one call's, for several claims) to the report of
        ``owners`` (by item id) its item belongs to, and the broker error to each of them."""
        for name in _ITEM_LISTS:
            for entry in getattr(self, name):
                getattr(owners[_item_of(entry)], name).append(entry)
        if self.broker_error is not None:
            for report in {id(r): r for r in owners.values()}.values():
                report.broker_error = report.broker_error or self.broker_error


_ITEM_LISTS = tuple(f.name for f in fields(PublishReport) if f.name != "broker_error")


def _item_of(entry: Any) -> str:
    """The item id a report entry names: an id, a failure's, or a tuple's first member."""
    return entry if isinstance(entry, str) else entry.id if isinstance(entry, DeliveryFailure) else str(entry[0])


@runtime_checkable
class Target(Protocol):
    """Delivers envelopes whose ``target`` equals :attr:`kind`."""

    kind: str

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport: ...

    def close(self) -> None: ...


@runtime_checkable
class ClaimTarget(Target, Protocol):
    """A target the forwarder calls with the batch's :class:`Lease` (preferred over
    :meth:`Target.publish_many` when present), one call per claim.

    One whose broker makes no use of the lease may say so with a ``takes_leases`` attribute
    (or property) that is False: the forwarder then calls :meth:`Target.publish_many` once
    with every claim of the pass, as for any other target.
    """

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport: ...


@runtime_checkable
class RunTarget(Target, Protocol):
    """A target that can name the run a delivery starts, as its workers' dedupe records it.

    Lossless mode keeps such items until that run's start is recorded. None: the delivery's
    run cannot be checked in its own shard (a periodic entry, whose task id differs from the
    item's id), so it is acked as usual.
    """

    def run_of(self, delivery: Delivery) -> RunRef | None: ...


@dataclass(frozen=True)
class Buried:
    """A delivery the store has just moved to its dead letters, and why."""

    delivery: Delivery
    error: str


@runtime_checkable
class BuryTarget(Target, Protocol):
    """A target whose broker has its own idea of a failed job, told of each delivery of its
    that was dead-lettered after a failed publish (RQ's FailedJobRegistry), so its users find it
    where they look. Called after the store commits the burial; it may raise (the forwarder
    logs it and goes on: the dead letter is kept either way)."""

    def buried(self, letters: Sequence[Buried]) -> None: ...


@runtime_checkable
class DepthTarget(Target, Protocol):
    """A target that can say how many messages wait in one of its broker queues, for
    back-pressure (``--max-queue-depth``). It may raise; the forwarder then keeps forwarding."""

    def queue_depth(self, queue: str) -> int: ...


@runtime_checkable
class CheckedTarget(Target, Protocol):
    """A target that can connect and authenticate to its broker before the forwarder claims
    anything: :meth:`check` raises what connecting raised. A forwarder refuses to start on a
    configuration error (:func:`~delayq_backends.outages.config_error`), and starts anyway when
    the broker is only unreachable (its items wait in the store until it answers)."""

    def check(self) -> None: ...


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
        except Exception as exc:
            if not gives_back(exc):
                raise
            report.unsent = [d.id for d in deliveries]
            report.broker_error = exc
            return report
        for (key, group), result in zip(by_list.items(), results):
            ids = [d.id for d in group]
            if isinstance(result, Exception) and gives_back(result):  # OOM, READONLY, NOPERM...: later
                report.unsent += ids
                report.broker_error = result
            elif isinstance(result, Exception):
                # WRONGTYPE: the destination key holds something else; retrying won't help.
                report.failed += [DeliveryFailure(i, f"RPUSH {key!r} failed: {result}", permanent=True) for i in ids]
            else:
                report.published += ids
        return report

    def check(self) -> None:
        """PING: connects and authenticates."""
        self.client.ping()

    def queue_depth(self, queue: str) -> int:
        """LLEN of the list ``queue``."""
        return int(self.client.llen(queue))

    def close(self) -> None:
        self.client.close()
