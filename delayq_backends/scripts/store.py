"""The store's scripts as typed calls: one class per ``.lua`` file, which names the keys the
script touches (in its ``KEYS`` order), puts the arguments in its ``ARGV`` order, and reads the
reply into a record of :mod:`delayq_backends.models`.

Each ``call(...)`` returns a :class:`~delayq_backends.scripts.library.ScriptCall`: run it with
``ScriptRunner.run`` or queue it on a pipeline with ``ScriptRunner.queue``. A new script is a
``.lua`` file plus one class here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

from ..keys import ShardKeys, batch_channel, batch_item_id
from ..models import (
    CancelOutcome,
    Claim,
    ClaimedItem,
    Collapsed,
    FailCounts,
    FailedDelivery,
    LeaseExtension,
    LineRelease,
    Parked,
    ParkedCounts,
    RearmOutcome,
    RequeuePage,
    RescheduleOutcome,
    ScheduleCounts,
    ScheduleItem,
    SlotGrant,
    TokenGrant,
)
from .library import ScriptCall

__all__ = [
    "Ack",
    "BatchAdd",
    "BatchEnd",
    "BatchEnding",
    "BatchOpen",
    "Cancel",
    "ClaimScript",
    "Debounce",
    "DeadLimits",
    "Defer",
    "Extend",
    "Fail",
    "GroupPark",
    "GroupRelease",
    "GroupSchedule",
    "Keep",
    "Park",
    "PeriodicRun",
    "PeriodicRegistry",
    "PeriodicTrust",
    "Promote",
    "Purge",
    "Rearm",
    "Release",
    "Requeue",
    "Reschedule",
    "RunEvent",
    "Schedule",
    "ScheduleOne",
    "ShardScript",
    "SlotEnd",
    "SlotTake",
    "SyncVersion",
    "Take",
    "Unpark",
    "schedule_counts",
]

R = TypeVar("R")


@dataclass(frozen=True)
class DeadLimits:
    """What the scripts that bury keep of a shard's dead letters (0: no limit)."""

    max_letters: int = 0
    ttl_ms: int = 0


