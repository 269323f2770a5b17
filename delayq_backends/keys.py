"""Key names: the one place that knows how the store is laid out in Redis.

Every key of shard ``k`` carries one hash tag, so one shard lives in one Redis Cluster slot (a
Lua script may touch all of them) while different shards spread over the cluster's nodes.
Layout 2 (new prefixes) picks each shard's tag so the shards spread *evenly*: see
:func:`shard_tags`. A prefix created before records no layout and keeps layout 1.
"""

from __future__ import annotations

import secrets
import unicodedata
import zlib
from dataclasses import dataclass
from functools import cached_property, lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .errors import InvalidIdError

__all__ = [
    "GROUP_KEYS",
    "SLOT_KEYS",
    "BALANCED_MAX_SHARDS",
    "CLAIMER_BYTES",
    "GROUP_REASON",
    "RELEASED_BIAS_MS",
    "COLLAPSE_MODES",
    "LAYOUT",
    "MAX_ID_BYTES",
    "MAX_RANK",
    "PARKED_MS",
    "RANK_SPAN",
    "ShardKeys",
    "batch_channel",
    "batch_item_id",
    "claim_token",
    "claimer_of",
    "collapse_id",
    "collapsed_key",
    "group_bucket_key",
    "group_policy_key",
    "group_reason",
    "group_wake_channel",
    "key_rate_key",
    "meta_key",
    "normalize_id",
    "periodic_code_key",
    "periodic_key",
    "periodic_trust_key",
    "rate_key",
    "shard_of",
    "shard_tags",
    "slot_holds_key",
    "slot_limit_key",
    "slot_reports_key",
    "slot_tokens_key",
    "slot_waiting_key",
    "slot_waits_key",
    "wake_channel",
]

#: Celery and RQ ids are 36 bytes; anything near this is a mistake, not an id.
MAX_ID_BYTES = 512


#: Ranks run 0..MAX_RANK; higher is claimed first under a backlog. The Lua side encodes a rank's
#: band in the ``ranked`` index with the same constants (``includes/common.lua``).
MAX_RANK = 255
#: Width in ms of one rank's band of scores in the ``ranked`` index (2^44 ms: until 2527).
RANK_SPAN = 2**44


#: The ``due`` score of a parked item (:attr:`ShardKeys.parked`): a time no claim reaches, one ms
#: before 9999-12-31T23:59:59 (the latest time a schedule takes, and a paused entry's), so a
#: parked item is told from a paused one, and any release's claim, the oldest included, skips it.
#: Must match PARKED_MS in ``scripts/includes/parking.lua``.
PARKED_MS = 253_402_300_798_999


#: How far ahead of every other item a group's line puts the items it releases: their ``due``
#: score is their ready time minus this (2^43 ms, 279 years), so the claim takes them first
#: while the leased entry keeps the true ready time. Must match ``includes/glines.lua``.
RELEASED_BIAS_MS = 2**43

#: The kind of a parked item's reason when it waits in its group's line: ``group:<key>``.
GROUP_REASON = "group"


def group_reason(key: str) -> str:
    """The ``parked_why`` of an item waiting in group ``key``'s line."""
    return f"{GROUP_REASON}:{key}"


#: Unicode categories an id may not hold: controls (C0, DEL, C1), format characters (bidi
#: overrides and isolates, LRM/RLM, zero-width ones, tags) and line/paragraph separators. They
#: rewrite a terminal (``delayq list``), forge log lines or make an id look like another one.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _refuse_unprintable(item_id: str) -> None:
    """Raise on the first control, format or separator character, named by code point.

    ``str.isprintable`` is the fast path (done in C): it is True for every id Celery and RQ make.
    """
    if item_id.isprintable():
        return
    for position, char in enumerate(item_id):
        category = unicodedata.category(char)
        if category in _UNPRINTABLE:
            name = unicodedata.name(char, "control character")
            raise InvalidIdError(
                f"item id {item_id.encode('unicode_escape').decode('ascii')!r} holds U+{ord(char):04X} "
                f"({name}, category {category}) at position {position}: pass an id of printable text "
                "(letters, digits, punctuation, spaces), e.g. a UUID"
            )


