"""The delay store: sharded sorted sets in Redis, changed only through the Lua scripts.

One API per role, as the ACL roles are: :class:`Producer` (schedule, reschedule, cancel),
:class:`Forwarding` (claim under a :class:`Lease`, then ack, release, defer, fail, extend) and
:class:`Reader` (get, list, stats, histogram, dead letters); :class:`Starts` (workers' start records);
:class:`Slots` (concurrency slots) within :class:`Groups` (their policies) and :class:`GroupLines`
(the groups' per-shard lines); :class:`Batches` (batches of sub-jobs). :class:`DelayStore` is all of them.
See ``docs/architecture.md`` for the key layout and the lease protocol.
"""

from __future__ import annotations

from .base import Payload, StoreCore, check_rank
from .batches import BATCH_TTL_MS, MAX_FAILED_IDS, Batches
from .glines import GroupLines
from .groups import UNSET, Groups, SlotKeyList, Unset
from .lease import Forwarding, Lease
from .periodic import HistoryRead, PeriodicRecords
from .producer import SCHEDULE_CHUNK, Producer, ScheduleEntry
from .reader import DEAD_CHUNK, Reader
from .slots import (
    KEY_LIST_TTL,
    MAX_HOLD_MS,
    RUN_HOLD_MS,
    START_HOLD_MS,
    WAIT_MS,
    SlotAsk,
    SlotRun,
    Slots,
    slot_member,
)
from .starts import NOT_A_STRING, Starts, is_start_record

__all__ = [
    "BATCH_TTL_MS",
    "MAX_FAILED_IDS",
    "Batches",
    "Groups",
    "HistoryRead",
    "PeriodicRecords",
    "UNSET",
    "Unset",
    "KEY_LIST_TTL",
    "MAX_HOLD_MS",
    "RUN_HOLD_MS",
    "START_HOLD_MS",
    "WAIT_MS",
    "slot_member",
    "DEAD_CHUNK",
    "SCHEDULE_CHUNK",
    "NOT_A_STRING",
    "DelayStore",
    "Forwarding",
    "GroupLines",
    "Lease",
    "Payload",
    "Producer",
    "Reader",
    "ScheduleEntry",
    "SlotAsk",
    "SlotRun",
    "SlotKeyList",
    "Slots",
    "Starts",
    "StoreCore",
    "check_rank",
    "is_start_record",
]


class DelayStore(Producer, Forwarding, Reader, Starts, Groups, GroupLines, Batches):
    """Schedule, claim and acknowledge delayed items: every role's API on one client.

    Built like each role alone (see :class:`~.base.StoreCore` for the arguments); users' code
    that does everything with one store uses this, the forwarder and the roles' ACL users the
    role they need.
    """
