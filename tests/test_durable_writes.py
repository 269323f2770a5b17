"""The "durable" column of the write paths (issue 30, finding 4): with ``durable_replicas`` set,
every call that returns success for a write has waited for the replicas, or raises
:class:`NotDurableError`. Real servers: a primary whose replica is cut off (killed).

The write paths are discovered, so a new one without a WAIT fails here:

* every script of the Function library is either acknowledged (the runner waits after each
  call) or internal, with why (``scripts/library.py``);
* every public method of :class:`DelayStore` and every runtime action of ``periodic.ops`` is
  a write (tried here: it must raise, not return), an internal write (with why), or a read;
* every key kind of the hostile-write coverage names the write paths that write it.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery

from delayq_backends import Config, DelayStore, NotDurableError
from delayq_backends.celery.periodic import entry_spec
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedCluster, EmbeddedServer
from delayq_backends.keys import periodic_key
from delayq_backends.models import BatchStatus, FailedDelivery
from delayq_backends.periodic import ops
from delayq_backends.periodic.imports import import_entries
from delayq_backends.periodic.schedules import interval
from delayq_backends.periodic.state import CODE
from delayq_backends.rq.cron import runtime_entry
from delayq_backends.scripts.library import (
    ACKNOWLEDGED_SCRIPTS,
    INTERNAL_SCRIPTS,
    SCRIPT_NAMES,
    ScriptCall,
    ScriptRunner,
)
from delayq_backends.scripts.store import Cancel, ScheduleOne, Take
from delayq_backends.store import SlotAsk, SlotRun
from delayq_backends.targets import RedisListTarget
from tests.harness.servers import SYNC_AT_ONCE
from tests.helpers import wait_for
from tests.test_hostile_layout import COVERED, EXTRA_KINDS, key_kinds

ENVELOPE = RedisListTarget.envelope("out", b"x")
APP = Celery("durable-writes")


@dataclass
class Stores:
    """A durable store on a primary whose replica is cut off, and a plain one (same prefix)
    that sets up what the write needs."""

    durable: DelayStore
    plain: DelayStore


def _scheduled(s: Stores, item_id: str = "a", when: Any = 60) -> str:
    s.plain.schedule(item_id, when, ENVELOPE)
    return item_id


def _dead(s: Stores) -> str:
    """An item buried as a dead letter, through the forwarder's path."""
    _scheduled(s, "a", timedelta(0))
    claim = s.plain.claim(s.plain.shard_of("a"))
    s.plain.fail(claim, [FailedDelivery("a", None, "boom")])
    return "a"


def _batch(s: Stores, *, members: tuple[str, ...] = (), closed: bool = False) -> str:
    s.plain.open_batch("b")
    if members:
        s.plain.add_to_batch("b", list(members))
    if closed:
        s.plain.close_batch("b")
    return "b"


def _entry(s: Stores, name: str = "e") -> str:
    ops.upsert(s.plain, entry_spec(APP, name, {"task": "t.x", "schedule": 10.0}))
    return name


def _run_each(s: Stores) -> None:
    """Two calls in one pipeline: the acknowledged one's reply is the shortfall, the internal one's stands."""
    _scheduled(s)
    keys = s.durable.keys(s.durable.shard_of("a"))
    calls: list[ScriptCall[Any]] = [Cancel.call(keys, "a"), Take.call("t-bucket", 1, rate=1, burst=1, now=0)]
    cancelled, grant = s.durable.run_each(calls)
    assert not isinstance(grant, Exception), "an internal call's reply stands"
    if isinstance(cancelled, Exception):
        raise cancelled


def _run_each_with(s: Stores) -> None:
    """The same calls with a read in one round trip: a user's write among them runs as
    ``run_each`` runs it (its shortfall its reply), the read after."""
    _scheduled(s)
    keys = s.durable.keys(s.durable.shard_of("a"))
    calls: list[ScriptCall[Any]] = [Cancel.call(keys, "a"), Take.call("t-bucket", 1, rate=1, burst=1, now=0)]
    (cancelled, grant), (read,) = s.durable.run_each_with(calls, lambda pipe: pipe.exists(keys.due))
    assert not isinstance(grant, Exception) and isinstance(read, int), "an internal call's reply and the read stand"
    if isinstance(cancelled, Exception):
        raise cancelled


