"""Groups in the store: a group's runtime policy (limit, rate, weight, paused, a throttle), set
by operators and read by everyone (see :mod:`delayq_backends.group_policies`).

A group is a slot key (:mod:`.slots`): its policy hash (:func:`~delayq_backends.keys.group_policy_key`)
and rate bucket live in its hash tag beside its holds, so ``slot_take.lua`` applies the policy in
the call that takes the group's slots. Operators write the policy hash (HSET, HDEL: the operator
and forwarder roles); a worker throttles a group only by a report on a hold it was given
(:meth:`~.slots.Slots.hold_slots` mode "throttle"), which the next take folds into the policy.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..envelope import MAX_SLOT_LIMIT
from ..errors import InvalidGroupPolicyError
from ..group_policies import (
    MAX_THROTTLE_SECONDS,
    MAX_WEIGHT,
    check_group_key,
    check_limit,
    check_rate,
    check_weight,
)
from ..keys import group_policy_key, slot_holds_key, slot_limit_key, slot_waiting_key
from ..models import GroupPolicy, GroupStatus, SlotBoard, SlotStatus
from .keylist import KeyList
from .slots import KEY_LIST_TTL, STATUS_CHUNK, Slots, _glob_escaped

__all__ = ["GROUP_KEY_NAMES", "POLICY_FIELDS", "UNSET", "Groups", "SlotKeyList", "Unset"]

log = logging.getLogger("delayq.groups")

#: The fields of a group's policy hash, in the order the reads ask for them.
POLICY_FIELDS = ("limit", "rate", "weight", "paused", "throttled_until", "throttled_by")
#: The key names (after the group's tag) that show a group in use.
GROUP_KEY_NAMES = ("holds", "waiting", "waits", "limit", "tokens", "reports", "policy", "bucket")


class Unset(enum.Enum):
    """The type of :data:`UNSET`."""

    UNSET = "unset"


#: "Leave this policy value as it is" (:meth:`Groups.set_group`); None removes a value.
UNSET = Unset.UNSET


class Groups(Slots):
    """Groups: slot keys (:class:`~.slots.Slots`) with a runtime policy. Operators set it
    (:meth:`set_group`, :meth:`pause_group`, :meth:`resume_group`, :meth:`throttle_group`);
    anyone reads it (:meth:`group_policy`, :meth:`group_statuses`, :meth:`groups_in_use`)."""

    def set_group(
        self,
        key: str,
        *,
        limit: int | None | Unset = UNSET,
        rate: str | float | None | Unset = UNSET,
        weight: float | None | Unset = UNSET,
        paused: bool | str | None | Unset = UNSET,
    ) -> None:
        """Set group ``key``'s runtime policy from the next release on, over the items' values
        and the patterns': each value given is set (None or False removes it), the others stay.

        ``limit``: at most this many of its items running; ``rate``: ``"N/s"``, ``"N/m"``,
        ``"N/h"`` or a number per second, by every forwarder together (each item charged its
        cost); ``weight``: its share when groups compete; ``paused``: True (by "operator") or
        who paused it. Setting or removing the limit also removes the older limit string
        (``set_slot_limit`` of an earlier release), so one value is in force.

        Raises:
            InvalidGroupPolicyError: a key or value out of range; nothing was written.
            NotDurableError: with ``durable_replicas``, fewer replicas confirmed it in time.
        """
        check_group_key(key)
        values: dict[str, str] = {}
        gone: list[str] = []
        for name, value, check in (
            ("limit", limit, check_limit),
            ("rate", rate, check_rate),
            ("weight", weight, check_weight),
            ("paused", paused, _check_paused),
        ):
            if value is UNSET:
                continue
            if value is None or value is False:
                gone.append(name)
            else:
                values[name] = str(check(key, value))
        name = group_policy_key(self.config.prefix, key)
        commands: list[tuple[Any, ...]] = []
        if values:
            commands.append(("HSET", name, *(v for pair in values.items() for v in pair)))
        if gone:
            commands.append(("HDEL", name, *gone))
        if limit is not UNSET:
            commands.append(("DEL", slot_limit_key(self.config.prefix, key)))
        if commands:
            self.write_acknowledged(name, *commands)

    def set_slot_limit(self, key: str, limit: int | None) -> None:
        """Let at most ``limit`` items of ``key`` run at once, from the next release on, over the
        limit the items carry; None removes it (the items' own limit applies again, or none).
        The older name of ``set_group(key, limit=limit)``.

        Raises:
            InvalidSlotError: a key or limit that is not one; nothing was written.
            NotDurableError: with ``durable_replicas``, fewer replicas confirmed it in time.
        """
        self.set_group(key, limit=limit)

    def pause_group(self, key: str, by: str = "operator") -> None:
        """Release none of group ``key``'s items, at every forwarder, until :meth:`resume_group`
        (items already released run); ``by``: who paused it, as ``delayq why`` tells."""
        self.set_group(key, paused=by)

    def resume_group(self, key: str) -> None:
        """Release group ``key``'s items again: its pause and any throttle end."""
        check_group_key(key)
        name = group_policy_key(self.config.prefix, key)
        self.write_acknowledged(name, ("HDEL", name, "paused", "throttled_until", "throttled_by"))

    def throttle_group(self, key: str, seconds: float, by: str = "operator") -> int:
        """Release none of group ``key``'s items for ``seconds`` from now (server time), at
        every forwarder, unless it is throttled longer already; the UTC ms it ends.

        Raises:
            InvalidGroupPolicyError: a key, time or name out of range; nothing was written.
        """
        check_group_key(key)
        ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not ok or not 0 < seconds <= MAX_THROTTLE_SECONDS:
            raise InvalidGroupPolicyError(
                f"group {key!r}: throttle for {seconds!r} s: use seconds > 0 and <= {MAX_THROTTLE_SECONDS}"
            )
        by = _check_paused(key, by)
        until = self.clock() + round(seconds * 1000)
        name = group_policy_key(self.config.prefix, key)
        current = self.group_policy(key).throttled_until
        if current is None or current < until:
            self.write_acknowledged(name, ("HSET", name, "throttled_until", str(until), "throttled_by", by))
            return until
        return current

    def group_policy(self, key: str) -> GroupPolicy:
        """Group ``key``'s runtime policy (read-only); values that are garbage read as unset,
        as the scripts treat them."""
        return self.group_statuses([check_group_key(key)])[0].policy

    def groups_in_use(self) -> list[str]:
        """Every group with holds, a line, a policy or a bucket, sorted (SCANs of the prefix's
        group keys and shard lines, every primary's on a cluster: for ``delayq groups``, not a hot path)."""
        start = f"{self.config.prefix}:{{{self.config.prefix}:slot:"
        found: set[str] = set()
        for raw in self.client.scan_iter(match=f"{_glob_escaped(start)}*", count=1000):
            name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            key, sep, kind = name[len(start) :].rpartition("}:")
            if sep and kind in GROUP_KEY_NAMES:
                found.add(key)
        # a group whose items only wait in its shards' lines has no key of its own yet
        lines = f"{self.config.prefix}:{{{self.config.prefix}"
        for raw in self.client.scan_iter(match=f"{_glob_escaped(lines)}*}}:gline:*", count=1000):
            name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            _, sep, key = name.partition("}:gline:")
            if sep and key:
                found.add(key)
        return sorted(found)

    def slot_keys_in_use(self) -> list[str]:
        """The older name of :meth:`groups_in_use` (a slot key is a group)."""
        return self.groups_in_use()

    def group_statuses(self, keys: Sequence[str]) -> list[GroupStatus]:
        """Each group's runtime policy, items running (holds not lapsed) and waiting, in the
        order of ``keys``: one pipelined round per :data:`~.slots.STATUS_CHUNK` groups.

        Raises:
            RedisError: a reply that is no plain error of a key's value (a refused permission, a
                lost connection): an ACL that hides the policy must not read as "no policy".
        """
        now = self.clock()
        prefix = self.config.prefix
        found: list[GroupStatus] = []
        per_key = 4 + len(self._keys)
        for start in range(0, len(keys), STATUS_CHUNK):
            chunk = keys[start : start + STATUS_CHUNK]
            with self.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hmget(group_policy_key(prefix, key), POLICY_FIELDS)
                    pipe.get(slot_limit_key(prefix, key))
                    pipe.zcount(slot_holds_key(prefix, key), f"({now}", "+inf")
                    pipe.zcard(slot_waiting_key(prefix, key))
                    for k in self._keys:  # the group's lines, one per shard, where its items wait
                        pipe.zcard(k.gline(key))
                replies = pipe.execute(raise_on_error=False)
            for i, key in enumerate(chunk):
                fields, alias, running, waiting, *lines = _checked(replies[per_key * i : per_key * (i + 1)])
                # a periodic run buffered by its overlap policy is in both lines: counted once
                parked = max(_count(waiting), sum(map(_count, lines)))
                found.append(GroupStatus(key, _policy(fields, alias, now), _count(running), parked))
        return found

    def slot_status(self, key: str) -> SlotStatus:
        """Slot ``key``'s runtime limit, holds not lapsed and items waiting (read-only)."""
        return self.slot_statuses([key])[0]

    def slot_statuses(self, keys: Sequence[str]) -> list[SlotStatus]:
        """:meth:`slot_status` of each of ``keys``, in their order (:meth:`group_statuses`)."""
        return [SlotStatus(s.key, s.policy.limit, s.running, s.parked) for s in self.group_statuses(keys)]

    def slot_board(self, keys: Sequence[str], *, offset: int = 0, limit: int | None = None) -> SlotBoard:
        """The statuses of ``keys`` busiest first (running plus waiting, then by key), ``limit``
        of them from ``offset`` on, with the counts over all of them (read-only)."""
        statuses = sorted(self.slot_statuses(keys), key=lambda s: (-(s.running + s.waiting), s.key))
        end = None if limit is None else offset + limit
        return SlotBoard(
            keys=len(statuses),
            running=sum(s.running for s in statuses),
            waiting=sum(s.waiting for s in statuses),
            slots=statuses[offset:end],
        )


class SlotKeyList(KeyList):
    """The groups in use (:meth:`Groups.groups_in_use`), listed again at most every ``ttl``
    seconds (see :class:`~.keylist.KeyList`); the statuses of listed keys are read fresh on every
    call (:meth:`Groups.slot_board`)."""

    def __init__(self, store: Groups, *, ttl: float = KEY_LIST_TTL) -> None:
        super().__init__(store.groups_in_use, ttl=ttl)


def _check_paused(key: str, by: Any) -> str:
    """Who paused or throttled a group: True is "operator", else printable text of 1..200."""
    if by is True:
        return "operator"
    if not isinstance(by, str) or not 0 < len(by) <= 200 or not by.isprintable():
        raise InvalidGroupPolicyError(
            f"group {key!r}: paused/throttled by {repr(by)[:80]}: use True or who did it, e.g. 'operator'"
        )
    return by


def _checked(replies: Sequence[object]) -> Sequence[object]:
    """A group's replies, raising those that are no plain error of a key's value (a key of
    another type reads as empty, as the scripts treat it)."""
    for reply in replies:
        if isinstance(reply, Exception) and type(reply) is not ResponseError:
            raise reply
    return replies


def _text(raw: object) -> str | None:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None


def _policy(fields: object, alias: object, now: int) -> GroupPolicy:
    """A policy from its hash's fields (HMGET, in :data:`POLICY_FIELDS` order) and the older
    limit string: each value as the scripts read it (garbage, a lapsed throttle: unset)."""
    limit_text, rate, weight, paused, until, by = (
        [_text(v) for v in fields] if isinstance(fields, list) else [None] * len(POLICY_FIELDS)
    )
    limit = _whole(limit_text, 1, MAX_SLOT_LIMIT)
    if limit is None:  # the older limit string, as slot_take.lua reads it
        limit = _whole(_text(alias), 1, MAX_SLOT_LIMIT)
    throttled = _whole(until, now + 1, now + MAX_THROTTLE_SECONDS * 1000)
    return GroupPolicy(
        limit=limit,
        rate=_rate(rate),
        weight=_weight(weight),
        paused=paused if paused and len(paused) <= 200 else None,
        throttled_until=throttled,
        throttled_by=by if throttled is not None else None,
    )


def _whole(text: str | None, low: int, high: int) -> int | None:
    return int(text) if text is not None and text.isdigit() and low <= int(text) <= high else None


def _rate(text: str | None) -> str | None:
    """A rate as slot_take.lua reads it: ``N/<unit>`` (a bare number is none there)."""
    try:
        return None if text is None or "/" not in text else check_rate("", text)
    except InvalidGroupPolicyError:
        return None


def _weight(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 < value <= MAX_WEIGHT else None


def _count(reply: object) -> int:
    """A count read back; a key of another type (an error reply) reads as empty."""
    return reply if isinstance(reply, int) else 0
