"""The delay store: sharded sorted sets in Redis, changed only through the Lua scripts.

See ``docs/architecture.md`` for the key layout and the lease protocol.
"""

from __future__ import annotations

import heapq
import json
import secrets
from collections import defaultdict
from contextlib import contextmanager
from functools import partial
from itertools import islice
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import redis

from .config import Config
from .connection import Client, connect, is_cluster
from .envelope import FORMAT_VERSION, MAGIC, Envelope, with_rate_key
from .errors import (
    ConfigError,
    EnvelopeError,
    InvalidIdError,
    InvalidRankError,
    NotDurableError,
    PayloadTooLargeError,
    ShardMismatchError,
    StoreFullError,
)
from .keys import (
    LAYOUT,
    MAX_RANK,
    RANK_SPAN,
    ShardKeys,
    collapse_id,
    collapsed_key,
    key_rate_key,
    meta_key,
    normalize_id,
    rate_key,
    shard_of,
    shard_tags,
    wake_channel,
)
from .models import (
    CancelOutcome,
    Claim,
    ClaimedItem,
    Collapsed,
    DeadLetter,
    LeaseExtension,
    RearmOutcome,
    RescheduleOutcome,
    ScheduleCounts,
    ScheduledItem,
    ShardStats,
)
from .scripts import Scripts
from .timeutil import Clock, ServerClock, When, score_ms, to_ms

__all__ = ["DelayStore", "Payload", "ScheduleEntry", "check_rank"]

Payload = Union[Envelope, bytes]
#: (id, when, envelope) or (id, when, envelope, rank).
ScheduleEntry = Union[Tuple[Union[str, bytes], When, Payload], Tuple[Union[str, bytes], When, Payload, int]]
#: A checked entry: (id, ready ms, envelope bytes) or with a checked rank as fourth field.
CheckedEntry = Union[Tuple[str, int, bytes], Tuple[str, int, bytes, int]]

#: Items per schedule script call: big enough to amortize the round trip, small enough not
#: to block Redis for long (a call of 500 runs in about a millisecond).
SCHEDULE_CHUNK = 500
#: Dead letters per requeue/purge script call: about 25 ms of server time on a busy 2-core box, so requeueing or
#: purging any number never holds Redis for long (one call for 200k held it for seconds).
DEAD_CHUNK = 500
#: How long a debounced item's call counter outlives its run's ready time: it only feeds
#: ``delayq list`` and the dashboard, so it goes away with keys that are not called again.
CALLS_TTL_MS = 86_400_000
#: Whose arguments a collapsed run keeps.
KEEP = ("first", "last")