def _pipelined(s: Stores) -> None:
    with s.durable.client.pipeline(transaction=True) as pipe:
        s.durable.schedule("a", 60, ENVELOPE, pipeline=pipe)
        pipe.execute()
    s.durable.confirm_durable()


def _replace_if(s: Stores) -> None:
    item = s.plain.get(_scheduled(s))
    assert item is not None
    s.durable.replace_if("a", item.envelope, 90, ENVELOPE)


def _record_start(s: Stores) -> None:
    shard = s.durable.shard_of("a")
    s.durable.record_start(shard, s.durable.keys(shard).started("a", 0), "host:1 1 1", px=60_000)


def _rq_queue(s: Stores) -> Any:
    """An RQ queue on the store's own server: its enqueue_in writes the job and its item in one
    call (rq_schedule, through ``schedule_with``)."""
    from delayq_backends.rq import Queue

    return Queue(f"{s.durable.config.prefix}-q", connection=s.durable.client, delay_store=s.durable)


#: Every write a user's call returns success for -> the call, made on ``Stores.durable``.
WRITES: dict[str, Callable[[Stores], object]] = {
    "schedule": lambda s: s.durable.schedule("a", 60, ENVELOPE),
    "schedule(batch=)": lambda s: s.durable.schedule("a", 60, ENVELOPE, batch=_batch(s)),
    "schedule_many": lambda s: s.durable.schedule_many([("a", 60, ENVELOPE)]),
    "schedule(slot=)": lambda s: s.durable.schedule("a", 60, ENVELOPE, slot="k"),
    "schedule_checked": lambda s: s.durable.schedule_checked([s.durable.check_item("a", 60, ENVELOPE, 0)]),
    "schedule_with": lambda s: s.durable.schedule_with(
        lambda keys, item, wake: ScheduleOne.call(keys, item, wake=wake), "a", 60, ENVELOPE
    ),
    "reschedule": lambda s: s.durable.reschedule(_scheduled(s), 120),
    "cancel": lambda s: s.durable.cancel(_scheduled(s)),
    "cancel_item": lambda s: s.durable.cancel_item(_scheduled(s)),
    "debounce": lambda s: s.durable.debounce("k", 60, ENVELOPE),
    "throttle": lambda s: s.durable.throttle("k", 60, ENVELOPE),
    "replace_if": _replace_if,
    "requeue_dead": lambda s: s.durable.requeue_dead([_dead(s)]),
    "purge_dead": lambda s: s.durable.purge_dead([_dead(s)]),
    "confirm_durable": _pipelined,
    "run_each": _run_each,
    "run_each_with": _run_each_with,
    "write_acknowledged": lambda s: s.durable.write_acknowledged("w", ("SET", "w", "1")),
    "record_start": _record_start,
    "open_batch": lambda s: s.durable.open_batch("b"),
    "add_to_batch": lambda s: s.durable.add_to_batch(_batch(s), ["x"]),
    "close_batch": lambda s: s.durable.close_batch(_batch(s)),
    "finish_in_batch": lambda s: s.durable.finish_in_batch(_batch(s, members=("x",), closed=True), "x", True),
    "set_slot_limit": lambda s: s.durable.set_slot_limit("k", 2),
    "set_slot_limit(None)": lambda s: s.durable.set_slot_limit("k", None),
    "set_group": lambda s: s.durable.set_group("k", limit=2, rate="10/s", weight=3),
    "set_group(None)": lambda s: s.durable.set_group("k", rate=None, paused=False),
    "pause_group": lambda s: s.durable.pause_group("k"),
    "resume_group": lambda s: s.durable.resume_group("k"),
    "throttle_group": lambda s: s.durable.throttle_group("k", 30),
    "periodic upsert": lambda s: ops.upsert(s.durable, entry_spec(APP, "e", {"task": "t.x", "schedule": 10.0})),
    "periodic pause": lambda s: ops.pause(s.durable, _entry(s)),
    "periodic resume": lambda s: (ops.pause(s.plain, _entry(s)), ops.resume(s.durable, "e")),
    "periodic run_now": lambda s: ops.run_now(s.durable, _entry(s)),
    "periodic backfill": lambda s: ops.backfill(s.durable, _entry(s), 0, 30_000),
    "periodic remove": lambda s: ops.remove(s.durable, [_entry(s)]),
    "periodic remove (registry only)": lambda s: (
        s.plain.client.hset(periodic_key(s.plain.config.prefix), "gone", "periodic:gone"),
        ops.remove(s.durable, ["gone"]),
    ),
    "rq Queue.enqueue_in": lambda s: _rq_queue(s).enqueue_in(timedelta(minutes=1), "builtins.print"),
    "periodic trust_stored": lambda s: (
        ops.upsert(s.plain, runtime_entry("r", "app.jobs.report", queue="q", schedule=interval(10))),
        ops.trust_stored(s.durable, ["r"]),
    ),
    "import periodic.imports.import_entries": lambda s: import_entries(
        s.durable, [entry_spec(APP, "i", {"task": "t.x", "schedule": 10.0})], {}, source="redbeat"
    ),
    "periodic sync_code": lambda s: ops.sync_code(
        s.durable, [entry_spec(APP, "c", {"task": "t.x", "schedule": 10.0}, source=CODE)], kind="celery-periodic"
    ),
}
#: Public methods that write without waiting, and why (docs/guarantees.md, "Failover").
INTERNAL = {
    "claim": "a forwarder's claim: lost, the item is due again",
    "claim_many": "a forwarder's claim: lost, the item is due again",
    "lease": "a forwarder's claim: lost, the item is due again",
    "ack": "lost: the item is published again (at-least-once)",
    "ack_many": "lost: the items are published again (at-least-once)",
    "keep": "lost: the item is published again when its lease ends",
    "release": "lost: the item waits for its lease to end",
    "defer": "lost: the item waits for its lease to end",
    "park": "lost: the item waits for its lease to end, then is claimed and parked again",
    "recheck_parked": "a forwarder's look at its parked items: lost, the next look repeats it",
    "fail": "lost: the delivery is tried again",
    "extend": "lost: the lease ends sooner",
    "rearm": "a forwarder's: lost, the period fires again",
    "rearm_many": "a forwarder's: lost, the periods fire again",
    "take_tokens": "a rate bucket: lost, it refills early once",
    "take_key_tokens": "a rate bucket: lost, it refills early once",
    "take_slots": "a forwarder's slot: lost, the limit may be passed once until holds lapse",
    "hold_slots": "a worker's report on its hold: lost, the hold lapses at its replicated deadline, or ends late",
    "give_back_slots": "a forwarder's give-back of an unpublished item's slot: lost, the hold lapses at its deadline",
    "replace_garbage": "clears a hand write; the caller's record_start that follows waits",
    "replace_envelope": "rq-upgrade's format change: lost, the forwarder dead-letters the item naming rq-upgrade, "
    "which upgrades dead letters too",
    "check_meta": "records the prefix's layout once: lost, the next writer records it again",
    "release_lines": "a forwarder's release of group line heads: lost, they are in their line and released again",
    "to_lines": "lost: the item waits for its lease to end, then is claimed and put in its line again",
    "hand_over": "a forwarder's release of group line heads for slots given back: lost, they are in their "
    "line, looked at within a second",
    "bring_lines_near": "a forwarder's repair of a hand write: lost, the next re-check repeats it",
    "group_rooms": "a forwarder's look at its groups' slot keys (take_slots' fold): lost, the next look repeats it",
    "slots_granted": "take_slots' grants: the items a free slot waits for brought forward: lost, they ask at their "
    "recheck",
}
#: Public methods that write nothing.
READS = {
    "batch_keys_in_use", "batch_status", "batch_statuses", "check_item", "check_payload", "dead_letters",
    "due_histogram", "exists", "from_url", "get", "group_keys", "group_policy", "group_statuses", "groups_in_use",
    "heads", "held", "keys", "lease_key", "meta_drift",
    "pending_in_batch", "rank",
    "scan", "scheduled", "script_now", "server_time_ms", "shard_of", "slot_board", "slot_keys",
    "slot_keys_in_use", "slot_status", "slot_statuses", "slot_token_proof", "started", "stats", "subscribe_wake", "why",
    "due_groups", "line_heads", "group_lines", "line_place", "group_weights", "slot_take_calls",
}  # fmt: skip
#: periodic.ops' public functions that write (their cases above start with "periodic <name>").
PERIODIC_WRITES = {"upsert", "pause", "resume", "run_now", "backfill", "remove", "sync_code", "trust_stored"}

