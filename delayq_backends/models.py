"""Plain records the store hands out."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "BatchStatus",
    "GroupPolicy",
    "GroupStatus",
    "SlotBoard",
    "SlotGrant",
    "SlotStatus",
    "CancelOutcome",
    "Cancelled",
    "Claim",
    "ClaimedItem",
    "Collapsed",
    "DeadLetter",
    "DeliveryFailure",
    "FailCounts",
    "FailedDelivery",
    "LeaseExtension",
    "LinePlace",
    "LineRelease",
    "Parked",
    "ParkedCounts",
    "RearmOutcome",
    "RequeuePage",
    "RescheduleOutcome",
    "RunRef",
    "ScheduleCounts",
    "ScheduleItem",
    "ScheduledItem",
    "ShardStats",
    "TokenGrant",
    "WHY_STATES",
    "Why",
]


class CancelOutcome(Enum):
    """What :meth:`DelayStore.cancel` did. Truthy only when the item is certainly not delivered,
    so ``if store.cancel(id):`` keeps meaning "cancelled"."""

    CANCELLED = "cancelled"
    #: It was leased to a forwarder: removed from the store, but it may have been published
    #: already (or be published now), so it may still run once.
    IN_FLIGHT = "in flight"
    NOT_FOUND = "not found"

    def __bool__(self) -> bool:
        return self is CancelOutcome.CANCELLED


@dataclass(frozen=True)
class Cancelled:
    """What :meth:`DelayStore.cancel_item` did: the outcome, and the batch the item was a sub-job
    of, told it failed (None: no batch, or the item was not certainly cancelled)."""

    outcome: CancelOutcome
    batch: str | None = None


class RescheduleOutcome(Enum):
    """What :meth:`DelayStore.reschedule` did. Truthy only when the item moved."""

    RESCHEDULED = "rescheduled"
    #: It is leased to a forwarder, which may have published it already: left as it is (moving
    #: it could deliver it now and again at the new time). Retry once it is delivered or back.
    IN_FLIGHT = "in flight"
    NOT_FOUND = "not found"

    def __bool__(self) -> bool:
        return self is RescheduleOutcome.RESCHEDULED


class RearmOutcome(Enum):
    """What :meth:`DelayStore.rearm` / :meth:`DelayStore.replace_if` did. Truthy only when the
    item took its new ready time and envelope."""

    REPLACED = "replaced"
    NOT_FOUND = "not found"
    #: Not under the caller's lease (rearm), or under a forwarder's live lease (replace_if).
    HELD = "held"
    #: Its envelope is no longer the one the caller read (replace_if): read it again.
    CHANGED = "changed"

    def __bool__(self) -> bool:
        return self is RearmOutcome.REPLACED


@dataclass(slots=True)
class ClaimedItem:
    """An item leased to a forwarder. ``envelope`` is raw: decoding may fail, and that is
    the forwarder's to report.

    Not frozen: one is made per claimed item, and a frozen dataclass's ``__init__`` (through
    ``object.__setattr__``) costs several times a plain one's. Treat it as read-only."""

    id: str
    envelope: bytes
    attempts: int
    ready_ms: int


@dataclass(frozen=True)
class Claim:
    """One claim on one shard, held until ``deadline_ms``.

    ``token`` is unique per claim; with the deadline it makes the lease that every ack, release
    and fail must present, so a stale claim can never act on a later claim's items.
    """

    shard: int
    deadline_ms: int
    token: str
    items: list[ClaimedItem] = field(default_factory=list)

    @property
    def lease(self) -> str:
        return f"{self.deadline_ms}:{self.token}"


@dataclass(slots=True)
class ScheduleItem:
    """One item to schedule, checked: an id from ``keys.normalize_id``, ready time in integer ms,
    envelope bytes from ``DelayStore.check_payload`` and a rank from ``store.check_rank``.

    Slotted, not frozen: one is made per item scheduled, and a frozen dataclass costs several
    times more to build."""

    id: str
    ready_ms: int
    envelope: bytes
    rank: int = 0