def check_rank(rank: int) -> int:
    """``rank`` if it is an integer in 0..MAX_RANK.

    Raises:
        InvalidRankError: anything else; nothing was stored.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
        raise InvalidRankError(
            f"rank={rank!r}: pass an int in 0..{MAX_RANK} (0, the default, for most items; higher is claimed "
            "first when more is due than the forwarders can take at once)"
        )
    return rank


class DelayStore:
    """Schedule, claim and acknowledge delayed items.

    Items are spread over ``shards`` sorted sets by ``crc32(id)``; each call touches one
    shard, so the store runs unchanged on Redis Cluster. The store never starts a server.

    Args:
        client: a ``redis.Redis`` or ``RedisCluster`` created with ``decode_responses=False``.
        config: prefix, shard count and limits; ``config.url`` is not used here.
        clock: "now" for ``timedelta`` ready times; tests may pass a fake one. By default the
            server's clock (read once, advanced with a monotonic clock), the one every claim uses,
            so a producer whose wall clock is off schedules neither early nor late.
    """

    def __init__(self, client: Client, config: Optional[Config] = None, *, clock: Optional[Clock] = None) -> None:
        self.client = client
        self.config = config or Config()
        self.clock: Clock = clock if clock is not None else ServerClock(self.server_time_ms)
        self.scripts = Scripts.register(client)
        self.cluster = is_cluster(client)
        self._shard_keys: Optional[List[ShardKeys]] = None
        self._wake = wake_channel(self.config.prefix)
        self._meta_checked = False

    @classmethod
    def from_url(cls, url: str, **settings: Any) -> DelayStore:
        """Connect to ``url`` and build a store with ``settings`` as :class:`Config` fields."""
        config = Config.from_mapping({"url": url, **settings})
        return cls(connect(url), config)

    # -- layout -----------------------------------------------------------------------------

    @property
    def shards(self) -> int:
        return self.config.shards

    @property
    def wake_channel(self) -> str:
        return self._wake

    @property
    def _keys(self) -> List[ShardKeys]:
        """Every shard's keys, in the layout recorded for the prefix (read once)."""
        if self._shard_keys is None:
            layout, shards = self.client.hmget(meta_key(self.config.prefix), "layout", "shards")
            # a prefix that records shards but no layout was made before layouts were recorded
            found = int(layout) if layout is not None else 1 if shards is not None else LAYOUT
            tags = shard_tags(self.config.prefix, self.config.shards, found)
            self._shard_keys = [ShardKeys(self.config.prefix, k, tags[k]) for k in range(self.config.shards)]
        return self._shard_keys

    def shard_of(self, item_id: Union[str, bytes]) -> int:
        """The shard holding ``item_id``."""
        return shard_of(normalize_id(item_id), self.config.shards)

    def keys(self, shard: int) -> ShardKeys:
        return self._keys[shard]

    def check_meta(self, *, record: bool = True) -> None:
        """Refuse a shard count that differs from the one recorded in Redis.

        Writers (``record=True``) record the count on first use; readers only compare, so a
        mistyped count in a read-only tool never fixes the layout of an empty prefix.

        Raises:
            ShardMismatchError: another shard count was recorded for this prefix.
        """
        if self._meta_checked:
            return
        key = meta_key(self.config.prefix)
        if record:
            if self.client.hget(key, "shards") is None:
                # a new prefix: its layout goes in first, so shards without a layout means "made before"
                self.client.hsetnx(key, "layout", LAYOUT)
                self._shard_keys = None  # read the layout again: another writer may have been first
            self.client.hsetnx(key, "shards", self.config.shards)
            self.client.hsetnx(key, "format", FORMAT_VERSION)
        stored = self.client.hget(key, "shards")
        if stored is None:
            return
        recorded = int(stored)
        if recorded != self.config.shards:
            raise ShardMismatchError(
                f"prefix {self.config.prefix!r} holds {recorded} shards in Redis but this client is "
                f"configured with {self.config.shards}: set shards={recorded} (DELAYQ_SHARDS / "
                f"--shards / delayq_shards), or use a new prefix for a different layout"
            )
        self._meta_checked = True

    def _run(
        self, script: Any, shard: int, args: Sequence[Any], client: Any = None, extra_keys: Sequence[str] = ()
    ) -> Any:
        self.check_meta()
        with _full_store_said_plainly():
            keys = [*self._keys[shard].all(), *extra_keys]
            return script(keys=keys, args=list(args), client=client or self.client)

    # -- scheduling -------------------------------------------------------------------------

    def schedule(
        self,
        item_id: Union[str, bytes],
        when: When,
        envelope: Payload,
        *,
        mode: str = "replace",
        rank: int = 0,
        rate_key: Optional[str] = None,
    ) -> str:
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

        Raises:
            InvalidTimeError, InvalidIdError, InvalidRankError, InvalidRateKeyError,
            PayloadTooLargeError, EnvelopeError: bad input; nothing was stored.
        """
        if mode not in ("replace", "keep"):
            raise ConfigError(f"mode={mode!r}: use 'replace' or 'keep'")
        item_id = normalize_id(item_id)
        envelope = _keyed(envelope, rate_key)
        item = (item_id, to_ms(when, clock=self.clock), self.check_payload(item_id, envelope), check_rank(rank))
        # one script call, without the bulk path's grouping: this is every apply_async's cost
        counts = ScheduleCounts(
            *self._write(self.scripts.schedule, self.shard_of(item_id), [mode, self._wake, *_schedule_args([item])])
        )
        return "added" if counts.added else "replaced" if counts.replaced else "kept"

    def schedule_many(self, entries: Iterable[ScheduleEntry], *, mode: str = "replace") -> ScheduleCounts:
        """Schedule many items with one script call per shard and chunk, pipelined.

        An entry is ``(id, when, envelope)`` or ``(id, when, envelope, rank)``. Every entry is
        validated before anything is sent, so bad input stores nothing.
        """
        checked: List[CheckedEntry] = []
        for item_id, when, envelope, *rank in entries:
            item_id = normalize_id(item_id)
            ready = to_ms(when, clock=self.clock)
            checked.append((item_id, ready, self.check_payload(item_id, envelope), check_rank(rank[0] if rank else 0)))
        return self.schedule_checked(checked, mode=mode)

    def schedule_checked(self, entries: Iterable[CheckedEntry], *, mode: str = "replace") -> ScheduleCounts:
        """:meth:`schedule_many` of entries already checked: ids from :func:`~delayq_backends.keys.normalize_id`,
        ready times in integer ms from :func:`~delayq_backends.timeutil.to_ms`, envelopes from
        :meth:`check_payload`, ranks (when given) from :func:`check_rank`.

        Bulk loaders check each row themselves, to set bad rows aside with their reason instead of
        failing a whole batch, and then skip checking them twice.
        """
        if mode not in ("replace", "keep"):
            raise ConfigError(f"mode={mode!r}: use 'replace' or 'keep'")
        by_shard: dict[int, List[Tuple[str, int, bytes, int]]] = defaultdict(list)
        for item_id, ready, data, *rank in entries:
            by_shard[shard_of(item_id, self.config.shards)].append((item_id, ready, data, rank[0] if rank else 0))
        calls = [
            (shard, [mode, self._wake, *_schedule_args(items[i : i + SCHEDULE_CHUNK])])
            for shard, items in by_shard.items()
            for i in range(0, len(items), SCHEDULE_CHUNK)
        ]
        counts = ScheduleCounts()
        refused: List[str] = []
        first_error: Optional[Exception] = None
        for (_, args), reply in zip(calls, self._write_calls(self.scripts.schedule, calls)):
            if isinstance(reply, Exception):
                first_error = first_error or reply
                refused += args[3 :: int(args[2])]  # the ids: args are mode, wake, width, items
            else:
                counts += ScheduleCounts(*reply)
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

    def check_payload(self, item_id: str, envelope: Payload) -> bytes:
        """The envelope's bytes, refused when they are no envelope or over ``max_payload_bytes``.

        Raises:
            EnvelopeError, PayloadTooLargeError: nothing may be stored.
        """
        data = envelope.encode() if isinstance(envelope, Envelope) else envelope
        if not isinstance(data, (bytes, bytearray)) or not data.startswith(MAGIC):
            raise EnvelopeError(
                f"envelope for {item_id!r} must be an Envelope or its encoded bytes, got "
                f"{type(data).__name__} {bytes(data[:16]) if isinstance(data, (bytes, bytearray)) else ''!r}: "
                "build one with Envelope(target, destination, body).encode()"
            )
        if len(data) > self.config.max_payload_bytes:
            raise PayloadTooLargeError(
                f"item {item_id!r} is {len(data)} bytes, over max_payload_bytes="
                f"{self.config.max_payload_bytes}: store large data elsewhere and schedule a reference "
                "to it, or raise the limit"
            )
        return bytes(data)

    def _run_calls(self, script: Any, calls: List[tuple[int, List[Any]]]) -> Iterator[Any]:
        """Run ``script`` once per (shard, args), pipelined where the client allows it.

        Yields each call's reply, or its error (a Redis error reply, or :class:`StoreFullError`),
        so a caller can tell which calls of a bulk write were stored.
        """
        if not calls:
            return
        self.check_meta()
        # One call needs no pipeline (a pipeline with a script costs a SCRIPT EXISTS round trip),
        # and redis-py cannot pipeline scripts across cluster slots.
        if self.cluster or len(calls) == 1:
            for shard, args in calls:
                yield _reply_or_error(partial(self._run, script, shard, args))
            return
        it = iter(calls)
        while batch := list(islice(it, 64)):
            with self.client.pipeline(transaction=False) as pipe:
                for shard, args in batch:
                    self._run(script, shard, args, client=pipe)
                replies = pipe.execute(raise_on_error=False)
            for reply in replies:
                yield _reply_or_error(partial(_raised, reply)) if isinstance(reply, Exception) else reply

    def schedule_in(
        self, pipeline: Any, item_id: Union[str, bytes], when: When, envelope: Payload, *, rank: int = 0
    ) -> None:
        """Queue a ``replace`` schedule of one item on ``pipeline``, to commit with the caller's writes.

        For adapters whose broker is the store's own Redis (not a cluster): the item is stored
        if and only if the caller's MULTI/EXEC runs. Input is validated now, so bad input raises
        before anything is queued.
        """
        item_id = normalize_id(item_id)
        ready = to_ms(when, clock=self.clock)
        data = self.check_payload(item_id, envelope)
        args = ["replace", self._wake, *_schedule_args([(item_id, ready, data, check_rank(rank))])]
        self._queue_script(pipeline, "schedule", self.shard_of(item_id), args)

    def debounce(
        self,
        key: str,
        when: When,
        envelope: Payload,
        *,
        keep: str = "last",
        rank: int = 0,
        rate_key: Optional[str] = None,
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
            rank, rate_key: as in :meth:`schedule`.

        Raises:
            ConfigError: ``keep`` is not "first" or "last". InvalidIdError, InvalidTimeError,
            InvalidRankError, PayloadTooLargeError, EnvelopeError: bad input; nothing was stored.
        """
        return self._collapse("debounce", key, when, _keyed(envelope, rate_key), keep, rank)

    def throttle(
        self,
        key: str,
        when: When,
        envelope: Payload,
        *,
        keep: str = "last",
        rank: int = 0,
        rate_key: Optional[str] = None,
    ) -> Collapsed:
        """Schedule ``key``'s one run at ``when`` unless one is pending: then the call joins it,
        and the run keeps the FIRST call's time. Same arguments as :meth:`debounce`; the item
        is ``"throttle:<key>"``, so a key's debounce and throttle are separate runs."""
        return self._collapse("throttle", key, when, _keyed(envelope, rate_key), keep, rank)

    def _collapse(self, mode: str, key: str, when: When, envelope: Payload, keep: str, rank: int) -> Collapsed:
        if keep not in KEEP:
            raise ConfigError(f"keep={keep!r}: use 'first' (the first call's arguments) or 'last' (the latest's)")
        if not isinstance(key, str) or not key:
            raise InvalidIdError(f"{mode} key {key!r}: pass non-empty text, e.g. a user or document id")
        item_id = normalize_id(collapse_id(mode, key))
        ready = to_ms(when, clock=self.clock)
        data = self.check_payload(item_id, envelope)
        shard = self.shard_of(item_id)
        args = [mode, keep, self._wake, item_id, ready, data, check_rank(rank), CALLS_TTL_MS]
        calls, run_ms, stored, superseded = self._write(
            self.scripts.debounce, shard, args, extra_keys=[self._keys[shard].calls(item_id)]
        )
        return Collapsed(item_id, int(run_ms), int(calls), bool(int(stored)), superseded or None)

    # -- producer writes, durable on request ----------------------------------------------

    def _write(self, script: Any, shard: int, args: Sequence[Any], extra_keys: Sequence[str] = ()) -> Any:
        """Run a producer's write script; with ``durable_replicas``, wait for the replicas too."""
        if not self.config.durable_replicas:
            return self._run(script, shard, args, extra_keys=extra_keys)
        return self._durable(script, shard, args, extra_keys)

    def _write_calls(self, script: Any, calls: List[tuple[int, List[Any]]]) -> Iterator[Any]:
        if not self.config.durable_replicas:
            yield from self._run_calls(script, calls)
            return
        for shard, args in calls:
            yield _reply_or_error(partial(self._durable, script, shard, args))

    def _durable(self, script: Any, shard: int, args: Sequence[Any], extra_keys: Sequence[str] = ()) -> Any:
        """The script and a WAIT in one pipeline on the connection of the shard's node.

        WAIT counts the replicas that have the writes made *on its own connection*, so both must
        travel together. On a cluster whose layout just changed (a failover), the cluster client
        refreshes its slot map and the call is tried once more.
        """
        wanted, timeout = self.config.durable_replicas, self.config.durable_timeout_ms
        for attempt in (1, 2):
            try:
                with self._node_client(shard).pipeline(transaction=False) as pipe:
                    self._run(script, shard, args, client=pipe, extra_keys=extra_keys)
                    pipe.execute_command("WAIT", wanted, timeout)
                    with _full_store_said_plainly():
                        result, acked = pipe.execute()
                break
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                if not self.cluster or attempt == 2 or isinstance(exc, redis.OutOfMemoryError):
                    raise
                self.client.nodes_manager.initialize()  # type: ignore[union-attr]
        if int(acked) < wanted:
            raise NotDurableError(
                f"shard {shard}: written to the primary but confirmed by {acked} of {wanted} replicas within "
                f"{timeout} ms, so a failover now could lose it; retry (scheduling is idempotent by id) "
                "or check the replicas"
            )
        return result

    def _node_client(self, shard: int) -> redis.Redis:
        """A client of the one server that holds ``shard`` (the store's own when not a cluster)."""
        if not self.cluster:
            return self.client  # type: ignore[return-value]
        node = self.client.get_node_from_key(self._keys[shard].due)  # type: ignore[union-attr]
        return node.redis_connection  # type: ignore[no-any-return]

    def reschedule(self, item_id: Union[str, bytes], when: When) -> RescheduleOutcome:
        """Move an existing item to ``when``; starts its attempts again.

        Returns RESCHEDULED (truthy), NOT_FOUND, or IN_FLIGHT when a forwarder holds it leased:
        it may be published already, so it is left alone instead of being delivered now and
        again at ``when``. Both others are falsy, so ``if store.reschedule(...)`` means "moved".
        """
        item_id = normalize_id(item_id)
        ready = to_ms(when, clock=self.clock)
        done = int(self._write(self.scripts.reschedule, self.shard_of(item_id), [item_id, ready, self._wake]))
        return _RESCHEDULED[done]

    def cancel(self, item_id: Union[str, bytes]) -> CancelOutcome:
        """Remove a scheduled item (O(log N)).

        Returns CANCELLED (truthy), NOT_FOUND, or IN_FLIGHT when a forwarder held it leased: it is
        removed, but may have been published already, so it may still run once.
        """
        item_id = normalize_id(item_id)
        done = int(self._write(self.scripts.cancel, self.shard_of(item_id), [item_id]))
        return _CANCELLED[done]

    # -- the lease protocol -----------------------------------------------------------------

    def claim(
        self, shard: int, *, limit: int = 200, lease_ms: Optional[int] = None, now: Optional[int] = None
    ) -> Claim:
        """Lease up to ``limit`` due items of ``shard``: ranked ones first (highest rank, then
        earliest), then the rest earliest first.

        ``now`` overrides the server clock (tests and the in-process testing store only).
        """
        lease = self.config.lease_ms if lease_ms is None else lease_ms
        token = secrets.token_hex(8)
        reply = self._run(
            self.scripts.claim, shard, [limit, lease, self.config.max_attempts, now or 0, token, *self._dead_limits]
        )
        items = [
            ClaimedItem(
                id=reply[i].decode(),  # UTF-8: claim.lua buries any other id before leasing it
                envelope=reply[i + 1],
                attempts=int(reply[i + 2]),
                ready_ms=int(float(reply[i + 3])),
            )
            for i in range(1, len(reply), 4)
        ]
        return Claim(shard=shard, deadline_ms=int(reply[0]), token=token, items=items)

    def ack(self, claim: Claim, ids: Optional[Iterable[str]] = None) -> int:
        """Delete delivered items of ``claim`` (all by default) still under its lease."""
        ids = [item.id for item in claim.items] if ids is None else list(ids)
        if not ids:
            return 0
        return int(self._run(self.scripts.ack, claim.shard, [claim.lease, *ids]))

    def ack_in(self, pipeline: Any, claim: Claim, ids: Sequence[str]) -> None:
        """Queue :meth:`ack` of ``ids`` on ``pipeline`` (a transaction on the store's own server),
        so a target can commit its publish and the ack in one MULTI/EXEC."""
        if ids:
            self._queue_script(pipeline, "ack", claim.shard, [claim.lease, *ids])

    def rearm(self, claim: Claim, item_id: str, when: When, envelope: Payload, *, rank: int = 0) -> RearmOutcome:
        """Ack a claimed item and schedule it again (new ready time, envelope and rank) in one
        step, only while it is still under ``claim``'s lease: the next run of a periodic entry.

        A forwarder killed before this call leaves the item leased (it is claimed again when
        the lease runs out); after it, the next run stands. Either way exactly one next run.
        Returns REPLACED, HELD (no longer ours: nothing changed) or NOT_FOUND (cancelled).
        """
        return self._rearm(claim.lease, b"", 0, item_id, when, envelope, rank)

    def replace_if(
        self,
        item_id: str,
        expected: bytes,
        when: When,
        envelope: Payload,
        *,
        rank: int = 0,
        now: Optional[int] = None,
    ) -> RearmOutcome:
        """Give an item a new ready time, envelope and rank if its envelope is still ``expected``
        and no forwarder holds it under a live lease (a compare-and-set, for a periodic sync).

        Returns REPLACED, CHANGED (its envelope changed since it was read: read it again),
        HELD (being forwarded now: try again shortly) or NOT_FOUND. ``now`` overrides the
        server clock for "a lease past its deadline" (tests).
        """
        return self._rearm("", expected, now or 0, item_id, when, envelope, rank)

    def _rearm(
        self, lease: str, expected: bytes, now: int, item_id: str, when: When, envelope: Payload, rank: int
    ) -> RearmOutcome:
        item_id = normalize_id(item_id)
        ready = to_ms(when, clock=self.clock)
        data = self.check_payload(item_id, envelope)
        args = [lease, expected, now, self._wake, item_id, ready, data, check_rank(rank)]
        return _REARMED[int(self._run(self.scripts.rearm, self.shard_of(item_id), args))]

    def _queue_script(self, pipeline: Any, name: str, shard: int, args: Sequence[Any]) -> None:
        """Queue script ``name`` on a caller's transaction: FCALL when the library is installed,
        else EVAL of its source (see :meth:`~delayq_backends.scripts.ScriptCall.queue`)."""
        self.check_meta()
        getattr(self.scripts, name).queue(pipeline, self._keys[shard].all(), args)

    def held(self, claim: Claim, ids: Sequence[str], *, client: Any = None) -> list[str]:
        """The ``ids`` still under ``claim``'s lease, read through ``client`` (default: the store's).

        A target that WATCHes :meth:`lease_key` first and reads this through the same connection
        knows its transaction will abort if any of these leases changes before EXEC.
        """
        if not ids:
            return []
        held = (self.client if client is None else client).hmget(self._keys[claim.shard].leased, list(ids))
        mark = f"{claim.lease}:".encode()
        return [item_id for item_id, lease in zip(ids, held) if lease is not None and lease.startswith(mark)]

    def lease_key(self, claim: Claim) -> str:
        """The key every change to a lease of ``claim``'s shard writes: WATCH it to guard a hand-off."""
        return self._keys[claim.shard].leased

    def release(self, claim: Claim, ids: Optional[Iterable[str]] = None) -> int:
        """Put unpublished items of ``claim`` back at their ready time, attempt not counted."""
        ids = [item.id for item in claim.items] if ids is None else list(ids)
        if not ids:
            return 0
        return int(self._run(self.scripts.release, claim.shard, [claim.lease, self._wake, *ids]))

    def defer(self, claim: Claim, later: Iterable[Tuple[str, int]]) -> int:
        """Give back items of ``claim`` as ``(id, not_before_ms)``, attempt not counted.

        For flow control: the items wait in the store until then, keeping their original ready
        time (lateness stays truthful). Returns how many were still under the lease.
        """
        args: List[Any] = [claim.lease]
        for item_id, not_before in later:
            args += (item_id, not_before)
        if len(args) == 1:
            return 0
        return int(self._run(self.scripts.defer, claim.shard, args))

    def take_tokens(
        self, queue: str, wanted: int, *, rate: float, burst: int, now: Optional[int] = None
    ) -> Tuple[int, int, int]:
        """Take up to ``wanted`` tokens from ``queue``'s rate bucket, shared by all forwarders.

        Returns (granted, first slot ms, server now ms): the refused ``wanted - granted`` may go
        from the first slot on, one every ``1000 / rate`` ms (they hold those slots).
        """
        with _full_store_said_plainly():
            granted, first, server_now = self.scripts.take(
                keys=[rate_key(self.config.prefix, queue)], args=[repr(float(rate)), burst, wanted, now or 0]
            )
        return int(granted), int(first), int(server_now)

    def take_key_tokens(
        self, queue: str, wanted: Mapping[str, int], *, rate: float, burst: int, now: Optional[int] = None
    ) -> dict[str, Union[Tuple[int, int, int], Exception]]:
        """:meth:`take_tokens` from the bucket of each rate key of ``queue`` in ``wanted``
        (key -> tokens wanted), in one round trip (one per key on a cluster, whose pipelines
        cannot run scripts). A key whose bucket fails gets its error (a Redis error reply, or
        :class:`StoreFullError`) instead of its (granted, first slot ms, server now ms)."""
        calls = [
            ([key_rate_key(self.config.prefix, queue, k)], [repr(float(rate)), burst, n, now or 0])
            for k, n in wanted.items()
        ]
        if self.cluster or len(calls) == 1:
            replies = [_reply_or_error(partial(self.scripts.take, keys=keys, args=args)) for keys, args in calls]
        else:
            with self.client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    self.scripts.take(keys=keys, args=args, client=pipe)
                replies = pipe.execute(raise_on_error=False)
        return {
            key: reply if isinstance(reply, Exception) else (int(reply[0]), int(reply[1]), int(reply[2]))
            for key, reply in zip(wanted, replies)
        }

    def fail(
        self, claim: Claim, failures: Iterable[Tuple[str, Optional[int], str]], *, now: Optional[int] = None
    ) -> Tuple[int, int]:
        """Record failed deliveries as ``(id, retry_at_ms or None if permanent, error)``.

        Returns (retried, buried): out of attempts or permanent means dead letter.
        """
        args: List[Any] = [claim.lease, self.config.max_attempts, now or 0, *self._dead_limits]
        for item_id, retry_at, error in failures:
            args += (item_id, "" if retry_at is None else retry_at, error)
        if len(args) == 5:
            return (0, 0)
        retried, buried = self._run(self.scripts.fail, claim.shard, args)
        return int(retried), int(buried)

    def extend(
        self,
        claim: Claim,
        ids: Optional[Iterable[str]] = None,
        *,
        lease_ms: Optional[int] = None,
        now: Optional[int] = None,
    ) -> LeaseExtension:
        """Hold ``claim``'s items (all by default) ``lease_ms`` more from the server's now.

        For a publish that runs long: only the items' deadlines move, the claim's lease (what
        ack, release, fail and defer present) stays the same. Items no longer under the lease
        (acked, cancelled, claimed again after it ran out) are left alone and not returned.
        """
        ids = [item.id for item in claim.items] if ids is None else list(ids)
        lease = self.config.lease_ms if lease_ms is None else lease_ms
        reply = self._run(self.scripts.extend, claim.shard, [claim.lease, lease, now or 0, *ids])
        return LeaseExtension(deadline_ms=int(reply[0]), held=[i.decode() for i in reply[1:]])

    @property
    def _dead_limits(self) -> Tuple[int, int]:
        """(dead_letter_max, dead_letter_ttl in ms) for the scripts that bury (0: none)."""
        return self.config.dead_letter_max, self.config.dead_letter_ttl_seconds * 1000

    # -- reading ----------------------------------------------------------------------------

    def get(self, item_id: Union[str, bytes]) -> Optional[ScheduledItem]:
        """The scheduled item ``item_id``, or None."""
        self.check_meta(record=False)
        item_id = normalize_id(item_id)
        shard = self.shard_of(item_id)
        k = self._keys[shard]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zscore(k.due, item_id)
            pipe.hget(k.items, item_id)
            pipe.hget(k.tries, item_id)
            pipe.hget(k.leased, item_id)
            pipe.zscore(k.ranked, item_id)
            score, envelope, tries, lease, ranked = pipe.execute()
        if score is None or envelope is None:
            return None
        deadline, ready = _parse_lease(lease, score)
        calls = self._calls([(shard, item_id)]).get(item_id, 0)
        return ScheduledItem(item_id, shard, ready, envelope, _count(tries), deadline, _rank(ranked), calls)

    def scan(self, *, batch: int = 1000) -> Iterator[ScheduledItem]:
        """Every scheduled item, shard by shard, in no particular order (``ZSCAN``).

        For exports and audits of large stores, where :meth:`list`'s paging would be quadratic.
        Items present throughout are returned at least once; ones added, moved or forwarded
        meanwhile may be missed or repeated.
        """
        self.check_meta(record=False)
        for shard, k in enumerate(self._keys):
            members = self.client.zscan_iter(k.due, count=batch)
            while chunk := list(islice(members, batch)):
                ids = [m for m, _ in chunk]
                with self.client.pipeline(transaction=False) as pipe:
                    pipe.hmget(k.items, ids)
                    pipe.hmget(k.tries, ids)
                    pipe.hmget(k.leased, ids)
                    pipe.zmscore(k.ranked, ids)
                    envelopes, tries, leases, ranks = pipe.execute()
                for (member, score), envelope, tried, lease, ranked in zip(chunk, envelopes, tries, leases, ranks):
                    if envelope is not None:
                        deadline, ready = _parse_lease(lease, score)
                        yield ScheduledItem(
                            _id_text(member), shard, ready, envelope, _count(tried), deadline, _rank(ranked)
                        )

    def rank(self, item_id: Union[str, bytes]) -> Optional[int]:
        """The rank ``item_id`` is scheduled with, or None when it is not scheduled."""
        self.check_meta(record=False)
        item_id = normalize_id(item_id)
        k = self._keys[self.shard_of(item_id)]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hexists(k.items, item_id)
            pipe.zscore(k.ranked, item_id)
            exists, score = pipe.execute()
        return None if not exists else _rank(score)

    def exists(self, item_id: Union[str, bytes]) -> bool:
        item_id = normalize_id(item_id)
        self.check_meta(record=False)
        return bool(self.client.hexists(self._keys[self.shard_of(item_id)].items, item_id))

    def heads(self) -> List[Optional[int]]:
        """Each shard's earliest score (ready time, or lease deadline), None when empty.

        A shard whose index cannot be read (a key of ours holding another type, say) reads as
        due at 0, so a forwarder tries it and reports the error, while the other shards go on.
        """
        self.check_meta(record=False)
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zrange(k.due, 0, 0, withscores=True)
            replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
                raise reply  # an outage, not one bad shard: the caller backs off
        return [0 if isinstance(r, Exception) else score_ms(r[0][1]) if r else None for r in replies]

    def server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def stats(self) -> List[ShardStats]:
        """Counts per shard, as of the server's clock.

        A shard whose keys cannot be read (one holds another type) reports the reason in its
        ``error`` with zero counts; the others report as usual. An outage still raises.
        """
        self.check_meta(record=False)
        now = self.server_time_ms()
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zcard(k.due)
                pipe.zcount(k.due, "-inf", now)
                pipe.hlen(k.leased)
                pipe.zcard(k.dead)
                pipe.zrange(k.due, 0, 0, withscores=True)
            replies = pipe.execute(raise_on_error=False)
        out = []
        for shard in range(self.config.shards):
            part = replies[5 * shard : 5 * shard + 5]
            errors = [r for r in part if isinstance(r, Exception)]
            for err in errors:
                if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):
                    raise err
            if errors:
                reason = f"shard {shard} cannot be read: {errors[0]} (a key of it holds data another tool wrote)"
                out.append(ShardStats(shard, 0, 0, 0, 0, None, now, error=reason))
                continue
            scheduled, due, leased, dead, head = part
            out.append(ShardStats(shard, scheduled, due, leased, dead, score_ms(head[0][1]) if head else None, now))
        return out

    def due_histogram(self, start_ms: int, bucket_ms: int, buckets: int) -> Tuple[int, List[int]]:
        """How many items fall due before ``start_ms``, and in each of ``buckets`` buckets after it.

        Counts come from ``ZCOUNT`` on each shard per bucket, pipelined: no item is read, so the
        cost grows with buckets x shards, not with the store's size: 288 buckets (24 h by 5 min)
        on 16 shards take about 50 ms, 1440 (by the minute) about 210 ms, mostly client-side
        parsing. A leased item counts at its lease deadline, which is its score.

        Raises:
            ConfigError: ``bucket_ms`` or ``buckets`` is not positive.
        """
        if bucket_ms <= 0 or buckets <= 0:
            raise ConfigError(f"bucket_ms={bucket_ms} and buckets={buckets} must both be positive")
        self.check_meta(record=False)
        edges = [start_ms + bucket_ms * n for n in range(buckets + 1)]
        with self.client.pipeline(transaction=False) as pipe:
            for k in self._keys:
                pipe.zcount(k.due, "-inf", f"({start_ms}")
                for low, high in zip(edges, edges[1:]):
                    pipe.zcount(k.due, low, f"({high}")
            replies = pipe.execute()
        per_shard = buckets + 1
        totals = [sum(replies[s * per_shard + n] for s in range(self.config.shards)) for n in range(per_shard)]
        return totals[0], totals[1:]

    def list(
        self,
        *,
        shard: Optional[int] = None,
        start: Optional[When] = None,
        end: Optional[When] = None,
        offset: int = 0,
        count: int = 50,
    ) -> List[ScheduledItem]:
        """Scheduled items in score order, optionally one shard's or within [start, end].

        The score of a leased item is its lease deadline, so it is listed (and filtered) at
        that time; its ``ready_ms`` still shows the original ready time.
        """
        self.check_meta(record=False)
        low = "-inf" if start is None else to_ms(start, clock=self.clock)
        high = "+inf" if end is None else to_ms(end, clock=self.clock)
        shards = self._select(shard)
        with self.client.pipeline(transaction=False) as pipe:
            for s in shards:
                pipe.zrangebyscore(self._keys[s].due, low, high, start=0, num=offset + count, withscores=True)
            per_shard = pipe.execute()
        merged = heapq.merge(*[[(score_ms(score), s, m) for m, score in rows] for s, rows in zip(shards, per_shard)])
        page = list(islice(merged, offset, offset + count))
        with self.client.pipeline(transaction=False) as pipe:
            for _, s, member in page:
                k = self._keys[s]
                pipe.hget(k.items, member)
                pipe.hget(k.tries, member)
                pipe.hget(k.leased, member)
                pipe.zscore(k.ranked, member)
            details = pipe.execute()
        out = []
        calls = self._calls([(s, _id_text(member)) for _, s, member in page])
        for n, (score, s, member) in enumerate(page):
            item_id = _id_text(member)
            envelope, tries, lease, ranked = details[4 * n : 4 * n + 4]
            deadline, ready = _parse_lease(lease, score)
            out.append(
                ScheduledItem(
                    item_id, s, ready, envelope or b"", _count(tries), deadline, _rank(ranked), calls.get(item_id, 0)
                )
            )
        return out

    def _calls(self, items: Sequence[Tuple[int, str]]) -> dict[str, int]:
        """Call counts of the debounced and throttled ones of ``items`` (shard, id), one round trip."""
        collapsed = [(s, i) for s, i in items if collapsed_key(i)]
        if not collapsed:
            return {}
        with self.client.pipeline(transaction=False) as pipe:
            for s, item_id in collapsed:
                pipe.hget(self._keys[s].calls(item_id), "calls")
            counts = pipe.execute(raise_on_error=False)
        return {i: _count(None if isinstance(n, Exception) else n) for (_, i), n in zip(collapsed, counts)}

    def _select(self, shard: Optional[int]) -> List[int]:
        if shard is None:
            return list(range(self.config.shards))
        if not 0 <= shard < self.config.shards:
            raise ConfigError(f"shard {shard} does not exist: this store has shards 0..{self.config.shards - 1}")
        return [shard]

    # -- dead letters -----------------------------------------------------------------------

    def dead_letters(self, *, shard: Optional[int] = None, offset: int = 0, count: int = 50) -> List[DeadLetter]:
        """Dead letters, most recent first, with the error that killed each."""
        self.check_meta(record=False)
        shards = self._select(shard)
        with self.client.pipeline(transaction=False) as pipe:
            for s in shards:
                pipe.zrevrange(self._keys[s].dead, 0, offset + count - 1, withscores=True)
            per_shard = pipe.execute()
        merged = heapq.merge(*[[(-score_ms(score), s, m) for m, score in rows] for s, rows in zip(shards, per_shard)])
        page = list(islice(merged, offset, offset + count))
        with self.client.pipeline(transaction=False) as pipe:
            for _, s, member in page:
                pipe.hget(self._keys[s].dead_info, member)
                pipe.hget(self._keys[s].dead_items, member)
            details = pipe.execute()
        out = []
        for n, (neg_died, s, member) in enumerate(page):
            info = _parse_dead_info(details[2 * n])
            ready = info.get("ready_ms")
            out.append(
                DeadLetter(
                    _id_text(member),
                    s,
                    -neg_died,
                    str(info.get("error", "")),
                    _count(info.get("attempts")),
                    score_ms(ready) if ready not in (None, "") else None,
                    details[2 * n + 1],
                )
            )
        return out

    def requeue_dead(self, ids: Optional[Iterable[Union[str, bytes]]] = None, *, when: Optional[When] = None) -> int:
        """Schedule dead letters again (all when ``ids`` is None) at ``when`` (default: now).

        Runs in calls of at most :data:`DEAD_CHUNK` letters, so Redis serves others in between
        however many there are. All: each shard's letters present when it starts, oldest first.
        """
        ready = self.clock() if when is None else to_ms(when, clock=self.clock)
        done = 0
        if ids is not None:
            for shard, chosen in self._dead_chunks(ids):
                done += int(self._write(self.scripts.requeue, shard, [ready, self._wake, "ids", *chosen])[0])
            return done
        for shard in range(self.config.shards):
            skipped, left = 0, self._dead_count(shard)
            while left > 0:  # letters kept (skipped) stay in front: page past them
                page = [ready, self._wake, "all", skipped, min(DEAD_CHUNK, left)]
                requeued, kept, seen = self._write(self.scripts.requeue, shard, page)
                done, skipped, left = done + int(requeued), skipped + int(kept), left - int(seen)
                if not int(seen):
                    break
        return done

    def purge_dead(self, ids: Optional[Iterable[Union[str, bytes]]] = None) -> int:
        """Delete dead letters for good (all when ``ids`` is None), :data:`DEAD_CHUNK` per call."""
        if ids is not None:
            return sum(int(self._run(self.scripts.purge, s, ["ids", *chosen])) for s, chosen in self._dead_chunks(ids))
        done = 0
        for shard in range(self.config.shards):
            left = self._dead_count(shard)
            while left > 0:
                deleted = int(self._run(self.scripts.purge, shard, ["all", min(DEAD_CHUNK, left)]))
                done, left = done + deleted, left - deleted
                if not deleted:
                    break
        return done

    def _dead_count(self, shard: int) -> int:
        self.check_meta()
        return int(self.client.zcard(self._keys[shard].dead))

    def _dead_chunks(self, ids: Iterable[Union[str, bytes]]) -> List[tuple[int, List[str]]]:
        """``ids`` by shard, in chunks of at most :data:`DEAD_CHUNK`."""
        by_shard: dict[int, List[str]] = defaultdict(list)
        for item_id in ids:
            item_id = normalize_id(item_id)
            by_shard[shard_of(item_id, self.config.shards)].append(item_id)
        return [
            (shard, chosen[i : i + DEAD_CHUNK])
            for shard, chosen in by_shard.items()
            for i in range(0, len(chosen), DEAD_CHUNK)
        ]

    # -- format upgrades --------------------------------------------------------------------

    def replace_envelope(self, item_id: Union[str, bytes], old: bytes, new: Payload, *, dead: bool = False) -> bool:
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


