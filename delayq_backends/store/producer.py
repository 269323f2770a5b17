"""The producer's API: schedule, reschedule and cancel items, durably on request, each alone or
inside a caller's pipeline (``pipeline=``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

import redis

from ..envelope import Envelope, GroupSpec, Slot, SlotSpec, with_groups, with_rate_key, with_slot
from ..errors import BatchError, ConfigError, InvalidIdError, StoreFullError
from ..keys import ShardKeys, collapse_id, normalize_id, shard_of
from ..models import Cancelled, CancelOutcome, Collapsed, RearmOutcome, RescheduleOutcome, ScheduleCounts, ScheduleItem
from ..scripts.library import ScriptCall
from ..scripts.store import Cancel, Debounce, GroupSchedule, LineItem, Rearm, Reschedule, Schedule, ScheduleOne
from ..timeutil import When, to_ms
from .base import Payload, StoreCore
from .batches import add_to_batch, check_batch_key, fail_in_batches, take_back, with_batch
from .glines import line_group

__all__ = ["CALLS_TTL_MS", "KEEP", "SCHEDULE_CHUNK", "Producer", "ScheduleEntry"]

#: (id, when, envelope) or (id, when, envelope, rank).
ScheduleEntry = tuple[str | bytes, When, Payload] | tuple[str | bytes, When, Payload, int]

#: Items per schedule script call: big enough to amortize the round trip, small enough not
#: to block Redis for long (a call of 500 runs in about a millisecond).
SCHEDULE_CHUNK = 500

#: How long a debounced item's call counter outlives its run's ready time: it only feeds
#: ``delayq list`` and the dashboard, so it goes away with keys that are not called again.
CALLS_TTL_MS = 86_400_000
#: Whose arguments a collapsed run keeps.
KEEP = ("first", "last")

R = TypeVar("R")


def _keyed(envelope: Payload, rate_key: str | None) -> Payload:
    """``envelope`` carrying ``rate_key`` (unchanged without one)."""
    if rate_key is None:
        return envelope
    return with_rate_key(envelope if isinstance(envelope, Envelope) else Envelope.decode(envelope), rate_key)


def _outcome(counts: ScheduleCounts) -> str:
    """A single item's schedule, in words."""
    return "added" if counts.added else "replaced" if counts.replaced else "kept"


def _in_line(item: ScheduleItem) -> LineItem | None:
    """``item`` as an item of its group's line, None when it carries no group."""
    group = line_group(item.envelope)
    return None if group is None else LineItem(item.id, item.ready_ms, item.rank, group, envelope=item.envelope)


def _keep(mode: str) -> bool:
    if mode not in ("replace", "keep"):
        raise ConfigError(f"mode={mode!r}: use 'replace' or 'keep'")
    return mode == "keep"


def _slotted(envelope: Payload, slot: SlotSpec | None, rank: int) -> Payload:
    """``envelope`` carrying concurrency ``slot`` (unchanged without one)."""
    if slot is None:
        return envelope
    decoded = envelope if isinstance(envelope, Envelope) else Envelope.decode(envelope)
    return with_slot(decoded, Slot.parse(slot), rank)


def _grouped(envelope: Payload, group: GroupSpec | None) -> Payload:
    """``envelope`` carrying ``group`` (one group or a list, see :func:`~delayq_backends.envelope.parse_groups`);
    unchanged without one."""
    if group is None:
        return envelope
    return with_groups(envelope if isinstance(envelope, Envelope) else Envelope.decode(envelope), group)