@dataclass(frozen=True)
class ScheduledItem:
    """An item as it stands in the store."""

    id: str
    shard: int
    ready_ms: int
    envelope: bytes
    attempts: int
    leased_until_ms: int | None
    rank: int = 0  # higher is claimed first in a backlog (see DelayStore.schedule)
    #: schedules collapsed into this pending run, for an item of DelayStore.debounce/throttle (else 0)
    calls: int = 0
    #: published in lossless mode and kept until a worker reports its start; ``leased_until_ms``
    #: is then when a forwarder looks again (and publishes it again if it has not started)
    awaiting_start: bool = False
    #: why it is parked (``format:<n>``, ``target:<kind>``): no forwarder that claimed it could
    #: release it, and none reads it again before its re-check; None when it is not parked
    parked: str | None = None


@dataclass(frozen=True)
class RunRef:
    """One run of an item, as worker-side dedupe records its start: the item's id (its task or
    job id) and the run number (Celery's ``retries``)."""

    id: str
    run: int


@dataclass(frozen=True)
class Collapsed:
    """What :meth:`DelayStore.debounce` / :meth:`DelayStore.throttle` did.

    Attributes:
        id: the item id of the key's run (``"debounce:<key>"`` or ``"throttle:<key>"``).
        ready_ms: when that run fires, as it stands after this call.
        calls: schedules collapsed into the pending run, this one included; 1 when this call
            started a new run (none was pending, or the last one was already with a forwarder).
        stored: this call's envelope is the one the run will deliver (``keep="last"``, or a new run).
        superseded: the envelope this call replaced before it was ever delivered (``keep="last"``
            on a pending run), so an adapter can clean up what it refers to; None otherwise.
    """

    id: str
    ready_ms: int
    calls: int
    stored: bool
    superseded: bytes | None = None

    @property
    def new_run(self) -> bool:
        return self.calls == 1


@dataclass(frozen=True)
class DeadLetter:
    """An item that failed too often or could not be delivered at all, and why."""

    id: str
    shard: int
    died_ms: int
    error: str
    attempts: int
    ready_ms: int | None
    envelope: bytes | None


@dataclass(frozen=True)
class ShardStats:
    """Counts of one shard at ``now_ms``. ``scheduled`` includes the ``leased`` items.

    ``error`` is set (and the counts are 0) when the shard's keys could not be read, e.g. one
    holds another type after a hand write: the other shards still report.
    """

    shard: int
    scheduled: int
    due: int
    leased: int
    dead: int
    next_ready_ms: int | None
    now_ms: int
    error: str | None = None
    #: items parked out of the due index (see ``ShardKeys.parked``); included in ``scheduled``
    parked: int = 0

    @property
    def oldest_overdue_ms(self) -> int:
        """How long the shard's earliest item has been waiting past its time (0 if none)."""
        if self.next_ready_ms is None:
            return 0
        return max(0, self.now_ms - self.next_ready_ms)


@dataclass
class ScheduleCounts:
    """What a (bulk) schedule did: new ids, replaced ids, and ids kept as they were."""

    added: int = 0
    replaced: int = 0
    kept: int = 0

    def __iadd__(self, other: ScheduleCounts) -> ScheduleCounts:
        self.added += other.added
        self.replaced += other.replaced
        self.kept += other.kept
        return self

    @property
    def total(self) -> int:
        return self.added + self.replaced + self.kept


@dataclass(frozen=True)
class LeaseExtension:
    """What :meth:`DelayStore.extend` did: the ids still under the claim's lease, now held
    until ``deadline_ms`` (server clock); the claim's lease token is unchanged."""

    deadline_ms: int
    held: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DeliveryFailure:
    """An item a target could not deliver, and why. A permanent failure goes to the dead letters
    at once; others are retried with back-off. One that ``waits`` (a periodic entry whose run
    the broker refused) is retried with back-off and no attempt counted: a schedule must not
    end in the dead letters because its broker or its configuration failed for a while."""

    id: str
    error: str
    permanent: bool = False
    waits: bool = False


@dataclass(frozen=True)
class FailedDelivery:
    """A failed delivery as the store records it (:meth:`DelayStore.fail`): retried at
    ``retry_at_ms``, or buried at once when that is None (a permanent error)."""

    id: str
    retry_at_ms: int | None
    error: str