#: The durable column of the hostile-write coverage: every key kind -> the write paths (of
#: WRITES) a user's call writes it through, or "internal: why".
DURABLE = {
    "meta_key": "internal: check_meta",
    "rate_key": "internal: take_tokens",
    "key_rate_key": "internal: take_key_tokens",
    "wake_channel": "internal: a wake-up, not data",
    "periodic_key": "periodic upsert, periodic remove (registry only)",
    "periodic_code_key": "periodic sync_code",  # its version record: lost, an older deploy could sync
    "periodic_trust_key": "periodic trust_stored",  # an operator's definition: lost, its entry is refused
    "ShardKeys.due": "schedule, reschedule, cancel, requeue_dead",
    "ShardKeys.items": "schedule, schedule_many, schedule_with, replace_if, cancel",
    "ShardKeys.tries": "reschedule, cancel",
    "ShardKeys.leased": "cancel",
    "ShardKeys.ranked": "schedule, cancel",
    "ShardKeys.dead": "requeue_dead, purge_dead",
    "ShardKeys.dead_items": "requeue_dead, purge_dead",
    "ShardKeys.dead_info": "requeue_dead, purge_dead",
    "ShardKeys.calls": "debounce, throttle",
    "ShardKeys.started": "record_start",
    "slot_holds_key": "internal: take_slots, give_back_slots",
    "slot_tokens_key": "internal: take_slots, give_back_slots",
    "slot_reports_key": "internal: hold_slots",
    "slot_waiting_key": "internal: take_slots",
    "slot_waits_key": "internal: take_slots",
    "slot_limit_key": "set_slot_limit, set_slot_limit(None), set_group",
    "group_policy_key": "set_group, set_group(None), set_slot_limit, pause_group, resume_group, throttle_group",
    "group_bucket_key": "internal: take_slots (a rate bucket: lost, it refills early once)",
    "ShardKeys.batch": "open_batch, close_batch, finish_in_batch",
    "ShardKeys.batch_members": "add_to_batch, schedule(batch=)",
    "ShardKeys.batch_done": "finish_in_batch",
    "ShardKeys.batch_failed": "finish_in_batch",
    "ShardKeys.batch_fired": "finish_in_batch",  # the completion's mark (batch_end.lua)
    "ShardKeys.batch_firing": "finish_in_batch",  # the mark's makings, renamed in the same call
    "batch_channel": "internal: an advisory notice, not data",
    "ShardKeys.parked": "internal: park, recheck_parked, to_lines (a forwarder's)",
    "ShardKeys.parked_why": "internal: park, recheck_parked, to_lines (a forwarder's)",
    "ShardKeys.gline": "schedule(slot=)",
    "ShardKeys.gready": "schedule(slot=)",
    "group_wake_channel": "internal: a hint, not data",
    "ShardKeys.periodic_history": "internal: the run history (periodic_run)",
    "ShardKeys.periodic_runs": "internal: the run history (periodic_run)",
    "rq mirror": "internal: RQ's registry, a mirror the forwarder rebuilds",
    "audit stream": "internal: the audit trail, written beside the forwarder's ack",
}