def _schedule_args(items: Sequence[Tuple[str, int, bytes, int]]) -> List[Any]:
    """schedule.lua's item arguments: a width, then the items, with their ranks only when one
    is not 0 (most batches have none, and an argument per item costs the script time)."""
    if any(rank for *_, rank in items):
        return [4, *(field for item in items for field in item)]
    return [3, *(field for item in items for field in item[:3])]


def _keyed(envelope: Payload, rate_key: Optional[str]) -> Payload:
    """``envelope`` carrying ``rate_key`` (unchanged without one)."""
    if rate_key is None:
        return envelope
    return with_rate_key(envelope if isinstance(envelope, Envelope) else Envelope.decode(envelope), rate_key)


def _raised(error: Exception) -> Any:
    raise error


def _reply_or_error(call: Any) -> Any:
    """``call()``'s reply, or the Redis error it raised (OOM as :class:`StoreFullError`)."""
    try:
        with _full_store_said_plainly():
            return call()
    except (StoreFullError, redis.ResponseError) as exc:
        return exc


@contextmanager
def _full_store_said_plainly() -> Iterator[None]:
    """Turn Redis's OOM refusal into a :class:`StoreFullError` that says what to do.

    Every script writes, and Redis refuses writing scripts at ``maxmemory`` before they run, so
    nothing of the refused call was stored.
    """
    try:
        yield
    except redis.OutOfMemoryError as exc:
        raise StoreFullError(
            f"the delay store is at its maxmemory, so nothing was written ({exc}); free memory or raise "
            "maxmemory, and keep maxmemory-policy noeviction so Redis never evicts scheduled items"
        ) from exc