@dataclass(frozen=True)
class FailCounts:
    """What :meth:`DelayStore.fail` did: failed items to be retried, and items buried (their ids
    in ``buried_ids``, for the targets that mirror dead letters: see ``targets.BuryTarget``)."""

    retried: int = 0
    buried: int = 0
    buried_ids: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Parked:
    """What ``park.lua`` did with a claim's unreleasable items: how many it parked, and the
    parking key that holds another type ("" when none; the items were deferred instead)."""

    count: int
    bad_key: str = ""


@dataclass(frozen=True)
class ParkedCounts:
    """What one re-check of a shard's parked items did (``unpark.lua``): released to the due
    index, kept parked until the next look, and stale entries dropped (items gone or moved)."""

    released: int = 0
    kept: int = 0
    stale: int = 0


@dataclass(frozen=True)
class LineRelease:
    """What ``group_release.lua`` did with one group's line in one shard: items released into
    the due index, due items still waiting in the line, and the time the line may next release
    (None: the line is empty)."""

    released: int
    waiting: int
    next_ms: int | None


@dataclass(frozen=True)
class LinePlace:
    """Where an item waits in its group's line (``DelayStore.line_place``): the group, and how
    many items of the group's lines (every shard's) go before it."""

    group: str
    ahead: int


@dataclass(frozen=True)
class TokenGrant:
    """Tokens taken from a queue's rate bucket: the refused rest may go from ``first_slot_ms``
    on, one every ``1000 / rate`` ms (they hold those slots). ``now_ms`` is the server's clock.
    ``reset`` names the bucket's fields that held garbage and were reset ("" when none)."""

    granted: int
    first_slot_ms: int
    now_ms: int
    reset: str = ""


@dataclass(frozen=True)
class SlotGrant:
    """One slot key's answer to the items asking for its slots (``slot_take.lua``).

    Attributes:
        limit: the key's limit as applied (0: none).
        running: holds of the key after the call.
        places: per asking item, in the order asked: -1 when granted, -2 when refused (a
            periodic run's overlap modes), else its place in the key's line of waiting items
            (0: next).
        reset: what was found out of place and dropped ("" when nothing).
        tokens: per asking item, the token its hold was granted with (mode "take"; "" else):
            what its worker reports the hold with, passed in its message.
        heads: the first items in the key's line that a free slot waits for and that did not
            ask in this call (deferred): the caller brings them forward.
        paused: the group is paused (its policy's ``paused``): it grants nothing.
        throttled_until: ms until which the group is throttled (an operator's or a worker's
            throttle), granting nothing; None when it is not.
        rate_until: when an item was refused for the group's rate, the ms at which the bucket
            holds the tokens the first refused item costs; None when none was.
        weight: the group's share when groups compete for releases (policy, else the items', else 1).
        reasons: per asking item, why it was refused ("" when granted, or when it only joined or
            left the line): "limit", "rate", "paused" or "throttled" (mode "take"; the overlap
            modes say "limit" for a skipped run).
        rate_per_s: the group's rate as applied, in tokens (item costs) per second; None: none.
    """

    limit: int
    running: int
    places: tuple[int, ...]
    reset: str = ""
    tokens: tuple[str, ...] = ()
    heads: tuple[str, ...] = ()
    paused: bool = False
    throttled_until: int | None = None
    rate_until: int | None = None
    weight: float = 1.0
    reasons: tuple[str, ...] = ()
    rate_per_s: float | None = None


@dataclass(frozen=True)
class GroupPolicy:
    """A group's policy (:mod:`delayq_backends.group_policies`): set at runtime
    (``DelayStore.set_group``), or a pattern's (``GroupPolicies``). None: not set here.

    Attributes:
        limit: at most this many of its items run at once.
        rate: at most this many of its items (their ``cost``) released per unit, by every
            forwarder together: text ``"N/s"``, ``"N/m"`` or ``"N/h"``.
        weight: its share when groups compete for releases (1 when none is set).
        paused: who paused it ("operator"); it releases nothing until resumed.
        throttled_until: UTC ms until which it releases nothing (a throttle).
        throttled_by: who throttled it ("operator", or ``worker:<item>``).
    """

    limit: int | None = None
    rate: str | None = None
    weight: float | None = None
    paused: str | None = None
    throttled_until: int | None = None
    throttled_by: str | None = None


@dataclass(frozen=True)
class GroupStatus:
    """A group as ``delayq groups`` shows it: its runtime policy, the items of it running (holds
    not lapsed) and the items waiting for it (parked in its lines; before lines, its slot line)."""

    key: str
    policy: GroupPolicy
    running: int
    parked: int