def normalize_id(item_id: str | bytes) -> str:
    """Return ``item_id`` as text, refusing what cannot be an id.

    Refused: non-text, empty, over :data:`MAX_ID_BYTES`, unpaired surrogates, and any control,
    format (bidi) or line-separator character. ``.`` and ``..`` are ids like any other (the API
    reaches every id by ``?id=``).
    """
    if type(item_id) is str and item_id.isascii() and item_id.isprintable() and 0 < len(item_id) <= MAX_ID_BYTES:
        return item_id  # the usual id (a UUID, a ULID): printable ASCII, one byte a character
    if isinstance(item_id, bytes):
        try:
            item_id = item_id.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidIdError(f"item id {item_id!r} is not UTF-8: pass a str id") from exc
    if not isinstance(item_id, str):
        raise InvalidIdError(f"item id must be a str, got {type(item_id).__name__}: {item_id!r}")
    if not item_id:
        raise InvalidIdError("item id is empty: pass a task/job id or let delayq generate one")
    if len(item_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise InvalidIdError(f"item id is over {MAX_ID_BYTES} bytes: use a shorter id (a UUID or ULID)")
    try:
        item_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidIdError(f"item id {item_id!r} holds unpaired surrogates: pass valid text") from exc
    _refuse_unprintable(item_id)
    return item_id


def shard_of(item_id: str, shards: int) -> int:
    """The shard of ``item_id``: a pure function of the id, so lookups never scan."""
    return zlib.crc32(item_id.encode("utf-8")) % shards


#: The key layout new prefixes get (recorded in ``<prefix>:meta``). 1: shard ``k``'s hash tag is
#: ``<prefix>:<k>``. 2: the first of ``<prefix>:<k>``, ``<prefix>:<k>:1``, ``<prefix>:<k>:2``, ...
#: whose slot lies near the middle of the k-th of ``shards`` equal slot ranges.
LAYOUT = 2
#: Layout 2 balances up to this many shards; beyond, plain tags already spread well, and the
#: search would take longer (about ``shards`` tries per shard).
BALANCED_MAX_SHARDS = 256


@lru_cache(maxsize=64)
def shard_tags(prefix: str, shards: int, layout: int = LAYOUT) -> tuple[str, ...]:
    """The hash tag (without braces) of each shard.

    With layout 2, shard ``k``'s slot lies near the middle of the k-th of ``shards`` equal slot
    ranges (within 1/32 of a range). Evenly spaced points put ``floor`` or ``ceil`` of
    ``shards / masters`` in each of a cluster's equal contiguous slot ranges (what
    ``redis-cli --cluster create`` makes), so 16 shards on 3 masters split 5/6/5 instead of
    whatever the plain tags' hashes give (4/5/7 for the prefix ``delayq``). Aiming at the middle,
    not anywhere in the range, matters: a master's boundary may cut a shard's range in two.
    """
    plain = tuple(f"{prefix}:{k}" for k in range(shards))
    if layout == 1 or shards > BALANCED_MAX_SHARDS:
        return plain
    width = REDIS_CLUSTER_HASH_SLOTS / shards
    near = max(1, int(width // 64))  # half of 1/32 of a range on each side
    tags = []
    for k, tag in enumerate(plain):
        middle = int((k + 0.5) * width)
        salt = 0
        while abs(key_slot(tag.encode()) - middle) > near:
            salt += 1
            tag = f"{plain[k]}:{salt}"
        tags.append(tag)
    return tuple(tags)


def meta_key(prefix: str) -> str:
    """Hash holding the shard count and format version of a store."""
    return f"{prefix}:meta"


def wake_channel(prefix: str) -> str:
    """Pub/sub channel on which a new earliest item wakes sleeping forwarders."""
    return f"{prefix}:wake"


def group_wake_channel(prefix: str) -> str:
    """Pub/sub channel on which a worker's end report names its group: a hint that the group has
    room again, so forwarders look at its lines at once (the message is a group key, never trusted
    beyond that)."""
    return f"{prefix}:groups:wake"


def periodic_key(prefix: str) -> str:
    """HASH of the periodic entries synced into the store (entry name → item id), so a sync
    finds the entries gone from the config without scanning the store."""
    return f"{prefix}:{{{prefix}}}:periodic"


def periodic_code_key(prefix: str) -> str:
    """HASH of the code schedule last synced (version, fingerprint of its set, when, from which
    host), so an older or an empty ``beat_schedule`` cannot roll a newer one back."""
    return f"{prefix}:{{{prefix}}}:periodic:code"


def periodic_trust_key(prefix: str) -> str:
    """HASH of the run templates an operator defined (entry name → digests of its template), so a
    forwarder fires an entry that carries code to run (an RQ job's pickled ``data``) only as an
    operator stored it, never as a producer planted it (:mod:`~delayq_backends.periodic.trust`)."""
    return f"{prefix}:{{{prefix}}}:periodic:trusted"


def rate_key(prefix: str, queue: str) -> str:
    """HASH of the forwarding-rate token bucket of ``queue``, shared by every forwarder.

    Tagged with the prefix alone, so a queue name holding braces cannot move it to another slot.
    """
    return f"{prefix}:{{{prefix}}}:rate:{queue}"


def key_rate_key(prefix: str, queue: str, key: str) -> str:
    """HASH of the token bucket of one rate key (a tenant, a customer) of ``queue``.

    Beside the queue buckets, in the prefix's slot. The queue's length comes first, so no pair
    of a queue and a key can spell another pair's bucket.
    """
    return f"{prefix}:{{{prefix}}}:keyrate:{len(queue)}:{queue}:{key}"


def _slot(prefix: str, key: str, name: str) -> str:
    """Key ``name`` of concurrency slot ``key``: the four keys of one slot key share the hash tag
    ``{<prefix>:slot:<key>}`` (a brace in the key cuts the tag short, identically for all four),
    so one script takes them on a cluster, and different slot keys spread over the nodes."""
    return f"{prefix}:{{{prefix}:slot:{key}}}:{name}"


def slot_holds_key(prefix: str, key: str) -> str:
    """ZSET of the holds of slot ``key``: member = a running item's id (and run), score = ms at
    which the hold lapses unless its worker extends it (a dead worker's slot comes back then)."""
    return _slot(prefix, key, "holds")


def slot_waiting_key(prefix: str, key: str) -> str:
    """ZSET of the items of slot ``key`` waiting for a slot, scored by their order (rank band,
    then ready ms, as the ``ranked`` index): a free slot goes to the head of this line."""
    return _slot(prefix, key, "waiting")


def slot_waits_key(prefix: str, key: str) -> str:
    """ZSET member -> ms at which a waiting entry lapses unless its item asks again: an item
    cancelled while it waits holds no place in the line for longer than that."""
    return _slot(prefix, key, "waits")


def slot_limit_key(prefix: str, key: str) -> str:
    """STRING: the limit of slot ``key`` set at runtime (``set_slot_limit``); absent: the limit
    the items carry, or none."""
    return _slot(prefix, key, "limit")


def slot_tokens_key(prefix: str, key: str) -> str:
    """HASH member -> SHA-1 (hex) of the token its forwarder minted when it granted the hold: only
    the worker given the token (in the item's message) can report the hold's start or end.
    Written by forwarders alone; a hold with no token (granted by an earlier release) takes
    tokenless reports."""
    return _slot(prefix, key, "tokens")


def slot_reports_key(prefix: str, key: str) -> str:
    """HASH of the workers' reports on their holds, ``<member>\\n<nonce>`` -> ``start:<sha1>:<ms>``,
    ``beat:<sha1>:<ms>`` or ``end:<token>``: written by workers (HSET, nothing else: they cannot
    read or delete another's), checked against :func:`slot_tokens_key` and folded into the holds
    by the forwarders' next take."""
    return _slot(prefix, key, "reports")


def group_policy_key(prefix: str, key: str) -> str:
    """HASH: group ``key``'s policy set at runtime (``DelayStore.set_group``): ``limit``,
    ``rate`` (text ``N/s``, ``N/m`` or ``N/h``), ``weight``, ``paused`` (who paused it),
    ``throttled_until`` (ms) and ``throttled_by``; a field absent: the item's value, else the
    pattern's (``GroupPolicies``), else none. In the group's own tag (a group is a slot key):
    ``slot_take.lua`` reads it beside the holds, the release step its ``weight``.
    :func:`slot_limit_key` is the older alias of ``limit``, read when the hash has none.
    ``carried`` (``<limit>:<ms>``, written by ``slot_take.lua``): the limit the group's items
    last carried, applied by every forwarder under the runtime limit, for a day after."""
    return _slot(prefix, key, "policy")


def group_bucket_key(prefix: str, key: str) -> str:
    """HASH: group ``key``'s rate token bucket (``tokens``, ``at``: ms of the last refill),
    shared by every forwarder and written by ``slot_take.lua`` alone; it expires once full."""
    return _slot(prefix, key, "bucket")


#: A slot key's keys, in ``slot_take.lua``'s KEYS order.
SLOT_KEYS = (slot_holds_key, slot_waiting_key, slot_waits_key, slot_limit_key, slot_tokens_key, slot_reports_key)
#: A group's keys, in ``slot_take.lua``'s KEYS order: its slot keys, then its policy and bucket.
GROUP_KEYS = (*SLOT_KEYS, group_policy_key, group_bucket_key)


def batch_item_id(key: str) -> str:
    """The item id of batch ``key``'s on_complete: a pure function of the key, so the batch's own
    keys live in that item's shard (:meth:`ShardKeys.batch`) and the script that records the last
    finish writes the item in the same call."""
    return f"batch-{key}"


def batch_channel(prefix: str, key: str) -> str:
    """Pub/sub channel on which batch ``key``'s summary is published once, when it completes."""
    return f"{prefix}:batch:{key}"


#: The ways schedules of one key collapse into one run (see ``DelayStore.debounce``).
COLLAPSE_MODES = ("debounce", "throttle")


def collapse_id(mode: str, key: str) -> str:
    """The item id of the one pending run of ``key`` in ``mode``: a pure function of both, so
    every call of a key lands on one shard. Debounce and throttle of one key are two runs."""
    return f"{mode}:{key}"


def collapsed_key(item_id: str) -> tuple[str, str] | None:
    """(mode, key) of an item made by a debounce or throttle, else None."""
    mode, sep, key = item_id.partition(":")
    return (mode, key) if sep and key and mode in COLLAPSE_MODES else None


#: Most bytes of a forwarder's name a claim token carries (as hex: twice as many characters);
#: a leased entry holds the token per item, so a long name is cut.
CLAIMER_BYTES = 24
#: Between a token's random part and its claimer: no hex digit, so it cannot be read as random.
_CLAIMER_MARK = "x"
_RANDOM_CHARS = 16


def claim_token(claimer: str = "") -> str:
    """A claim's token: 16 random hex digits, then ``x`` and the claimer's name (its first
    :data:`CLAIMER_BYTES` bytes of UTF-8, in hex) when there is one. Letters and digits only: every
    release's claim (includes/checks.lua) reads a leased entry's token as ``%w+``, and a ``:``
    would split the entry. The random part keeps two claims apart; the name is only read back, by
    :func:`claimer_of`."""
    random_part = secrets.token_hex(_RANDOM_CHARS // 2)
    name = claimer.encode("utf-8", "replace")[:CLAIMER_BYTES]
    return f"{random_part}{_CLAIMER_MARK}{name.hex()}" if name else random_part


def claimer_of(token: str) -> str | None:
    """The forwarder name a claim token carries (:func:`claim_token`; a name cut inside a
    character shows U+FFFD there), None when it carries none (a token of an earlier release, or
    one another tool wrote)."""
    if token[_RANDOM_CHARS : _RANDOM_CHARS + 1] != _CLAIMER_MARK:
        return None
    try:
        return bytes.fromhex(token[_RANDOM_CHARS + 1 :]).decode("utf-8", "replace") or None
    except ValueError:
        return None


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one shard, all in one cluster slot.

    ``hashtag`` comes from :func:`shard_tags`; without it the shard has layout 1's plain tag.
    Each key is built once and kept: every script call names several.
    """

    prefix: str
    shard: int
    hashtag: str | None = None

    @cached_property
    def tag(self) -> str:
        return f"{{{self.hashtag or f'{self.prefix}:{self.shard}'}}}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{self.tag}:{name}"

    @cached_property
    def due(self) -> str:
        """ZSET id -> ready ms (or lease deadline ms while leased)."""
        return self._key("due")

    @cached_property
    def items(self) -> str:
        """HASH id -> envelope bytes."""
        return self._key("items")

    @cached_property
    def tries(self) -> str:
        """HASH id -> delivery attempts so far (absent while 0)."""
        return self._key("tries")

    @cached_property
    def leased(self) -> str:
        """HASH id -> "<deadline ms>:<claim token>:<ready ms>" while a forwarder holds the item."""
        return self._key("leased")

    @cached_property
    def dead(self) -> str:
        """ZSET id -> time of death ms."""
        return self._key("dead")

    @cached_property
    def dead_items(self) -> str:
        """HASH id -> envelope of a dead letter."""
        return self._key("dead_items")

    @cached_property
    def dead_info(self) -> str:
        """HASH id -> JSON {error, attempts, ready_ms} of a dead letter."""
        return self._key("dead_info")

    @cached_property
    def ranked(self) -> str:
        """ZSET id -> rank band + ready ms, for items of rank > 0 only (claimed first).

        Added after layout 2 without a bump: a store that lacks it has no ranked items, and it
        shares the shard's hash tag, so every existing prefix reads as before.
        """
        return self._key("ranked")

    @cached_property
    def parked(self) -> str:
        """ZSET id -> ms when a forwarder looks at the item again: items no forwarder could release
        when claimed (an envelope format newer than it reads, a target kind it lacks), out of the
        due index (their ``due`` score is :data:`PARKED_MS`) so no claim reads them meanwhile.
        Only forwarders write it (park.lua, unpark.lua)."""
        return self._key("parked")

    @cached_property
    def parked_why(self) -> str:
        """HASH id -> why the item is parked (``format:<n>``, ``target:<kind>``): what a forwarder
        must know to release it; read by the re-check, shown in listings."""
        return self._key("parked_why")

    def gline(self, group: str) -> str:
        """ZSET id -> order (``(255 - rank) * 2^44 + ready ms``, as ``ranked``): the shard's line of
        group ``group``, the items that wait for the group to take them (parked, reason
        ``group:<group>``). Producers add to it; forwarders release its heads (group_release.lua).
        Not in :meth:`all`: a key per group."""
        return self._key(f"gline:{group}")

    @cached_property
    def gready(self) -> str:
        """ZSET group -> ms at which the group's line in this shard may next release: its head's
        ready time, the time its rate or throttle allows, or a second ahead while it is at its
        limit or paused (looked at again then by any forwarder, sooner on a wake)."""
        return self._key("gready")

    def started(self, item_id: str, run: int) -> str:
        """STRING written (SET NX PX) when a worker starts run ``run`` of ``item_id``: the
        worker-side dedupe record. Per run, so a retry (same id, next run) is not a duplicate;
        in the item's shard slot, so a forwarder's script can read it beside the item. Not in
        :meth:`all`: no shard script takes it."""
        return self._key(f"started:{run}:{item_id}")

    def calls(self, item_id: str) -> str:
        """HASH {calls: N} of a debounced or throttled item: how many schedules its pending run
        collapsed. Expires a day after the run's ready time (debounce.lua), so keys that are
        never called again cost nothing for long. Not in :meth:`all`."""
        return self._key(f"calls:{item_id}")

    def batch(self, key: str) -> str:
        """HASH of batch ``key`` (closed, completed, failed count, created/completed ms, the
        on_complete envelope), in the shard of :func:`batch_item_id`. Not in :meth:`all`."""
        return self._key(f"batch:{key}")

    def batch_members(self, key: str) -> str:
        """SET of the sub-job ids added to batch ``key``: its total is their count."""
        return self._key(f"batch_members:{key}")

    def batch_done(self, key: str) -> str:
        """SET of the sub-job ids of batch ``key`` that finished (a second finish counts once)."""
        return self._key(f"batch_done:{key}")

    def batch_failed(self, key: str) -> str:
        """LIST of the first failed sub-job ids of batch ``key`` (bounded)."""
        return self._key(f"batch_failed:{key}")

    def batch_fired(self, key: str) -> str:
        """HASH (``at``: ms) made when batch ``key`` completed, for its TTL: the mark that it fired,
        which the producer and worker roles may write only as RENAMENX's target (``acl.py``), so
        a hand write into the batch's hash cannot fire it again. Not named ``batch*``: those
        roles may expire and delete those keys."""
        return self._key(f"fired:{key}")

    def batch_firing(self, key: str) -> str:
        """The fired mark's makings: a scratch HASH that completion renames to :meth:`batch_fired`."""
        return self._key(f"batch_firing:{key}")

    def all(self) -> list[str]:
        """Every key of the shard (each script names the ones it takes: scripts/store.py)."""
        return [
            self.due, self.items, self.tries, self.leased, self.dead, self.dead_items, self.dead_info, self.ranked,
            self.parked, self.parked_why, self.gready,
        ]  # fmt: skip

    def periodic_history(self, name: str) -> str:
        """HASH of periodic entry ``name``'s last runs (``run:<run id>`` -> its record) and its counters
        (missed, late, last_success), in the shard of the entry's item (``periodic:<name>``), so
        one script records an event (periodic_run.lua). Expires unless a run keeps it. Not in
        :meth:`all`."""
        return self._key(f"periodic_history:{name}")

    def periodic_runs(self, name: str) -> str:
        """ZSET run id -> due ms of the runs :meth:`periodic_history` keeps (their order, and the
        bound: the oldest are dropped)."""
        return self._key(f"periodic_runs:{name}")