#: cancel.lua's and reschedule.lua's replies (0 not there, 1 done, 2 leased) as outcomes.
_CANCELLED = (CancelOutcome.NOT_FOUND, CancelOutcome.CANCELLED, CancelOutcome.IN_FLIGHT)
_RESCHEDULED = (RescheduleOutcome.NOT_FOUND, RescheduleOutcome.RESCHEDULED, RescheduleOutcome.IN_FLIGHT)
_REARMED = (RearmOutcome.NOT_FOUND, RearmOutcome.REPLACED, RearmOutcome.HELD, RearmOutcome.CHANGED)


def _rank(ranked_score: Optional[float]) -> int:
    """An item's rank from its ``ranked`` entry: the entry's band (includes/common.lua), which
    schedule keeps exact for the items it holds; no entry (or one outside every band) is rank 0."""
    if ranked_score is None or not 0 <= ranked_score < MAX_RANK * RANK_SPAN:
        return 0
    return MAX_RANK - int(ranked_score) // RANK_SPAN


def _count(raw: Any) -> int:
    """A stored count (tries, attempts) for reading: 0 when it is no whole number."""
    try:
        return max(0, int(raw or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _id_text(member: bytes) -> str:
    """A stored id as text for reading; one that is not UTF-8 (a hand write) shows its bytes escaped."""
    return member.decode("utf-8", "backslashreplace")


def _parse_lease(lease: Optional[bytes], score: float) -> Tuple[Optional[int], int]:
    """(lease deadline or None, original ready ms) from a ``leased`` hash value.

    A deferred item's entry ("<not-before>:deferred:<ready>") reads as held until not-before.
    An entry that is not "<ms>:<token>:<ms>" (a hand write) reads as no lease, so the item
    stays readable; the next claim buries it with the reason.
    """
    parts = lease.split(b":") if lease else []
    if len(parts) in (2, 3) and parts[0].isdigit() and parts[-1].lstrip(b"-").isdigit():
        return score_ms(parts[0]), score_ms(parts[-1])
    return None, score_ms(score)


def _parse_dead_info(raw: Optional[bytes]) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        info = json.loads(raw)
    except ValueError:
        return {"error": raw.decode("utf-8", "replace")}
    return info if isinstance(info, dict) else {"error": str(info)}