class Producer(StoreCore):
    """Writes of the producer role (ACL role ``producer``)."""

    @overload
    def schedule(
        self, item_id: str | bytes, when: When, envelope: Payload, *, mode: str = ..., rank: int = ...,
        rate_key: str | None = ..., slot: SlotSpec | None = ..., group: GroupSpec | None = ...,
        batch: str | None = ...,
    ) -> str: ...  # fmt: skip

    @overload
    def schedule(
        self, item_id: str | bytes, when: When, envelope: Payload, *, mode: str = ..., rank: int = ...,
        rate_key: str | None = ..., slot: SlotSpec | None = ..., group: GroupSpec | None = ...,
        batch: str | None = ..., pipeline: Any,
    ) -> None: ...  # fmt: skip

    def schedule(
        self,
        item_id: str | bytes,
        when: When,
        envelope: Payload,
        *,
        mode: str = "replace",
        rank: int = 0,
        rate_key: str | None = None,
        slot: SlotSpec | None = None,
        group: GroupSpec | None = None,
        batch: str | None = None,
        pipeline: Any = None,
    ) -> str | None:
        """Schedule one item; returns ``"added"``, ``"replaced"`` or ``"kept"``.

        Args:
            item_id: unique id (a task or job id); scheduling an existing id again replaces it
                (``mode="replace"``) or leaves it (``mode="keep"``).
            when: aware ``datetime``, ``timedelta`` from now, or epoch seconds.
            envelope: what to deliver, as an :class:`Envelope` or its encoded bytes.
            rank: 0..MAX_RANK; when more is due than can be forwarded at once, higher ranks are
                claimed first (then earliest first). Rank 0, the default, costs nothing extra.
            rate_key: who the item is for (a tenant, a customer): forwarders with ``--key-rate``
                for its queue forward each key's items at most at that rate. Stored in the envelope.
            slot: a concurrency slot, a key or ``{"key": ..., "limit": N}``: forwarders release
                the item only while fewer than the key's limit of its items run (see
                :mod:`delayq_backends.slots`). Stored in the envelope.
            group: the item's group, or a list of up to 3 (a tenant, an endpoint; the first is
                its line group): a key, or ``{"key": ..., "limit": N, "rate": "N/s", "weight": W,
                "cost": C}`` (see :class:`~delayq_backends.envelope.Group`). Forwarders release
                the item only when each of its groups admits it. ``slot`` and ``rate_key`` are
                groups too (aliases), and count towards the 3. Stored in the envelope.
            batch: the key of an open batch (:meth:`open_batch`): the item is counted into it
                first, and taken back out if its schedule fails. Not with ``pipeline``.
            pipeline: a caller's pipeline or MULTI/EXEC on the store's own server (not a
                cluster): the schedule is queued there (returns None) and is stored if and only
                if the caller's EXEC runs. Input is checked now, so bad input raises before
                anything is queued. With ``durable_replicas``, call :meth:`confirm_durable`
                after the EXEC (the RQ queue does): WAIT cannot run inside it.

        Raises:
            InvalidTimeError, InvalidIdError, InvalidRankError, InvalidRateKeyError, InvalidSlotError,
            InvalidGroupError, PayloadTooLargeError, EnvelopeError: bad input; nothing was stored.
            BatchClosedError, BatchError: ``batch`` is closed, no batch, or given with ``pipeline``.
        """
        keep = _keep(mode)
        if batch is not None:  # named in the envelope: a cancel or purge of the item reports it
            envelope = with_batch(envelope, check_batch_key(batch))
        item = self.check_item(item_id, when, _grouped(_slotted(_keyed(envelope, rate_key), slot, rank), group), rank)
        if batch is not None:
            return self._schedule_in_batch(batch, item, keep, pipeline)
        return self._schedule_item(item, keep, pipeline)

    def _schedule_in_batch(self, batch: str, item: ScheduleItem, keep: bool, pipeline: Any) -> str | None:
        """Count ``item`` into ``batch``, then schedule it; take it back if the schedule fails, or
        the batch would wait for a sub-job that never runs."""
        if pipeline is not None:
            raise BatchError(f"batch {batch!r}: a sub-job cannot join a caller's pipeline; schedule it without one")
        add_to_batch(self, batch, [item.id])
        try:
            return self._schedule_item(item, keep, None)
        except BaseException:
            take_back(self, batch, item.id)
            raise

    def _schedule_item(self, item: ScheduleItem, keep: bool, pipeline: Any) -> str | None:
        shard = shard_of(item.id, self.config.shards)
        # one script call, without the bulk path's grouping: this is every apply_async's cost
        lined = _in_line(item)
        if lined is not None:  # born parked in its group's line: no claim reads it before its group can take it
            call = lambda k: self._line_call(k, [lined], keep)  # noqa: E731
        elif keep:
            call = lambda k: Schedule.call(k, [item], keep=True, wake=self._wake)  # noqa: E731
        else:  # the usual case, in the script for one item
            call = lambda k: ScheduleOne.call(k, item, wake=self._wake)  # noqa: E731
        counts = self._write_or_queue(call, shard, pipeline)
        return None if counts is None else _outcome(counts)

    def schedule_with(
        self,
        build: Callable[[ShardKeys, ScheduleItem, str], ScriptCall[ScheduleCounts]],
        item_id: str | bytes,
        when: When,
        envelope: Payload,
        *,
        rank: int = 0,
        client: Any = None,
    ) -> str:
        """:meth:`schedule` (replace mode) through an adapter's script, which writes the item as
        ``includes/schedule_item.lua`` does and the adapter's own keys beside it, in one call (the
        RQ queue's job hash: :class:`~delayq_backends.scripts.rq.RqSchedule`). Durable as
        :meth:`schedule`: with ``durable_replicas``, the call and a WAIT travel together.

        Args:
            build: the script call, from the item's shard keys, the checked item and the wake channel.
            client: where to run it, by default the store's client: a client of the store's own
                (non-cluster) server whose user may write the adapter's keys.

        Raises:
            As :meth:`schedule`; nothing was stored.
        """
        item = self.check_item(item_id, when, envelope, rank)
        shard = shard_of(item.id, self.config.shards)
        return _outcome(self._write(lambda keys: build(keys, item, self._wake), shard, client))

    def debounce(
        self,
        key: str,
        when: When,
        envelope: Payload,
        *,
        keep: str = "last",
        rank: int = 0,
        rate_key: str | None = None,
        group: GroupSpec | None = None,
    ) -> Collapsed:
        """Schedule ``key``'s one run at ``when``; calls while it is pending move it there too,
        so it fires once, at the LAST call's time (a ``timedelta`` is the quiet window).

        All calls of a key go to one item, ``"debounce:<key>"``, in one script call on its shard.
        A call made once a forwarder holds the run (it may be out already) starts the next run.

        Args:
            key: what collapses (a user id, a document id): text, as an item id.
            when: this call's ready time: aware ``datetime``, ``timedelta`` from now, epoch seconds.
            envelope: what this call would deliver.
            keep: ``"last"`` (default): the run delivers the latest call's envelope and rank;
                ``"first"``: the envelope of the call that started the run.
            rank, rate_key, group: as in :meth:`schedule`.

        Raises:
            ConfigError: ``keep`` is not "first" or "last". InvalidIdError, InvalidTimeError,
            InvalidRankError, InvalidRateKeyError, InvalidGroupError, PayloadTooLargeError,
            EnvelopeError: bad input; nothing was stored.
        """
        return self._collapse("debounce", key, when, _grouped(_keyed(envelope, rate_key), group), keep, rank)

    def throttle(
        self,
        key: str,
        when: When,
        envelope: Payload,
        *,
        keep: str = "last",
        rank: int = 0,
        rate_key: str | None = None,
        group: GroupSpec | None = None,
    ) -> Collapsed:
        """Schedule ``key``'s one run at ``when`` unless one is pending: then the call joins it,
        and the run keeps the FIRST call's time. Same arguments as :meth:`debounce`; the item
        is ``"throttle:<key>"``, so a key's debounce and throttle are separate runs."""
        return self._collapse("throttle", key, when, _grouped(_keyed(envelope, rate_key), group), keep, rank)

    def _collapse(self, mode: str, key: str, when: When, envelope: Payload, keep: str, rank: int) -> Collapsed:
        if keep not in KEEP:
            raise ConfigError(f"keep={keep!r}: use 'first' (the first call's arguments) or 'last' (the latest's)")
        if not isinstance(key, str) or not key:
            raise InvalidIdError(f"{mode} key {key!r}: pass non-empty text, e.g. a user or document id")
        item = self.check_item(collapse_id(mode, key), when, envelope, rank)
        return self._write(
            lambda k: Debounce.call(k, item, mode=mode, keep=keep, calls_ttl_ms=CALLS_TTL_MS, wake=self._wake),
            shard_of(item.id, self.config.shards),
        )

    def schedule_many(self, entries: Iterable[ScheduleEntry], *, mode: str = "replace") -> ScheduleCounts:
        """Schedule many items with one script call per shard and chunk, streamed.

        An entry is ``(id, when, envelope)`` or ``(id, when, envelope, rank)``. Every entry is
        validated before anything is sent, so bad input stores nothing.
        """
        checked = [self.check_item(*entry) if len(entry) == 4 else self.check_item(*entry, 0) for entry in entries]
        return self.schedule_checked(checked, mode=mode)

    def schedule_checked(self, items: Iterable[ScheduleItem], *, mode: str = "replace") -> ScheduleCounts:
        """:meth:`schedule_many` of items already checked: ids from :func:`~delayq_backends.keys.normalize_id`,
        ready times in integer ms from :func:`~delayq_backends.timeutil.to_ms`, envelopes from
        :meth:`check_payload`, ranks from :func:`check_rank` (or :meth:`check_item`, all four).

        Bulk loaders check each row themselves, to set bad rows aside with their reason instead of
        failing a whole batch, and then skip checking them twice.
        """
        keep = _keep(mode)
        by_shard: dict[tuple[int, bool], list[ScheduleItem | LineItem]] = defaultdict(list)
        for item in items:
            lined = _in_line(item)
            by_shard[shard_of(item.id, self.config.shards), lined is not None].append(lined or item)
        chunks = [
            (key, items[i : i + SCHEDULE_CHUNK])
            for key, items in by_shard.items()
            for i in range(0, len(items), SCHEDULE_CHUNK)
        ]
        # built as they are sent, so the server runs one chunk while the next is built; grouped
        # items are born parked in their lines
        calls = (
            (shard, self._line_call(self._keys[shard], chunk, keep))  # type: ignore[arg-type]
            if grouped
            else (shard, Schedule.call(self._keys[shard], chunk, keep=keep, wake=self._wake))  # type: ignore[arg-type]
            for (shard, grouped), chunk in chunks
        )
        counts = ScheduleCounts()
        refused: list[str] = []
        first_error: Exception | None = None
        replies = self._write_calls(calls)
        for (_, chunk), reply in zip(chunks, replies):
            if isinstance(reply, Exception):
                first_error = first_error or reply
                refused += [item.id for item in chunk]
            else:
                counts += reply
        if isinstance(first_error, StoreFullError) and counts.total:
            raise StoreFullError(
                f"the delay store reached its maxmemory during a bulk schedule: {counts.total} items were "
                f"stored, {len(refused)} were not (StoreFullError.not_stored lists them); free memory or "
                "raise maxmemory, then schedule those again (scheduling is idempotent by id)",
                stored=counts.total,
                not_stored=refused,
            ) from first_error
        if first_error is not None:
            raise first_error
        return counts

    def _line_call(self, keys: ShardKeys, items: list[LineItem], keep: bool) -> ScriptCall[ScheduleCounts]:
        """The schedule of grouped ``items`` on one shard, born parked in their lines."""
        return GroupSchedule.call(keys, items, keep=keep, wake=self._wake)

    @overload
    def reschedule(self, item_id: str | bytes, when: When) -> RescheduleOutcome: ...

    @overload
    def reschedule(self, item_id: str | bytes, when: When, *, pipeline: Any) -> None: ...

    def reschedule(self, item_id: str | bytes, when: When, *, pipeline: Any = None) -> RescheduleOutcome | None:
        """Move an existing item to ``when``; starts its attempts again.

        Returns RESCHEDULED (truthy), NOT_FOUND, or IN_FLIGHT when a forwarder holds it leased:
        it may be published already, so it is left alone instead of being delivered now and
        again at ``when``. Both others are falsy, so ``if store.reschedule(...)`` means "moved".
        With ``pipeline``, queued there (returns None).
        """
        item_id = normalize_id(item_id)
        ready = to_ms(when, clock=self.clock)
        return self._write_or_queue(
            lambda k: Reschedule.call(k, item_id, ready, wake=self._wake), self.shard_of(item_id), pipeline
        )

    @overload
    def cancel(self, item_id: str | bytes) -> CancelOutcome: ...

    @overload
    def cancel(self, item_id: str | bytes, *, pipeline: Any) -> None: ...

    def cancel(self, item_id: str | bytes, *, pipeline: Any = None) -> CancelOutcome | None:
        """Remove a scheduled item (O(log N)).

        Returns CANCELLED (truthy), NOT_FOUND, or IN_FLIGHT when a forwarder held it leased: it is
        removed, but may have been published already, so it may still run once. A CANCELLED
        sub-job of a batch is reported to it as failed (:meth:`cancel_item` says which batch).
        With ``pipeline``, queued there (returns None; a sub-job is not reported: use
        ``finish_in_batch(key, id, False)``).
        """
        item_id = normalize_id(item_id)
        if pipeline is not None:
            return self._write_or_queue(lambda k: Cancel.call(k, item_id), self.shard_of(item_id), pipeline)
        return self.cancel_item(item_id).outcome

    def cancel_item(self, item_id: str | bytes) -> Cancelled:
        """:meth:`cancel`, and the batch the item was a sub-job of, reported to as failed (it
        will never run, and its batch would wait for ever): None for no batch, or an item still
        in flight (it may run, and report its own end). One read more than a bare cancel."""
        item_id = normalize_id(item_id)
        shard = self.shard_of(item_id)
        envelope = self.client.hget(self.keys(shard).items, item_id)
        outcome = self._write(lambda k: Cancel.call(k, item_id), shard)
        reported = fail_in_batches(self, {item_id: envelope}) if outcome is CancelOutcome.CANCELLED else {}
        return Cancelled(outcome, reported.get(item_id))

    def replace_if(
        self,
        item_id: str,
        expected: bytes,
        when: When,
        envelope: Payload,
        *,
        rank: int = 0,
        now: int | None = None,
    ) -> RearmOutcome:
        """Give an item a new ready time, envelope and rank if its envelope is still ``expected``
        and no forwarder holds it under a live lease (a compare-and-set, for a periodic sync).

        Returns REPLACED, CHANGED (its envelope changed since it was read: read it again),
        HELD (being forwarded now: try again shortly) or NOT_FOUND. ``now`` overrides the
        server clock for "a lease past its deadline" (tests).
        """
        item = self.check_item(item_id, when, envelope, rank)
        return self._write(
            lambda k: Rearm.call(k, item, lease="", expected=expected, now=self.script_now(now), wake=self._wake),
            shard_of(item.id, self.config.shards),
        )

    def replace_envelope(self, item_id: str | bytes, old: bytes, new: Payload, *, dead: bool = False) -> bool:
        """Swap a scheduled item's (or, with ``dead``, a dead letter's) envelope for ``new`` if it
        still is ``old``; its ready time, rank, attempts and lease stay as they are.

        For operators' format upgrades (``delayq rq-upgrade``): a compare-and-set, so an item
        forwarded, cancelled or scheduled again meanwhile is left alone (False; read it again).
        """
        self.check_meta()
        item_id = normalize_id(item_id)
        data = self.check_payload(item_id, new)
        shard = self.shard_of(item_id)
        key = self._keys[shard].dead_items if dead else self._keys[shard].items
        with self._node_client(shard).pipeline() as pipe:
            for _ in range(20):  # WATCH covers the whole hash: retry while other items change
                try:
                    pipe.watch(key)
                    if pipe.hget(key, item_id) != old:
                        return False
                    pipe.multi()
                    pipe.hset(key, item_id, data)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        return False