@dataclass(frozen=True)
class SlotStatus:
    """A slot key as ``delayq slots`` shows it: its runtime limit (None: the items' own or
    none), the holds not lapsed, and the items waiting in its line."""

    key: str
    limit: int | None
    running: int
    waiting: int


@dataclass(frozen=True)
class BatchStatus:
    """A batch's progress (:meth:`DelayStore.batch_status`): sub-jobs added (``total``), finished
    (``done``: ``succeeded`` + ``failed``), the first failed ids (at most the store's bound),
    whether it is closed (no more adds) and completed (its on_complete released and its notice
    published, once), and when it was opened and completed (UTC ms; None: not yet)."""

    key: str
    total: int
    done: int
    succeeded: int
    failed: int
    failed_ids: tuple[str, ...]
    closed: bool
    completed: bool
    created_ms: int
    completed_ms: int | None
    on_complete: bool

    def as_dict(self) -> dict[str, object]:
        """The status as JSON-ready values (for the CLI and an HTTP API)."""
        return {**self.__dict__, "failed_ids": list(self.failed_ids)}


@dataclass(frozen=True)
class SlotBoard:
    """Slot keys busiest first (items running plus waiting, then by key), as the dashboard, the
    API and the exporter show them: a page of ``slots``, and the counts over every key.

    Attributes:
        keys: the slot keys in use, listed or not.
        running, waiting: items holding a slot, and waiting for one, summed over every key.
        slots: the keys asked for (a page, or the top N), busiest first.
    """

    keys: int
    running: int
    waiting: int
    slots: list[SlotStatus]


@dataclass(frozen=True)
class RequeuePage:
    """One requeue.lua call: letters requeued, letters kept (no envelope, or the id is scheduled
    again), and letters of the page seen."""

    requeued: int
    skipped: int
    seen: int


#: Every state :class:`Why` reports, in the order ``Reader.why`` tells them apart.
WHY_STATES = (
    "unknown",  # no such item is scheduled, and no dead letter of that id
    "dead",  # a dead letter since since_ms: reason = the error that killed it
    "scheduled",  # not due until until_ms (None: never, a paused or finished periodic entry)
    "due",  # due, no forwarder holds it: the next claim takes it
    "leased",  # a forwarder (forwarder) holds it until until_ms, publishing it
    "awaiting_start",  # published in lossless mode; published again at until_ms unless its worker starts it
    "flow",  # deferred by flow control on queue (a full broker queue, a rate cap) until until_ms
    "group_paused",  # its group is paused (reason: by whom)
    "group_throttled",  # its group is throttled until until_ms (reason: by whom)
    "group_limit",  # its group runs limit items already (running: the first of their ids)
    "group_rate",  # its group is over its rate until until_ms
    "group_line",  # its group has room: ahead items of its line go first
    "parked",  # parked for reason (format:<n>, target:<kind>): looked at again at until_ms
)


@dataclass(frozen=True)
class Why:
    """Why an item is where it is (``Reader.why``, ``delayq why``, ``GET /api/v1/item/why``):
    its ``state`` (one of :data:`WHY_STATES`), the answer in one ``line``, and the details the
    state has (None or empty where it has none).

    Attributes:
        until_ms: when the state ends or is looked at again, when known.
        since_ms: when the state began, when known (a dead letter's death).
        ready_ms: the item's own ready time (a dead letter's, when it recorded one).
        attempts: a dead letter's delivery attempts.
        group: the group that holds it back (group states; or the one it waits in line for).
        running, running_ids: items holding the group's slots, and the first of their ids.
        limit: the group's limit as applied (None: none).
        ahead: items before it in its group's line.
        queue: its destination (flow control holds a queue).
        forwarder: the forwarder that holds it (a lease), when its claim names one.
        reason: a parked item's reason, a dead letter's error, a paused group's pauser.
    """

    id: str
    state: str
    line: str
    until_ms: int | None = None
    since_ms: int | None = None
    ready_ms: int | None = None
    attempts: int | None = None
    group: str | None = None
    running: int | None = None
    running_ids: tuple[str, ...] = ()
    limit: int | None = None
    ahead: int | None = None
    queue: str | None = None
    forwarder: str | None = None
    reason: str | None = None