def test_every_script_says_whether_it_waits() -> None:
    assert ACKNOWLEDGED_SCRIPTS.isdisjoint(INTERNAL_SCRIPTS)
    unsaid = set(SCRIPT_NAMES) - ACKNOWLEDGED_SCRIPTS - INTERNAL_SCRIPTS.keys()
    assert unsaid == set(), "a script neither acknowledged nor internal: add it to one (scripts/library.py)"
    assert (ACKNOWLEDGED_SCRIPTS | INTERNAL_SCRIPTS.keys()) - set(SCRIPT_NAMES) == set(), "names a gone script"


def test_every_public_write_path_is_tried_or_says_why_not() -> None:
    public = {n for n, v in inspect.getmembers(DelayStore) if not n.startswith("_") and callable(v)}
    tried = {name.split("(")[0] for name in WRITES if not name.startswith(("periodic ", "rq ", "import "))}
    assert tried.isdisjoint(INTERNAL) and tried.isdisjoint(READS) and READS.isdisjoint(INTERNAL)
    assert public - tried - INTERNAL.keys() - READS == set(), "a new store method: a write (WRITES), INTERNAL or READS"
    assert (tried | INTERNAL.keys() | READS) - public == set(), "names a method the store no longer has"
    actions = {n for n in ops.__all__ if inspect.isfunction(getattr(ops, n))}
    reads = {"get", "statuses", "status_page", "item_id", "keep_alignment", "preview"}
    assert actions - reads == PERIODIC_WRITES, "a new periodic action: a case in WRITES, or a read"
    assert {name.split()[1] for name in WRITES if name.startswith("periodic ")} == PERIODIC_WRITES