class ShardScript:
    """A script on the keys of one shard. Subclasses name the script and its keys (attributes of
    :class:`~delayq_backends.keys.ShardKeys`, in the script's ``KEYS`` order)."""

    name: ClassVar[str]
    key_names: ClassVar[tuple[str, ...]]
    _keys_of: ClassVar[Callable[[ShardKeys], tuple[str, ...]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "key_names" in cls.__dict__:  # read in one C call: this runs on every script call
            get: Callable[[ShardKeys], Any] = attrgetter(*cls.key_names)
            cls._keys_of = get if len(cls.key_names) > 1 else lambda keys: (get(keys),)

    @classmethod
    def keys_of(cls, keys: ShardKeys) -> tuple[str, ...]:
        return cls._keys_of(keys)

    @classmethod
    def _call(cls, keys: ShardKeys, args: Iterable[Any], parse: Callable[[Any], R]) -> ScriptCall[R]:
        return ScriptCall(cls.name, cls.keys_of(keys), tuple(args), parse)


class Schedule(ShardScript):
    name = "schedule"
    key_names = ("due", "items", "tries", "leased", "ranked")

    @classmethod
    def call(
        cls, keys: ShardKeys, items: Sequence[ScheduleItem], *, keep: bool, wake: str
    ) -> ScriptCall[ScheduleCounts]:
        """Schedule ``items``; with ``keep``, an existing id stays as it is.

        The items go as columns in the order ZADD and HSET take them, which the script passes
        on without a loop: (ready, id) pairs, (id, envelope) pairs, and ranks only when one is
        not 0 (most batches have none, and an argument per item costs the script time)."""
        n, ranked = len(items), any(item.rank for item in items)
        ids, readies = [i.id for i in items], [i.ready_ms for i in items]
        args: list[Any] = [None] * (4 + 4 * n)  # filled by slices: a loop per item costs more
        args[:4] = ["keep" if keep else "replace", wake, int(ranked), min(readies)]
        args[4 : 4 + 2 * n : 2], args[5 : 4 + 2 * n : 2] = readies, ids
        args[4 + 2 * n :: 2], args[5 + 2 * n :: 2] = ids, [i.envelope for i in items]
        if ranked:
            args += [i.rank for i in items]
        return cls._call(keys, args, schedule_counts)


class ScheduleOne(ShardScript):
    """schedule_one.lua: one item in replace mode, the call behind every single ``schedule()``."""

    name = "schedule_one"
    key_names = Schedule.key_names

    @classmethod
    def call(cls, keys: ShardKeys, item: ScheduleItem, *, wake: str) -> ScriptCall[ScheduleCounts]:
        return cls._call(keys, (item.id, item.ready_ms, item.envelope, item.rank, wake), schedule_counts)


def schedule_counts(reply: Any) -> ScheduleCounts:
    """A schedule script's ``{added, replaced, kept}``."""
    return ScheduleCounts(*map(int, reply))


class Reschedule(ShardScript):
    name = "reschedule"
    key_names = ("due", "items", "tries", "leased", "ranked")

    @classmethod
    def call(cls, keys: ShardKeys, item_id: str, ready_ms: int, *, wake: str) -> ScriptCall[RescheduleOutcome]:
        return cls._call(keys, [item_id, ready_ms, wake], lambda r: _RESCHEDULED[int(r)])


class Cancel(ShardScript):
    name = "cancel"
    key_names = ("due", "items", "tries", "leased")

    @classmethod
    def call(cls, keys: ShardKeys, item_id: str) -> ScriptCall[CancelOutcome]:
        return cls._call(keys, [item_id], lambda r: _CANCELLED[int(r)])


class ClaimScript(ShardScript):
    """claim.lua (named so beside the :class:`~delayq_backends.models.Claim` it returns)."""

    name = "claim"
    key_names = ("due", "items", "tries", "leased", "dead", "dead_items", "dead_info", "ranked")

    @classmethod
    def call(
        cls,
        keys: ShardKeys,
        *,
        shard: int,
        token: str,
        limit: int,
        lease_ms: int,
        max_attempts: int,
        now: int,
        dead: DeadLimits,
        max_payload_bytes: int = 0,
    ) -> ScriptCall[Claim]:
        def parse(reply: Any) -> Claim:
            # one pass over the flat reply, positionally: this runs once per claimed item.
            # Ids are UTF-8 (claim.lua buries any other before leasing it), ready times "%d".
            fields = iter(reply)
            deadline = int(next(fields))
            items = [
                ClaimedItem(item_id.decode(), envelope, int(attempts), int(ready))
                for item_id, envelope, attempts, ready in zip(fields, fields, fields, fields)
            ]
            return Claim(shard=shard, deadline_ms=deadline, token=token, items=items)

        args = [limit, lease_ms, max_attempts, now, token, dead.max_letters, dead.ttl_ms, max_payload_bytes]
        return cls._call(keys, args, parse)


class Ack(ShardScript):
    name = "ack"
    key_names = ("due", "items", "tries", "leased")

    @classmethod
    def call(cls, keys: ShardKeys, lease: str, ids: Sequence[str]) -> ScriptCall[int]:
        return cls._call(keys, [lease, *ids], int)


class Release(ShardScript):
    name = "release"
    key_names = ("due", "tries", "leased")

    @classmethod
    def call(cls, keys: ShardKeys, lease: str, ids: Sequence[str], *, wake: str) -> ScriptCall[int]:
        return cls._call(keys, [lease, wake, *ids], int)


class Defer(ShardScript):
    name = "defer"
    key_names = ("due", "tries", "leased", "ranked")

    @classmethod
    def call(cls, keys: ShardKeys, lease: str, later: Iterable[tuple[str, int]]) -> ScriptCall[int]:
        """Give back ``later``'s (id, not-before ms) under ``lease``."""
        return cls._call(keys, [lease, *(f for pair in later for f in pair)], int)


class Park(ShardScript):
    """park.lua: leased items this forwarder cannot release, parked out of the due index."""

    name = "park"
    key_names = ("due", "tries", "leased", "ranked", "parked", "parked_why")

    @classmethod
    def call(cls, keys: ShardKeys, lease: str, reasons: Mapping[str, str], *, recheck_ms: int) -> ScriptCall[Parked]:
        """Park ``reasons``' ids (id -> reason) under ``lease``, looked at again at ``recheck_ms``."""
        args = [lease, recheck_ms, *(f for pair in reasons.items() for f in pair)]
        return cls._call(keys, args, lambda r: Parked(int(r[0]), _text(r[1])))


class Unpark(ShardScript):
    """unpark.lua: a re-check of parked items: released, or kept parked until ``later_ms``."""

    name = "unpark"
    key_names = ("due", "leased", "ranked", "parked", "parked_why")

    @classmethod
    def call(
        cls, keys: ShardKeys, release: Sequence[bytes], keep: Sequence[bytes], *, later_ms: int, now: int, wake: str
    ) -> ScriptCall[ParkedCounts]:
        """Release ``release`` (due now) and keep ``keep`` parked until ``later_ms``: those still parked."""
        args = [now, wake, later_ms, len(release), *release, *keep]
        return cls._call(keys, args, lambda r: ParkedCounts(int(r[0]), int(r[1]), int(r[2])))


@dataclass(frozen=True)
class LineItem:
    """An item for a group line: its id, ready ms, rank and line group's key (and, scheduled,
    its envelope; put back in line, the time its group may take it)."""

    id: str
    ready_ms: int
    rank: int
    group: str
    envelope: bytes = b""
    until_ms: int = 0


def _lines(keys: ShardKeys, groups: Iterable[str]) -> tuple[list[str], list[str]]:
    """The distinct groups of ``groups`` in order, and their lines' keys in that order."""
    named = list(dict.fromkeys(groups))
    return named, [keys.gline(g) for g in named]


class GroupSchedule(ShardScript):
    """group_schedule.lua: grouped items scheduled born parked in their groups' lines."""

    name = "group_schedule"
    key_names = ("due", "items", "tries", "leased", "ranked", "gready")

    @classmethod
    def call(cls, keys: ShardKeys, items: Sequence[LineItem], *, keep: bool, wake: str) -> ScriptCall[ScheduleCounts]:
        """Schedule ``items``; with ``keep``, an existing id stays as it is."""
        named, lines = _lines(keys, (i.group for i in items))
        index = {g: n for n, g in enumerate(named, 1)}
        args: list[Any] = ["keep" if keep else "replace", wake, len(named), *named]
        for i in items:
            args += (i.id, i.ready_ms, i.envelope, i.rank, index[i.group])
        return ScriptCall(cls.name, (*cls.keys_of(keys), *lines), tuple(args), schedule_counts)


class GroupRelease(ShardScript):
    """group_release.lua: up to each group's allowance of its line's heads into the due index."""

    name = "group_release"
    key_names = ("due", "leased", "ranked", "parked", "parked_why", "gready")

    @classmethod
    def call(
        cls, keys: ShardKeys, allowances: Sequence[tuple[str, int, int]], *, now: int
    ) -> ScriptCall[tuple[list[LineRelease], str]]:
        """``allowances``: (group, most to release, held-until ms or 0) per group, distinct. The
        reply: each group's release, and the keys found holding another type ("" when none)."""
        args: list[Any] = [now]
        for group, allowance, held_until in allowances:
            args += (group, allowance, held_until)

        def parse(reply: Any) -> tuple[list[LineRelease], str]:
            lines, reset = reply
            return [LineRelease(int(r), int(w), None if int(at) < 0 else int(at)) for r, w, at in lines], _text(reset)

        lines = [keys.gline(g) for g, _, _ in allowances]
        return ScriptCall(cls.name, (*cls.keys_of(keys), *lines), tuple(args), parse)


class GroupPark(ShardScript):
    """group_park.lua: leased items their group refused, back in its line."""

    name = "group_park"
    key_names = ("due", "tries", "leased", "ranked", "parked", "parked_why", "gready")

    @classmethod
    def call(
        cls, keys: ShardKeys, lease: str, items: Sequence[LineItem], *, recheck_at: int
    ) -> ScriptCall[tuple[int, int]]:
        """Put ``items`` (under ``lease``) in their lines, each group looked at again at its
        ``until_ms``; a parked re-check looks at them at ``recheck_at``. The reply: how many were
        under the lease, and how many of those were deferred instead (a key of another type)."""
        named, lines = _lines(keys, (i.group for i in items))
        index = {g: n for n, g in enumerate(named, 1)}
        args: list[Any] = [lease, recheck_at, len(named), *named]
        for i in items:
            args += (i.id, index[i.group], i.rank, i.until_ms)
        return ScriptCall(cls.name, (*cls.keys_of(keys), *lines), tuple(args), lambda r: (int(r[0]), int(r[1])))


class Promote(ShardScript):
    """promote.lua: deferred items brought forward to now (the head of a slot key's line)."""

    name = "promote"
    key_names = ("due", "leased", "ranked")

    @classmethod
    def call(cls, keys: ShardKeys, ids: Sequence[str], *, now: int, wake: str) -> ScriptCall[int]:
        """Bring ``ids`` forward (those deferred); how many were."""
        return cls._call(keys, [now, wake, *ids], int)


class Keep(ShardScript):
    """keep.lua: lossless mode's ack (items kept awaiting their start)."""

    name = "keep"
    key_names = ("due", "leased", "ranked")

    @classmethod
    def call(cls, keys: ShardKeys, lease: str, windows: Mapping[str, int], *, now: int) -> ScriptCall[int]:
        """Keep ``windows``' ids (id -> window ms) under ``lease``, each due again its window from now."""
        return cls._call(keys, [lease, now, *(f for pair in windows.items() for f in pair)], int)


class Fail(ShardScript):
    name = "fail"
    key_names = ("due", "items", "tries", "leased", "dead", "dead_items", "dead_info", "ranked")

    @classmethod
    def call(
        cls,
        keys: ShardKeys,
        lease: str,
        failures: Iterable[FailedDelivery],
        *,
        max_attempts: int,
        now: int,
        dead: DeadLimits,
    ) -> ScriptCall[FailCounts]:
        args: list[Any] = [lease, max_attempts, now, dead.max_letters, dead.ttl_ms]
        for f in failures:
            args += (f.id, "" if f.retry_at_ms is None else f.retry_at_ms, f.error)
        return cls._call(keys, args, lambda r: FailCounts(int(r[0]), int(r[1]), tuple(i.decode() for i in r[2:])))


class Extend(ShardScript):
    name = "extend"
    key_names = ("due", "leased")

    @classmethod
    def call(
        cls, keys: ShardKeys, lease: str, ids: Sequence[str], *, lease_ms: int, now: int
    ) -> ScriptCall[LeaseExtension]:
        return cls._call(
            keys,
            [lease, lease_ms, now, *ids],
            lambda r: LeaseExtension(deadline_ms=int(r[0]), held=[i.decode() for i in r[1:]]),
        )


class Debounce(ShardScript):
    """debounce.lua: one call of a debounced or throttled key. Besides the shard's keys it takes
    the item's call counter, ``ShardKeys.calls(id)`` (a key per item, so not an attribute)."""

    name = "debounce"
    key_names = ("due", "items", "tries", "leased", "ranked", "calls")

    @classmethod
    def call(
        cls, keys: ShardKeys, item: ScheduleItem, *, mode: str, keep: str, calls_ttl_ms: int, wake: str
    ) -> ScriptCall[Collapsed]:
        def parse(reply: Any) -> Collapsed:
            calls, ready_ms, stored, superseded = reply
            return Collapsed(item.id, int(ready_ms), int(calls), bool(int(stored)), superseded or None)

        shard_keys = tuple(getattr(keys, name) for name in cls.key_names[:-1])
        args = (mode, keep, wake, item.id, item.ready_ms, item.envelope, item.rank, calls_ttl_ms)
        return ScriptCall(cls.name, (*shard_keys, keys.calls(item.id)), args, parse)


class Rearm(ShardScript):
    name = "rearm"
    key_names = ("due", "items", "tries", "leased", "ranked")

    @classmethod
    def call(
        cls, keys: ShardKeys, item: ScheduleItem, *, lease: str, expected: bytes, now: int, wake: str
    ) -> ScriptCall[RearmOutcome]:
        """Replace ``item`` if held under ``lease`` (or, with ``lease=""``, under no live lease)
        and its envelope is still ``expected`` (``b""``: any)."""
        args = [lease, expected, now, wake, item.id, item.ready_ms, item.envelope, item.rank]
        return cls._call(keys, args, lambda r: _REARMED[int(r)])


class Requeue(ShardScript):
    name = "requeue"
    key_names = ("due", "items", "dead", "dead_items", "dead_info", "ranked")

    @classmethod
    def ids(cls, keys: ShardKeys, ids: Sequence[str], *, ready_ms: int, wake: str) -> ScriptCall[RequeuePage]:
        """Requeue the dead letters ``ids``."""
        return cls._call(keys, [ready_ms, wake, "ids", *ids], _requeue_page)

    @classmethod
    def page(cls, keys: ShardKeys, offset: int, count: int, *, ready_ms: int, wake: str) -> ScriptCall[RequeuePage]:
        """Requeue ``count`` dead letters from ``offset``, oldest first."""
        return cls._call(keys, [ready_ms, wake, "all", offset, count], _requeue_page)


class Purge(ShardScript):
    name = "purge"
    key_names = ("dead", "dead_items", "dead_info")

    @classmethod
    def ids(cls, keys: ShardKeys, ids: Sequence[str | bytes]) -> ScriptCall[int]:
        """Delete the dead letters ``ids`` (as stored: bytes for an id that is no UTF-8)."""
        return cls._call(keys, ["ids", *ids], int)

    @classmethod
    def oldest(cls, keys: ShardKeys, count: int) -> ScriptCall[int]:
        """Delete the shard's ``count`` oldest dead letters."""
        return cls._call(keys, ["all", count], int)


class Take:
    """take.lua: tokens from a queue's rate bucket (one key, not a shard's)."""

    name = "take"

    @classmethod
    def call(cls, bucket: str, wanted: int, *, rate: float, burst: int, now: int) -> ScriptCall[TokenGrant]:
        return ScriptCall(
            cls.name,
            (bucket,),
            (repr(float(rate)), burst, wanted, now),
            lambda r: TokenGrant(granted=int(r[0]), first_slot_ms=int(r[1]), now_ms=int(r[2]), reset=_text(r[3])),
        )


class SlotTake:
    """slot_take.lua: slots of one group (its slot keys, policy and bucket: one hash tag, not a shard's)."""

    name = "slot_take"
    MODES = ("take", "join", "leave", "skip", "buffer")

    @classmethod
    def call(
        cls,
        keys: tuple[str, ...],
        asking: Sequence[tuple[str, int, str, int]],
        *,
        limit: int,
        hold_ms: int,
        wait_ms: int,
        cap_ms: int,
        now: int,
        mode: str = "take",
        rate: str | None = None,
        weight: float | None = None,
    ) -> ScriptCall[SlotGrant]:
        """``keys``: the group's keys in ``keys.GROUP_KEYS`` order; ``asking``: (member, order,
        token, cost) of each item, in its order (token "": a hold any report may end; cost: the
        tokens of the group's rate it takes); ``limit`` 0, ``rate`` and ``weight`` None: the items
        carry none (the group's policy wins over them); ``cap_ms``: the most a reported start,
        beat or throttle holds from now; ``mode``: "take", "join" (the items only take their
        places in the line), "leave" (they give them up), or a periodic run's overlap policy at
        fire time, "skip" or "buffer" (see :mod:`delayq_backends.overlap`)."""
        if mode not in cls.MODES:
            raise ValueError(f"mode={mode!r}: use one of {cls.MODES}")
        args: list[Any] = [limit, hold_ms, wait_ms, now, mode, cap_ms, rate or "", "" if weight is None else weight]
        for member, order, token, cost in asking:
            args += (member, order, token, cost)
        return ScriptCall(cls.name, keys, tuple(args), _slot_grant)


def _slot_grant(r: Any) -> SlotGrant:
    """slot_take.lua's reply as a record (see its Output)."""
    return SlotGrant(
        int(r[0]),
        int(r[1]),
        tuple(int(p) for p in r[3]),
        _text(r[2]),
        heads=tuple(_text(m) for m in r[4]),
        reasons=tuple(_text(why) for why in r[5]),
        paused=bool(r[6]),
        throttled_until=int(r[7]) or None,
        rate_until=int(r[8]) or None,
        weight=float(r[9]),
        rate_per_s=float(r[10]) if r[10] else None,
    )


class BatchOpen:
    """batch_open.lua: a batch's hash, made once."""

    name = "batch_open"

    @classmethod
    def call(
        cls, keys: ShardKeys, key: str, *, on_complete: bytes, mark: str, now: int, ttl_ms: int
    ) -> ScriptCall[int]:
        return ScriptCall(
            cls.name, (keys.batch(key), keys.batch_fired(key)), (on_complete, mark, now, ttl_ms, key), int
        )


class BatchAdd:
    """batch_add.lua: sub-jobs counted into a batch ("add") or taken back ("remove")."""

    name = "batch_add"
    MODES = ("add", "remove")

    @classmethod
    def call(cls, keys: ShardKeys, key: str, mode: str, members: Sequence[str]) -> ScriptCall[int]:
        return ScriptCall(cls.name, (keys.batch(key), keys.batch_members(key)), (mode, key, *members), int)


@dataclass(frozen=True)
class BatchEnding:
    """What every batch_end.lua call of a store passes besides the mode: the failed ids kept, the
    wake channel and the prefix (of the batch's channel)."""

    max_failed_ids: int
    wake: str
    prefix: str


class BatchEnd:
    """batch_end.lua: a batch closed or one sub-job's end recorded, and the batch completed in
    the same call when that was the last (the on_complete item goes into the shard's keys)."""

    name = "batch_end"
    key_names = ("due", "items", "tries", "leased", "ranked")

    @classmethod
    def call(
        cls,
        keys: ShardKeys,
        key: str,
        mode: str,
        *,
        ending: BatchEnding,
        now: int,
        member: str = "",
        ok: bool = True,
    ) -> ScriptCall[tuple[int, bool]]:
        shard = attrgetter(*cls.key_names)(keys)
        batch = (
            keys.batch(key), keys.batch_members(key), keys.batch_done(key), keys.batch_failed(key),
            keys.batch_fired(key), keys.batch_firing(key),
        )  # fmt: skip
        args = (
            mode, now, ending.wake, batch_channel(ending.prefix, key), batch_item_id(key), key,
            ending.max_failed_ids, member, "1" if ok else "0",
        )  # fmt: skip
        return ScriptCall(cls.name, (*shard, *batch), args, lambda r: (int(r[0]), bool(int(r[1]))))


class SlotEnd:
    """slot_end.lua: a forwarder gives back holds of one slot key (workers report theirs)."""

    name = "slot_end"

    @classmethod
    def call(
        cls, keys: tuple[str, str, str], members: Sequence[str], *, wake: str, group: str
    ) -> ScriptCall[tuple[int, tuple[str, ...]]]:
        """``keys``: the slot key's holds, tokens and waiting keys; ``group`` is published on
        channel ``wake`` when a hold ended. The reply: how many were held (-1: garbage holds) and
        the heads of the line to bring forward."""
        args = (wake, group, *members)
        return ScriptCall(cls.name, keys, args, lambda r: (int(r[0]), tuple(_text(m) for m in r[1])))


def _text(reply: Any) -> str:
    """A script's string reply as text (garbage bytes it echoes stay readable)."""
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def _requeue_page(reply: Any) -> RequeuePage:
    return RequeuePage(requeued=int(reply[0]), skipped=int(reply[1]), seen=int(reply[2]))


#: The scripts' small-integer replies (0 not there, 1 done, 2 leased, 3 changed) as outcomes.
_CANCELLED = (CancelOutcome.NOT_FOUND, CancelOutcome.CANCELLED, CancelOutcome.IN_FLIGHT)
_RESCHEDULED = (RescheduleOutcome.NOT_FOUND, RescheduleOutcome.RESCHEDULED, RescheduleOutcome.IN_FLIGHT)
_REARMED = (RearmOutcome.NOT_FOUND, RearmOutcome.REPLACED, RearmOutcome.HELD, RearmOutcome.CHANGED)

#: Every shard script, by script name (a test checks each against its .lua header).
SHARD_SCRIPTS: dict[str, type[ShardScript]] = {
    s.name: s
    for s in (
        Schedule,
        ScheduleOne,
        Reschedule,
        Cancel,
        ClaimScript,
        Ack,
        Release,
        Defer,
        Park,
        Unpark,
        Promote,
        Keep,
        Fail,
        Extend,
        Rearm,
        Requeue,
        Purge,
        Debounce,
        GroupSchedule,
        GroupRelease,
        GroupPark,
    )
}


@dataclass(frozen=True)
class RunEvent:
    """One event of a periodic entry's run for periodic_run.lua: ``detail`` is the periods missed
    (published) or the outcome (finished); ``kind`` "" keeps the record's."""

    event: str
    run_id: str
    due_ms: int
    kind: str = ""
    detail: str = ""


class PeriodicRun:
    """periodic_run.lua: one event of a periodic entry's run recorded in its bounded history."""

    name = "periodic_run"
    EVENTS = ("published", "started", "finished", "missed")

    @classmethod
    def call(
        cls, keys: tuple[str, str], event: RunEvent, *, keep: int, ttl_ms: int, late_ms: int, now: int = 0
    ) -> ScriptCall[int]:
        """``keys``: the entry's history hash and runs ZSET (``ShardKeys.periodic_history``/``periodic_runs``)."""
        args = (event.event, event.run_id, event.due_ms, now, event.kind, event.detail, keep, ttl_ms, late_ms)
        return ScriptCall(cls.name, keys, args, int)


class PeriodicRegistry:
    """periodic_registry.lua: periodic entries' lines added to or removed from the registry,
    each name's 1 (changed) or 0; -1: the key is of another type."""

    name = "periodic_registry"

    #: names one ``remove`` takes (a sweep's page fits; Lua's unpack is bounded)
    MAX_REMOVE = 1000

    @classmethod
    def add(cls, key: str, name: str, item_id: str) -> ScriptCall[list[int] | int]:
        return ScriptCall(cls.name, (key,), ("add", name, item_id), _ints_or_code)

    @classmethod
    def remove(cls, key: str, names: Sequence[str]) -> ScriptCall[list[int] | int]:
        """Remove the lines of ``names`` (at most :data:`MAX_REMOVE`) in one call."""
        return ScriptCall(cls.name, (key,), ("remove", *names[: cls.MAX_REMOVE]), _ints_or_code)


def _ints_or_code(reply: Any) -> list[int] | int:
    return [int(r) for r in reply] if isinstance(reply, list) else int(reply)


class PeriodicTrust:
    """periodic_trust.lua: an operator's definition of an entry's run template recorded
    (``add``: its digest, the previous one kept) or dropped (``drop``); -1: the key is of
    another type."""

    name = "periodic_trust"

    #: names one ``drop`` takes (a sweep's page of removed entries fits; Lua's unpack is bounded)
    MAX_DROP = 1000

    @classmethod
    def call(cls, key: str, name: str, digest: str) -> ScriptCall[int]:
        """Record ``digest`` as entry ``name``'s definition."""
        return ScriptCall(cls.name, (key,), ("add", name, digest), int)

    @classmethod
    def drop(cls, key: str, names: Sequence[str]) -> ScriptCall[int]:
        """Drop the definitions of entries ``names`` (at most :data:`MAX_DROP`) in one call."""
        return ScriptCall(cls.name, (key,), ("drop", *names[: cls.MAX_DROP]), int)


class SyncVersion:
    """sync_version.lua: a code schedule's version checked and recorded in one step, per kind of
    entry; the reply (the record before the call) is read by ``parse``."""

    name = "sync_version"
    #: the record's fields, each kept as ``<kind>:<field>``
    FIELDS = ("version", "fp", "synced_at", "host")

    @classmethod
    def call(
        cls, key: str, kind: str, version: str, fingerprint: str, host: str, parse: Callable[[Any], R], *, now: int = 0
    ) -> ScriptCall[R]:
        return ScriptCall(cls.name, (key,), (version, fingerprint, host, now, kind), parse)
