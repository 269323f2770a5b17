"""What every role of the store shares: the client, the key layout recorded for the prefix, and
running script calls (streamed, on a caller's pipeline, or durably with WAIT)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import redis

from ..config import Config
from ..connection import Client, connect, is_cluster
from ..envelope import FORMAT_VERSION, MAGIC, Envelope
from ..errors import (
    ConfigError,
    EnvelopeError,
    InvalidRankError,
    PayloadTooLargeError,
    ShardMismatchError,
    StoreFullError,
    StoreMetaError,
)
from ..keys import LAYOUT, MAX_RANK, ShardKeys, meta_key, normalize_id, shard_of, shard_tags, wake_channel
from ..models import ScheduleItem
from ..scripts.library import Durability, ScriptCall, ScriptRunner, function_missing
from ..timeutil import Clock, ServerClock, When, to_ms
from .layout import check_recorded, check_shards, layout_in_use, read_meta, recorded_layout

__all__ = ["NO_EARLIER_WAKE", "Payload", "StoreCore", "check_rank", "full_store_said_plainly"]

Payload = Envelope | bytes

R = TypeVar("R")

#: A wake-up that announces no earlier ready time (the largest ms a forwarder reads): sent only
#: to move this connection's replication offset before a WAIT (:meth:`StoreCore.confirm_durable`).
NO_EARLIER_WAKE = str(2**63 - 1)
S = TypeVar("S", bound="StoreCore")


def check_rank(rank: int) -> int:
    """``rank`` if it is an integer in 0..MAX_RANK.

    Raises:
        InvalidRankError: anything else; nothing was stored.
    """
    if type(rank) is int and 0 <= rank <= MAX_RANK:  # the usual case, checked first (bool is no int here)
        return rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
        raise InvalidRankError(
            f"rank={rank!r}: pass an int in 0..{MAX_RANK} (0, the default, for most items; higher is claimed "
            "first when more is due than the forwarders can take at once)"
        )
    return rank


class StoreCore:
    """The store's connection and layout, shared by its roles (:class:`~.producer.Producer`,
    :class:`~.lease.Forwarding`, :class:`~.reader.Reader`); each role is usable alone.

    Items are spread over ``shards`` sorted sets by ``crc32(id)``; each call touches one
    shard, so the store runs unchanged on Redis Cluster. The store never starts a server.

    Args:
        client: a ``redis.Redis`` or ``RedisCluster`` created with ``decode_responses=False``.
        config: prefix, shard count and limits; ``config.url`` is not used here.
        clock: "now" in ms, kept as ``store.clock``: the one clock of everything that uses this
            store (``timedelta`` ready times, its forwarders, leases, periodic firing and
            targets). By default a :class:`~delayq_backends.timeutil.ServerClock` on the server
            whose ``TIME`` every claim uses, so a host whose wall clock is off schedules and
            forwards neither early nor late; a test passes its fake clock here, and only here.
    """

    def __init__(self, client: Client, config: Config | None = None, *, clock: Clock | None = None) -> None:
        self.client = client
        self.config = config or Config()
        self.clock: Clock = clock if clock is not None else ServerClock(self._server_time)
        self.scripts = ScriptRunner(client, Durability(self.config.durable_replicas, self.config.durable_timeout_ms))
        self.cluster = is_cluster(client)
        self._shard_keys: list[ShardKeys] | None = None
        self._wake = wake_channel(self.config.prefix)
        self._meta_checked = False
        #: the key layout in use (keys.shard_tags), known once the shard keys are
        self.layout: int | None = None

    @classmethod
    def from_url(cls: type[S], url: str, **settings: Any) -> S:
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
    def _keys(self) -> list[ShardKeys]:
        """Every shard's keys, in the layout recorded for the prefix (read and checked once)."""
        return self._load_keys() if self._shard_keys is None else self._shard_keys

    def _load_keys(self) -> list[ShardKeys]:
        """Read and check the recorded layout, then build every shard's keys in it.

        Raises:
            StoreMetaError: the recorded layout is garbage or not the one the shard keys use.
        """
        prefix, shards = self.config.prefix, self.config.shards
        recorded = recorded_layout(prefix, *read_meta(self.client, prefix), shards)
        if recorded is None:  # a new prefix, or its meta deleted: the shard keys tell
            found = layout_in_use(self.client, prefix, shards) or LAYOUT
        else:
            check_recorded(self.client, prefix, shards, recorded)
            found = recorded
        tags = shard_tags(prefix, shards, found)
        self._shard_keys = [ShardKeys(prefix, k, tags[k]) for k in range(shards)]
        self.layout = found
        return self._shard_keys

    def shard_of(self, item_id: str | bytes) -> int:
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
            StoreMetaError: the metadata is not a hash.
        """
        if self._meta_checked:
            return
        key = meta_key(self.config.prefix)
        read_meta(self.client, self.config.prefix)  # a key of another type: the error names it and the fix
        if record:
            self._record_meta(key)
        stored = self.client.hget(key, "shards")
        # the count first: the layout check reads the configured count's shard keys, and a
        # wrong count can name another layout's keys (a misleading "layout" error)
        recorded = int(stored) if stored is not None and stored.isdigit() else None
        if recorded is not None and recorded != self.config.shards:
            check_shards(self.client, self.config.prefix, self.config.shards, recorded)
            raise ShardMismatchError(
                f"prefix {self.config.prefix!r} holds {recorded} shards in Redis but this client is "
                f"configured with {self.config.shards}: set shards={recorded} (DELAYQ_SHARDS / "
                f"--shards / delayq_shards), or use a new prefix for a different layout"
            )
        if self._shard_keys is None:
            self._load_keys()  # checks the recorded layout (and a shards field that is no count) before any use
        if stored is None:
            return
        self._meta_checked = True

    def _record_meta(self, key: str) -> None:
        """Record the layout, shard count and format the prefix lacks; writes nothing when all are
        there, so a producer role (which may only read the metadata) passes once a forwarder has
        recorded them."""
        shards, envelope_format = self.client.hmget(key, "shards", "format")
        if shards is None:
            try:  # a new prefix (or its meta deleted: the shard keys tell): its layout goes in first,
                # so shards without a layout means "made before"
                layout = layout_in_use(self.client, self.config.prefix, self.config.shards) or LAYOUT
                self.client.hsetnx(key, "layout", layout)
            except redis.exceptions.NoPermissionError as exc:
                raise ConfigError(
                    f"prefix {self.config.prefix!r} has no metadata yet and this user may not write it "
                    f"(a producer role): start a forwarder on the prefix first, which records it ({exc})"
                ) from exc
            self._shard_keys = None  # read the layout again: another writer may have been first
            self.client.hsetnx(key, "shards", self.config.shards)
        if envelope_format is None:
            with contextlib.suppress(redis.exceptions.NoPermissionError):  # a producer role: a forwarder will
                self.client.hsetnx(key, "format", FORMAT_VERSION)

    def meta_drift(self) -> str | None:
        """What ``<prefix>:meta`` says now that differs from the layout and shard count this
        store checked and uses, with the command that restores it; None when it agrees (or
        before the layout was read). The store goes on with its checked layout either way."""
        if self.layout is None:
            return None
        prefix, shards = self.config.prefix, self.config.shards
        key = meta_key(prefix)
        try:
            layout, stored = read_meta(self.client, prefix)
            recorded = recorded_layout(prefix, layout, stored, shards)
        except StoreMetaError as exc:
            why = str(exc)
        else:
            if recorded == self.layout and stored == str(shards).encode():
                return None
            why = f"{key} now records layout {recorded}, shards {stored!r}"
        return (
            f"{why}; this process keeps layout {self.layout} and {shards} shards, which the shard keys use, "
            f"but clients started now would refuse or miss the items: restore it with "
            f"`HSET {key} layout {self.layout} shards {shards}` and find what wrote it (only delayq "
            "writes this key: give producers the `delayq acl` producer role)"
        )

    def _select(self, shard: int | None) -> list[int]:
        if shard is None:
            return list(range(self.config.shards))
        if not 0 <= shard < self.config.shards:
            raise ConfigError(f"shard {shard} does not exist: this store has shards 0..{self.config.shards - 1}")
        return [shard]

    def server_time_ms(self) -> int:
        """The server's ``TIME`` in ms, read now (a round trip): what :attr:`clock` follows."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _server_time(self) -> float:
        """The server's ``TIME`` in ms to the µs, for :attr:`clock` (which rounds down once, after
        advancing it)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) / 1000

    def script_now(self, now: int | None) -> int:
        """The "now" a script that reads the time is given: ``now`` if the caller chose one, else 0,
        which the script reads as the server's ``TIME``.

        Every role passes its time through here, so a store on a fake clock (the testing store)
        overrides this one method and each script that reads the time follows that clock.
        """
        return now or 0

    # -- running scripts --------------------------------------------------------------------

    def _run(self, call: Callable[[ShardKeys], ScriptCall[R]], shard: int, client: Any = None) -> R:
        """Run the script call ``call`` builds from ``shard``'s keys, now (on ``client``, by default
        the store's own)."""
        self.check_meta()
        with full_store_said_plainly():
            return self.scripts.run(call(self._keys[shard]), client=client)

    def run_each(
        self, calls: Sequence[ScriptCall[R]], reply: Callable[[Callable[[], R]], R | Exception] | None = None
    ) -> list[R | Exception]:
        """Run ``calls`` (each on keys of its own: rate buckets, slot keys, or each on a shard's)
        in one round trip (one per call on a cluster, whose pipelines cannot run scripts): each
        reply, or its error, so one bad key does not cost the others theirs. ``reply`` reads one
        (default: a Redis error reply or :class:`StoreFullError` is returned, others raise)."""
        read = _reply_or_error if reply is None else reply
        if self.cluster or len(calls) == 1:
            return [read(partial(self.scripts.run, call)) for call in calls]
        raw = self.scripts.run_pipelined(calls)
        return [read(partial(_parsed, call, answer)) for call, answer in zip(calls, raw)]

    def run_each_with(
        self, calls: Sequence[ScriptCall[R]], reads: Callable[[Any], None]
    ) -> tuple[list[R | Exception], list[Any]]:
        """Run ``calls`` as :meth:`run_each` does and the plain commands ``reads`` queues on a
        pipeline, in one round trip: each call's reply or error, then the commands' replies
        (errors as values), in their order. On a cluster (whose pipelines cannot run scripts)
        or for a call that waits for replicas, the calls run first, then the commands."""
        if self.cluster or any(self.scripts.waits(call) for call in calls):
            replies = self.run_each(calls)
            with self.client.pipeline(transaction=False) as pipe:
                reads(pipe)
                return replies, list(pipe.execute(raise_on_error=False))
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                self.scripts.queue(call, pipe)
            reads(pipe)
            raw = pipe.execute(raise_on_error=False)
        return [_reply_or_error(partial(_parsed, c, a)) for c, a in zip(calls, raw)], list(raw[len(calls) :])

    def _queue(self, call: Callable[[ShardKeys], ScriptCall[Any]], shard: int, pipeline: Any) -> None:
        """Queue the script call ``call`` builds from ``shard``'s keys on a caller's pipeline or
        MULTI/EXEC: it commits with the caller's writes (see :meth:`ScriptRunner.queue`)."""
        self.check_meta()
        self.scripts.queue(call(self._keys[shard]), pipeline)

    def _write(self, call: Callable[[ShardKeys], ScriptCall[R]], shard: int, client: Any = None) -> R:
        """Run a user's write, whatever its script: with ``durable_replicas`` it waits for the
        replicas too (:meth:`ScriptRunner.waits`). ``client``: a client of the shard's
        (non-cluster) server to run it on, by default the store's."""
        return self._run(lambda keys: call(keys).as_acknowledged(), shard, client)

    def write_acknowledged(self, key: str, *commands: tuple[Any, ...]) -> list[Any]:
        """Plain ``commands`` a user's call returns success for (a slot limit, a registry line),
        on the server holding ``key`` (each command on its hash slot): with ``durable_replicas``
        a WAIT follows them on their connection. Their replies; an error reply raised.

        Raises:
            NotDurableError: fewer replicas confirmed them in time (they are on the primary).
        """
        client = self._server_of(key)
        with client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            replies = self.scripts.confirm(pipe, client, key)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _write_calls(self, calls: Iterable[tuple[int, ScriptCall[R]]]) -> list[R | Exception]:
        """Run each (shard, call) with small replies, streamed (durably, one by one, with
        ``durable_replicas``).

        Returns each call's parsed reply, or its error (a Redis error reply, or
        :class:`StoreFullError`), in order, so a caller can tell which calls of a bulk write were
        stored. ``calls`` is consumed lazily: each call is built and sent while the server runs
        the ones before it (a pipeline would build them all first, leaving the server idle).
        """
        self.check_meta()
        if self.config.durable_replicas:  # one by one, each with its WAIT
            return [_reply_or_error(partial(self.scripts.run, call.as_acknowledged())) for _, call in calls]
        streams: dict[int, tuple[Any, Any]] = {}  # id(node client) -> (its pool, a connection of it)
        sent: list[tuple[ScriptCall[R], Any]] = []
        replies: list[R | Exception] = []
        again: list[ScriptCall[R]] = []
        unsent = iter(calls)
        try:
            for shard, call in unsent:
                node = self._node_client(shard)  # each primary of a cluster gets its own stream
                if id(node) not in streams:
                    pool = node.connection_pool
                    streams[id(node)] = (pool, pool.get_connection())
                connection = streams[id(node)][1]
                sent.append((call, connection))
                connection.send_packed_command([self.scripts.packed(call)])
            # replies are read after the last send: they are a few bytes each, so none waits on another
            for call, connection in sent:
                replies.append(_reply_or_error(partial(_read, call, connection)))
        except (redis.ConnectionError, redis.TimeoutError):
            # lost mid-stream: whether the unanswered calls ran is unknown, so they and the unsent
            # run again one by one, with the client's retries (scheduling is idempotent by id)
            again = [call for call, _ in sent[len(replies) :]] + [call for _, call in unsent]
            for _, connection in streams.values():
                connection.disconnect()
        except BaseException:
            for _, connection in streams.values():
                connection.disconnect()  # replies may be left unread on it
            raise
        finally:
            for pool, connection in streams.values():
                pool.release(connection)
        ran = [call for call, _ in sent[: len(replies)]] + again
        replies += [_reply_or_error(partial(self.scripts.run, call)) for call in again]
        # refused where it was sent (a cluster slot that moved, a node without the function
        # library): run it again through the client, which follows the slot or falls back to EVAL
        return [
            _reply_or_error(partial(self.scripts.run, call)) if _misdirected(reply) else reply
            for call, reply in zip(ran, replies)
        ]

    def confirm_durable(self) -> None:
        """With ``durable_replicas``, wait until that many replicas have every write this process
        made before the call: for writes queued on a caller's pipeline (``pipeline=``), after
        its EXEC. A no-op without the option.

        WAIT counts only writes of its own connection, and the caller's EXEC ran on another; but
        replication is one ordered stream, so a write sent after the EXEC returned and confirmed
        by WAIT on its connection confirms the EXEC too. That write is a wake-up announcing no
        earlier time (forwarders ignore it), which every producer role may send. Not on a
        cluster, where PUBLISH does not enter the replication stream (pipelines are for the
        store's own server anyway).

        Raises:
            NotDurableError: fewer replicas confirmed within ``durable_timeout_ms``; the writes
                are on the primary, so retrying them is safe.
        """
        if not self.config.durable_replicas:
            return
        with self.client.pipeline(transaction=False) as pipe:
            pipe.publish(self.wake_channel, NO_EARLIER_WAKE)
            self.scripts.confirm(pipe, self.client, "a caller's transaction")

    def _write_or_queue(self, call: Callable[[ShardKeys], ScriptCall[R]], shard: int, pipeline: Any) -> R | None:
        """Run ``call`` as a producer's write, or queue it on the caller's ``pipeline``."""
        if pipeline is not None:
            self._queue(call, shard, pipeline)
            return None
        return self._write(call, shard)

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

    def check_item(self, item_id: str | bytes, when: When, envelope: Payload, rank: int) -> ScheduleItem:
        """One item, checked: every bad input raises before anything is sent."""
        checked_id = normalize_id(item_id)
        ready = to_ms(when, clock=self.clock)
        return ScheduleItem(checked_id, ready, self.check_payload(checked_id, envelope), check_rank(rank))

    def _node_client(self, shard: int) -> redis.Redis:
        """A client of the one server that holds ``shard`` (the store's own when not a cluster)."""
        return self._server_of(self._keys[shard].due)

    def _server_of(self, key: str) -> redis.Redis:
        """A client of the one server that holds ``key`` (the store's own when not a cluster)."""
        if not self.cluster:
            return self.client  # type: ignore[return-value]
        return self.client.get_node_from_key(key).redis_connection  # type: ignore[union-attr,no-any-return]