def test_every_key_kind_has_a_durable_column() -> None:
    assert DURABLE.keys() == key_kinds() | EXTRA_KINDS == COVERED.keys()
    for kind, paths in DURABLE.items():
        if not paths.startswith("internal: "):
            assert set(paths.split(", ")) <= WRITES.keys(), f"{kind}: {paths} names a path WRITES lacks"


def replica_of(primary: EmbeddedServer) -> EmbeddedServer:
    """A replica of ``primary``, started and synced."""
    replica = EmbeddedServer(args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    info = redis.Redis(port=replica.port)
    wait_for(lambda: info.info("replication").get("master_link_status") == "up", 20, "the replica to sync")
    return replica


@pytest.fixture(scope="module")
def cut_off() -> Iterator[EmbeddedServer]:
    """A primary whose replica synced and was then killed: WAIT 1 answers 0."""
    with EmbeddedServer(args=SYNC_AT_ONCE) as primary:
        replica_of(primary).stop()
        yield primary


def refusals(url: str, replicas: int, skip: frozenset[str] = frozenset()) -> tuple[dict[str, str], set[str]]:
    """Each write path of WRITES (but ``skip``) made with ``durable_replicas=replicas`` on
    ``url``, a prefix each: those that returned success (path -> reply), and the scripts run."""
    ran: set[str] = set()
    queue = ScriptRunner.queue

    def seen(runner: ScriptRunner, call: ScriptCall[Any], pipe: Any) -> None:
        ran.add(call.name)
        queue(runner, call, pipe)

    acknowledged = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ScriptRunner, "queue", seen)
        for name, write in WRITES.items():
            if name in skip:
                continue
            config = Config(
                prefix=f"d{uuid.uuid4().hex[:8]}", shards=4, durable_replicas=replicas, durable_timeout_ms=50
            )
            plain = DelayStore(connect(url), replace(config, durable_replicas=0))
            try:
                acknowledged[name] = repr(write(Stores(DelayStore(connect(url), config), plain)))
            except NotDurableError:
                continue
    return acknowledged, ran


def test_every_write_path_refuses_success_without_its_replica(cut_off: EmbeddedServer) -> None:
    """The durable column: each write path, on a primary whose replica is cut off, raises
    NotDurableError instead of returning success; and between them they run every script
    the library calls acknowledged."""
    acknowledged, ran = refusals(cut_off.url, 1)
    assert acknowledged == {}, f"{len(acknowledged)} of {len(WRITES)} write paths returned success without a replica"
    assert ACKNOWLEDGED_SCRIPTS - ran == set(), "an acknowledged script no write path ran: add its path to WRITES"


@pytest.mark.cluster
def test_on_a_cluster_each_write_waits_on_the_node_that_holds_its_keys(redis_cluster: EmbeddedCluster) -> None:
    """On a cluster (one replica per primary) asking for 2: every write path is refused by the
    WAIT of the node its keys live on (a WAIT sent elsewhere would meet MOVED instead). Not the
    paths that need the store's own server (a caller's transaction, RQ on the store's Redis)."""
    acknowledged, _ = refusals(redis_cluster.url, 2, frozenset({"confirm_durable", "rq Queue.enqueue_in"}))
    assert acknowledged == {}


@dataclass(frozen=True)
class Step:
    """One write of the finding's run, and how to read on a store that it is there."""

    what: str
    key: str
    write: Callable[[DelayStore], object]
    there: Callable[[DelayStore], bool]


def _steps(n: int) -> list[Step]:
    """A batch's life (open, add its one sub-job, close, its worker's final report) and a slot
    limit: the writes finding 4 saw acknowledged without a replica."""
    batch, slot = f"b{n}", f"k{n}"

    def batch_has(check: Callable[[BatchStatus], bool]) -> Callable[[DelayStore], bool]:
        return lambda store: (found := store.batch_status(batch)) is not None and check(found)

    return [
        Step("open_batch", batch, lambda s: s.open_batch(batch), batch_has(lambda b: True)),
        Step("add_to_batch", batch, lambda s: s.add_to_batch(batch, ["x"]), batch_has(lambda b: b.total == 1)),
        Step("close_batch", batch, lambda s: s.close_batch(batch), batch_has(lambda b: b.closed)),
        Step("finish_in_batch", batch, lambda s: s.finish_in_batch(batch, "x", True), batch_has(lambda b: b.completed)),
        Step(
            "set_slot_limit",
            slot,
            lambda s: s.set_slot_limit(slot, n % 9 + 1),
            lambda s: s.slot_status(slot).limit == n % 9 + 1,
        ),
    ]


def test_a_failover_loses_no_acknowledged_batch_or_slot_write() -> None:
    """Finding 4's run: 20 batches and slot limits written with durable_replicas=1, the replica
    cut off (REPLICAOF NO ONE) after the 10th and then taken as the new primary. Every write
    acknowledged is on it (before: 20 of 20 after the cut were lost, and a lost final
    finish_in_batch left its batch open for ever); the refused ones, retried once the new
    primary has a replica, complete every batch."""
    with EmbeddedServer(args=SYNC_AT_ONCE) as primary:
        replica = replica_of(primary)
        try:
            config = Config(prefix=f"f{uuid.uuid4().hex[:8]}", shards=4, durable_replicas=1, durable_timeout_ms=200)
            store = DelayStore(connect(primary.url), config)
            acknowledged: list[Step] = []
            refused: list[list[Step]] = []
            for n in range(20):
                if n == 10:
                    redis.Redis(port=replica.port).replicaof("NO", "ONE")  # cut off: the failover's new primary
                steps = _steps(n)
                for done, step in enumerate(steps):
                    try:
                        step.write(store)
                    except NotDurableError:
                        refused.append(steps[done:])  # the application retries from here
                        break
                    acknowledged.append(step)
            primary.kill()
            promoted = DelayStore(connect(replica.url), replace(config, url=replica.url))
            lost = [f"{s.what} {s.key}" for s in acknowledged if not s.there(promoted)]
            assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged writes lost: {lost}"
            assert len(acknowledged) >= 50 and len(refused) == 10, (len(acknowledged), len(refused))
            again = replica_of(replica)  # the new primary's replica: the refused writes, retried, succeed
            try:
                for steps in refused:
                    for step in steps:
                        step.write(promoted)
            finally:
                again.stop()
            open_for_ever = [f"b{n}" for n in range(20) if not _steps(n)[3].there(promoted)]
            assert open_for_ever == []
        finally:
            replica.stop()


def test_the_forwarders_and_workers_bookkeeping_does_not_wait(cut_off: EmbeddedServer) -> None:
    """The other side of the decision (INTERNAL): claims, acks, defers, fails, extends, rate
    tokens and slot holds send no WAIT, so a replica's round trip is in none of them, and a
    replica down does not stop forwarding."""
    config = Config(prefix=f"d{uuid.uuid4().hex[:8]}", shards=1, durable_replicas=1, durable_timeout_ms=50)
    store = DelayStore(connect(cut_off.url), replace(config, durable_replicas=0))
    for n in range(4):
        store.schedule(f"i{n}", timedelta(0), ENVELOPE)
    durable = DelayStore(connect(cut_off.url), config)
    server = redis.Redis.from_url(cut_off.url)
    waits_before = server.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
    lease = durable.lease(0)
    assert len(lease.items) == 4
    lease.extend()
    lease.ack(["i0"])
    lease.release(["i1"])
    lease.defer([("i2", durable.clock() + 60_000)])
    lease.fail([FailedDelivery("i3", None, "boom")])
    durable.take_tokens("q", 1, rate=1, burst=1)
    durable.take_slots({"k": SlotAsk(2, [("i1", 0)])}, hold_ms=60_000, wait_ms=15_000)
    durable.hold_slots({"k": [SlotRun("i1", "")]}, "start", hold_ms=60_000)
    durable.hold_slots({"k": [SlotRun("i1", "")]}, "end")
    durable.give_back_slots({"k": ["i1"]})
    assert server.info("commandstats").get("cmdstat_wait", {}).get("calls", 0) == waits_before