def _parsed(call: ScriptCall[R], reply: Any) -> R:
    """A pipelined reply, parsed; an error reply raised."""
    if isinstance(reply, Exception):
        raise reply
    return call.parse(reply)


def _read(call: ScriptCall[R], connection: Any) -> R:
    """The next reply on ``connection``, parsed; an error reply raised."""
    return call.parse(connection.read_response())


def _misdirected(reply: object) -> bool:
    """Whether ``reply`` is an error of where the call went rather than of the call itself."""
    return isinstance(
        reply, (redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError)
    ) or (isinstance(reply, redis.ResponseError) and function_missing(reply))


def _reply_or_error(call: Callable[[], R]) -> R | Exception:
    """``call()``'s reply, or the Redis error it raised (OOM as :class:`StoreFullError`)."""
    try:
        with full_store_said_plainly():
            return call()
    except (StoreFullError, redis.ResponseError) as exc:
        return exc


def full_store_said_plainly() -> _FullStoreSaidPlainly:
    """Turn Redis's OOM refusal into a :class:`StoreFullError` that says what to do.

    Every script writes, and Redis refuses writing scripts at ``maxmemory`` before they run, so
    nothing of the refused call was stored.
    """
    return _PLAINLY


class _FullStoreSaidPlainly:
    """The context of :func:`full_store_said_plainly`: a class, not a ``@contextmanager``
    generator, which would cost a microsecond more on every single ``schedule()``."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, redis.OutOfMemoryError):
            raise StoreFullError(
                f"the delay store is at its maxmemory, so nothing was written ({exc}); free memory or raise "
                "maxmemory, and keep maxmemory-policy noeviction so Redis never evicts scheduled items"
            ) from exc


_PLAINLY = _FullStoreSaidPlainly()
