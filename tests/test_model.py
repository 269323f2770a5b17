"""The store against a plain-Python reference model, by a Hypothesis state machine.

Hypothesis drives schedule (replace/keep, bulk, with ranks), cancel, reschedule, claim, ack,
release, fail, dead-letter requeue/purge and the passing of time, on six ids over 1-3 shards so
that ids collide, leases expire and items run out of attempts. After every step the store must
agree with the model: each item's ready time, lease, attempts and rank, ``exists``, the counts,
each shard's head, ``list`` order, the dead letters and the wake-up messages; every claim
must return exactly the model's due items (deadline now+lease): ranked ones first, highest rank
then earliest *by the ranked index*, then the rest earliest first (score <= now).

The model keeps the ready time each ranked item's index entry holds (``Item.indexed``), which
lags behind its score after a failed delivery's retry until a claim meets it, as the lazy
index does; that is what decides the order among ranked items of one rank.

Time is the model's: every claim and failure passes ``now=T``, and ready times are exact
integer milliseconds (``ms / 1000`` epoch seconds round back to ``ms``).

The model's lease is the *claim*: an ack, release or fail acts only while that very claim
still holds the item, even when another claim of it has the same deadline (claimed in the
same millisecond after a replace or release, or later with a shorter lease).

The same machine runs on fakeredis (fast, many examples) and on the embedded Valkey (real
Lua 5.1 and reply formats, fewer examples). ``pytest --hypothesis-show-statistics`` lists
which protocol paths the run exercised (the ``event`` lines).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from delayq_backends import Claim, Config, DelayStore, Envelope
from delayq_backends.connection import connect
from delayq_backends.keys import shard_of
from delayq_backends.models import FailCounts, FailedDelivery
from delayq_backends.testing import TestingStore

IDS = ["a", "b", "c", "d", "e", "f"]
T0 = 1_750_000_000_000  # the model's start: a realistic 13-digit ms time
LEASES = [1_000, 5_000]
#: Ready times relative to the model's now: mostly due or nearly due, with the boundaries
#: (one ms either side of "now") drawn often, since "score <= now" is the claim's contract.
OFFSETS = st.one_of(st.integers(-2_000, 3_000), st.sampled_from([-1, 0, 1, 999, 1_000, 1_001]))
ERRORS = st.sampled_from(["boom", "broker said no", 'ünïcode ✗ "quoted"'])
#: Mostly rank 0, as in real use; two ranks so the claim orders ranks as well as times.
RANKS = st.sampled_from([0, 0, 1, 2])

StoreFactory = Callable[[Config], DelayStore]


@dataclass
class Lease:
    token: int  # the claim that holds it
    deadline: int


@dataclass
class Item:
    ready: int  # the item's own ready time, kept while leased
    envelope: bytes
    rank: int = 0
    indexed: int = 0  # the ready time of its ranked index entry (rank > 0)
    attempts: int = 0
    lease: Lease | None = None  # kept after expiry until the item is claimed again

    @property
    def score(self) -> int:
        """What the due ZSET holds: the lease deadline while leased, else the ready time."""
        return self.lease.deadline if self.lease else self.ready


@dataclass
class Dead:
    envelope: bytes | None
    attempts: int
    error: str
    died: int
    ready: int
    rank: int


@dataclass(frozen=True)
class ClaimRecord:
    claim: Claim
    token: int

    def __repr__(self) -> str:  # short, for Hypothesis' printed failing sequence
        return f"<claim#{self.token} shard={self.claim.shard} ids={[i.id for i in self.claim.items]}>"


@dataclass
class Model:
    """The store as plain Python: what each call should do and answer."""

    shards: int
    max_attempts: int
    now: int = T0
    items: dict[str, Item] = field(default_factory=dict)
    dead: dict[str, Dead] = field(default_factory=dict)
    tokens: int = 0
    deadlines: dict[int, int] = field(default_factory=dict)  # claim token -> its deadline

    def shard(self, item_id: str) -> int:
        return shard_of(item_id, self.shards)

    def heads(self) -> list[int | None]:
        """Each shard's earliest score, None when empty."""
        heads: list[int | None] = [None] * self.shards
        for item_id, item in self.items.items():
            k = self.shard(item_id)
            head = heads[k]
            heads[k] = item.score if head is None else min(item.score, head)
        return heads

    def schedule(self, item_id: str, ready: int, envelope: bytes, keep: bool, rank: int) -> str:
        if item_id not in self.items:
            self.items[item_id] = Item(ready, envelope, rank, ready)
            return "added"
        if keep:
            return "kept"
        self.items[item_id] = Item(ready, envelope, rank, ready)  # lease and attempts dropped
        return "replaced"

    def claim(self, shard: int, limit: int, lease: int) -> list[tuple[str, bytes, int, int]]:
        self.tokens += 1
        self.deadlines[self.tokens] = self.now + lease
        out: list[tuple[str, bytes, int, int]] = []
        budget = limit  # a buried item uses up the limit too
        # ranked index entries due by their own time, in index order (ties by id, as in a ZSET)
        ranked = sorted(
            (-it.rank, it.indexed, i)
            for i, it in self.items.items()
            if self.shard(i) == shard and it.rank and it.indexed <= self.now
        )
        for _, _, item_id in ranked:
            if budget == 0:
                break
            item = self.items[item_id]
            if item.score <= self.now:
                event("claim: ranked item first")
                self.take(item_id, out)
                budget -= 1
            elif item.lease:
                event("claim: leased ranked item stepped over")
            else:
                event("claim: ranked entry moved to its item's later time")
                item.indexed = item.score
        due = sorted((it.score, i) for i, it in self.items.items() if self.shard(i) == shard and it.score <= self.now)
        for _, item_id in due[:budget]:
            self.take(item_id, out)
        return out

    def take(self, item_id: str, out: list[tuple[str, bytes, int, int]]) -> None:
        """Lease a due item to the latest claim, or bury it when out of attempts."""
        item = self.items[item_id]
        event("claim: lease expired, claimed again" if item.lease else "claim: due item")
        item.attempts += 1
        if item.attempts > self.max_attempts:
            event("claim: out of attempts, dead-lettered")
            self.bury(item_id, item.envelope, item.attempts, "claimed", item.ready)
        else:
            item.lease = Lease(self.tokens, self.deadlines[self.tokens])
            out.append((item_id, item.envelope, item.attempts, item.ready))

    def bury(self, item_id: str, envelope: bytes | None, attempts: int, error: str, ready: int) -> None:
        rank = self.items.pop(item_id).rank
        self.dead[item_id] = Dead(envelope, attempts, error, self.now, ready, rank)

    def held_by(self, item_id: str, token: int, op: str) -> Item | None:
        """The item if claim ``token`` still holds it; notes why not, for the statistics."""
        item = self.items.get(item_id)
        if item is None:
            event(f"{op}: item gone since the claim")
        elif item.lease is None:
            event(f"{op}: item unleased since the claim (rescheduled, replaced, released, retried)")
        elif item.lease.token != token:
            same = self.deadlines.get(token) == item.lease.deadline
            event(f"{op}: item held by a later claim" + (" with the same deadline" if same else ""))
        else:
            event(f"{op}: our live lease" if item.lease.deadline > self.now else f"{op}: our expired lease")
            return item
        return None


class DelayStoreModel(RuleBasedStateMachine):
    """Subclasses say where the store runs, through :meth:`make_store`."""

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.store: DelayStore | None = None
        self.model = Model(1, 1)
        self.serial = 0
        self.latest: ClaimRecord | None = None
        self.wakes: Any = None
        self.expected_wakes: list[int] = []

    def make_store(self, config: Config) -> DelayStore:
        raise NotImplementedError

    @initialize(shards=st.integers(1, 3), max_attempts=st.integers(1, 3))
    def setup(self, shards: int, max_attempts: int) -> None:
        config = Config(prefix=f"m{uuid.uuid4().hex[:12]}", shards=shards, max_attempts=max_attempts)
        self.store = self.make_store(config)
        self.model = Model(shards, max_attempts)
        self.wakes = self.store.client.pubsub()
        self.wakes.subscribe(self.store.wake_channel)
        confirmed = self.wakes.get_message(timeout=5)  # subscribed before anything publishes
        assert confirmed is not None and confirmed["type"] == "subscribe"

    @property
    def s(self) -> DelayStore:
        assert self.store is not None
        return self.store

    def envelope(self, item_id: str) -> bytes:
        self.serial += 1  # a new body each time, so a replaced item is told from its successor
        return Envelope("list", "out", f"{item_id}:{self.serial}".encode()).encode()

    # -- scheduling ---------------------------------------------------------------------------

    @rule(item_id=st.sampled_from(IDS), offset=OFFSETS, keep=st.booleans(), rank=RANKS)
    def schedule(self, item_id: str, offset: int, keep: bool, rank: int) -> None:
        ready, envelope, before = self.model.now + offset, self.envelope(item_id), self.model.heads()
        got = self.s.schedule(item_id, ready / 1000, envelope, mode="keep" if keep else "replace", rank=rank)
        assert got == self.model.schedule(item_id, ready, envelope, keep, rank)
        self.expect_wakes(before)

    @rule(entries=st.lists(st.tuples(st.sampled_from(IDS), OFFSETS, RANKS), min_size=1, max_size=5), keep=st.booleans())
    def schedule_many(self, entries: list[tuple[str, int, int]], keep: bool) -> None:
        """Several ids at once, across shards, duplicates within one call included."""
        m = self.model
        batch = [(item_id, m.now + offset, self.envelope(item_id), rank) for item_id, offset, rank in entries]
        before = m.heads()
        counts = self.s.schedule_many([(i, r / 1000, e, k) for i, r, e, k in batch], mode="keep" if keep else "replace")
        # One script call per shard, each in input order: the model goes shard by shard.
        outcomes = [m.schedule(i, r, e, keep, k) for i, r, e, k in sorted(batch, key=lambda b: m.shard(b[0]))]
        assert (counts.added, counts.replaced, counts.kept) == tuple(
            outcomes.count(k) for k in ("added", "replaced", "kept")
        )
        self.expect_wakes(before)

    @rule(item_id=st.sampled_from(IDS))
    def cancel(self, item_id: str) -> None:
        item = self.model.items.pop(item_id, None)
        expected = "not found" if item is None else "in flight" if item.lease else "cancelled"
        assert self.s.cancel(item_id).value == expected

    @rule(item_id=st.sampled_from(IDS), offset=OFFSETS)
    def reschedule(self, item_id: str, offset: int) -> None:
        ready, item, before = self.model.now + offset, self.model.items.get(item_id), self.model.heads()
        expected = "not found" if item is None else "in flight" if item.lease else "rescheduled"
        assert self.s.reschedule(item_id, ready / 1000).value == expected
        if item is not None and not item.lease:  # a leased item is left alone (it may be published)
            # reschedule starts attempts afresh; the ranked entry moves with it
            item.ready, item.indexed, item.lease, item.attempts = ready, ready, None, 0
        self.expect_wakes(before)

    # -- time ---------------------------------------------------------------------------------

    @rule(ms=st.one_of(st.integers(0, 1_500), st.sampled_from(LEASES)))
    def advance(self, ms: int) -> None:
        self.model.now += ms

    @precondition(lambda self: any(i.score > self.model.now for i in self.model.items.values()))
    @rule(skew=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_next_score(self, skew: int) -> None:
        """Jump to the next ready time or lease deadline, or one ms either side of it."""
        m = self.model
        m.now = max(m.now, min(i.score for i in m.items.values() if i.score > m.now) + skew)

    @precondition(lambda self: any(i.lease and i.lease.deadline > self.model.now for i in self.model.items.values()))
    @rule(skew=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_lease_deadline(self, skew: int) -> None:
        """Jump to the next lease deadline, or one ms either side of it: leases expire."""
        m = self.model
        deadlines = [i.lease.deadline for i in m.items.values() if i.lease and i.lease.deadline > m.now]
        m.now = max(m.now, min(deadlines) + skew)

    # -- the lease protocol -------------------------------------------------------------------

    @rule(target=claims, via=st.sampled_from(IDS), limit=st.integers(1, 4), lease=st.sampled_from(LEASES))
    def claim(self, via: str, limit: int, lease: int) -> Any:
        """Claim the shard of id ``via``, so claims land where items are."""
        return self._claim(self.model.shard(via), limit, lease)

    @precondition(lambda self: any(i.score <= self.model.now for i in self.model.items.values()))
    @rule(target=claims, data=st.data(), limit=st.integers(1, 4), lease=st.sampled_from(LEASES))
    def claim_where_due(self, data: st.DataObject, limit: int, lease: int) -> Any:
        """Claim a shard that has a due item (a second claim rule: claims are the heart of it)."""
        m = self.model
        due = sorted({m.shard(i) for i, item in m.items.items() if item.score <= m.now})
        return self._claim(data.draw(st.sampled_from(due), label="shard"), limit, lease)

    def _claim(self, shard: int, limit: int, lease: int) -> Any:
        m = self.model
        claim = self.s.claim(shard, limit=limit, lease_ms=lease, now=m.now)
        assert claim.shard == shard and claim.deadline_ms == m.now + lease
        expected = m.claim(shard, limit, lease)
        assert [(c.id, c.envelope, c.attempts, c.ready_ms) for c in claim.items] == expected
        if not claim.items:
            return multiple()  # nothing to ack in an empty claim
        self.latest = ClaimRecord(claim, m.tokens)
        return self.latest

    # ack, release and fail each come twice: on any claim made so far (mostly stale ones, which
    # must change nothing), and on the latest claim (mostly live leases, which must take effect).

    @rule(record=claims, data=st.data())
    def ack(self, record: ClaimRecord, data: st.DataObject) -> None:
        self._ack(record, data)

    @precondition(lambda self: self.latest is not None)
    @rule(data=st.data())
    def ack_latest(self, data: st.DataObject) -> None:
        assert self.latest is not None
        self._ack(self.latest, data)

    @rule(record=claims, data=st.data())
    def release(self, record: ClaimRecord, data: st.DataObject) -> None:
        self._release(record, data)

    @precondition(lambda self: self.latest is not None)
    @rule(data=st.data())
    def release_latest(self, data: st.DataObject) -> None:
        assert self.latest is not None
        self._release(self.latest, data)

    @rule(record=claims, data=st.data())
    def fail(self, record: ClaimRecord, data: st.DataObject) -> None:
        self._fail(record, data)

    @precondition(lambda self: self.latest is not None)
    @rule(data=st.data())
    def fail_latest(self, data: st.DataObject) -> None:
        assert self.latest is not None
        self._fail(self.latest, data)

    def _ack(self, record: ClaimRecord, data: st.DataObject) -> None:
        ids = self._ids(data, record)
        deleted = 0
        for item_id in self._all(record, ids):
            if self.model.held_by(item_id, record.token, "ack"):
                del self.model.items[item_id]
                deleted += 1
        assert self.s.ack(record.claim, ids) == deleted

    def _release(self, record: ClaimRecord, data: st.DataObject) -> None:
        ids = self._ids(data, record)
        released, before = 0, self.model.heads()
        for item_id in self._all(record, ids):
            item = self.model.held_by(item_id, record.token, "release")
            if item:  # back at its own ready time, the attempt not counted
                item.lease, item.attempts = None, max(0, item.attempts - 1)
                released += 1
        assert self.s.release(record.claim, ids) == released
        self.expect_wakes(before)

    def _fail(self, record: ClaimRecord, data: st.DataObject) -> None:
        m = self.model
        retry_at = st.one_of(st.none(), OFFSETS.map(lambda offset: m.now + offset))
        ids = st.sampled_from([item.id for item in record.claim.items])
        failures = data.draw(st.lists(st.tuples(ids, retry_at, ERRORS), min_size=1, max_size=3), label="failures")
        retried = buried = 0
        for item_id, retry, error in failures:
            item = m.held_by(item_id, record.token, "fail")
            if item is None:
                continue
            if retry is None or item.attempts >= m.max_attempts:
                event("fail: permanent, dead-lettered" if retry is None else "fail: out of attempts, dead-lettered")
                m.bury(item_id, item.envelope, item.attempts, error, item.ready)
                buried += 1
            else:
                event("fail: retried later")
                item.ready, item.lease = retry, None  # the attempt stays counted
                retried += 1
        failed = [FailedDelivery(*f) for f in failures]
        assert self.s.fail(record.claim, failed, now=m.now) == FailCounts(retried, buried)

    @staticmethod
    def _all(record: ClaimRecord, ids: list[str] | None) -> list[str]:
        return [item.id for item in record.claim.items] if ids is None else ids

    def _ids(self, data: st.DataObject, record: ClaimRecord) -> list[str] | None:
        """None (all of the claim's ids, the store's default) or a drawn list, repeats allowed."""
        if data.draw(st.booleans(), label="all ids"):
            return None
        return data.draw(st.lists(st.sampled_from(self._all(record, None)), max_size=4), label="ids")

    # -- dead letters -------------------------------------------------------------------------

    @rule(ids=st.one_of(st.none(), st.lists(st.sampled_from(IDS), max_size=3)), offset=OFFSETS)
    def requeue_dead(self, ids: list[str] | None, offset: int) -> None:
        self._requeue(ids, offset)

    @precondition(lambda self: self.model.dead)
    @rule(data=st.data(), offset=OFFSETS)
    def requeue_a_dead_letter(self, data: st.DataObject, offset: int) -> None:
        self._requeue([data.draw(st.sampled_from(sorted(self.model.dead)), label="id")], offset)

    def _requeue(self, ids: list[str] | None, offset: int) -> None:
        m = self.model
        ready, requeued, before = m.now + offset, 0, m.heads()
        for item_id in sorted(set(m.dead if ids is None else ids)):
            dead = m.dead.get(item_id)
            if dead is None:
                continue
            if dead.envelope is not None and item_id not in m.items:
                event("requeue: dead letter scheduled again")
                m.items[item_id] = Item(ready, dead.envelope, dead.rank, ready)  # with the rank it died with
                del m.dead[item_id]
                requeued += 1
            else:
                event("requeue: skipped, the id is scheduled again already")
        assert self.s.requeue_dead(ids, when=ready / 1000) == requeued
        self.expect_wakes(before)

    @rule(ids=st.one_of(st.none(), st.lists(st.sampled_from(IDS), max_size=3)))
    def purge_dead(self, ids: list[str] | None) -> None:
        m = self.model
        purged = [i for i in (list(m.dead) if ids is None else sorted(set(ids))) if i in m.dead]
        for item_id in purged:
            del m.dead[item_id]
        assert self.s.purge_dead(ids) == len(purged)

    # -- what must hold after every step ------------------------------------------------------

    @invariant()
    def items_match(self) -> None:
        if self.store is None:
            return
        m = self.model
        for item_id in IDS:
            got, item = self.s.get(item_id), m.items.get(item_id)
            assert self.s.exists(item_id) == (item is not None)
            if item is None:
                assert got is None, f"{item_id} should not be scheduled: {got}"
                continue
            assert got is not None, f"{item_id} is missing from the store"
            deadline = item.lease.deadline if item.lease else None
            expected = (m.shard(item_id), item.ready, item.envelope, item.attempts, deadline)
            assert (got.shard, got.ready_ms, got.envelope, got.attempts, got.leased_until_ms) == expected, item_id
            assert self.s.rank(item_id) == item.rank, item_id

    @invariant()
    def counts_heads_and_order_match(self) -> None:
        if self.store is None:
            return
        m = self.model
        stats = self.s.stats()
        assert sum(s.scheduled for s in stats) == len(m.items)
        assert sum(s.leased for s in stats) == sum(1 for i in m.items.values() if i.lease)
        assert sum(s.dead for s in stats) == len(m.dead)
        assert self.s.heads() == m.heads()
        order = sorted((item.score, m.shard(i), i) for i, item in m.items.items())
        assert [i.id for i in self.s.scheduled(count=len(IDS))] == [i for _, _, i in order]

    @invariant()
    def dead_letters_match(self) -> None:
        if self.store is None:
            return
        m = self.model
        letters = self.s.dead_letters()
        got = {d.id: (d.shard, d.envelope, d.attempts, d.died_ms, d.ready_ms) for d in letters}
        assert got == {i: (m.shard(i), d.envelope, d.attempts, d.died, d.ready) for i, d in m.dead.items()}
        assert [d.died_ms for d in letters] == sorted((d.died_ms for d in letters), reverse=True)
        for d in letters:
            if m.dead[d.id].error == "claimed":  # out of attempts: the claim script says why
                assert d.error.startswith(f"claimed {d.attempts} times without an ack"), d.error
            else:
                assert d.error == m.dead[d.id].error

    def expect_wakes(self, before: list[int | None]) -> None:
        """A schedule, reschedule, release or requeue that makes a shard's head earlier
        publishes the new head, once per script call. Nothing else publishes."""
        for old, new in zip(before, self.model.heads()):
            if new is not None and (old is None or new < old):
                self.expected_wakes.append(new)

    @invariant()
    def wakes_match(self) -> None:
        if self.wakes is None:
            return
        got: list[int] = []
        while True:  # a real server's messages may trail the script's reply a little
            message = self.wakes.get_message(timeout=2.0 if len(got) < len(self.expected_wakes) else 0.0)
            if message is None:
                break
            got.append(int(message["data"]))
        assert sorted(got) == sorted(self.expected_wakes)
        self.expected_wakes = []

    def teardown(self) -> None:
        if self.wakes is not None:
            self.wakes.close()
        if self.store is not None:
            keys = list(self.store.client.scan_iter(match=f"{self.store.config.prefix}:*", count=1000))
            if keys:
                self.store.client.delete(*keys)
            self.store.client.close()


def machine_on(make: StoreFactory) -> type[DelayStoreModel]:
    """The machine with its store made by ``make``."""

    class Machine(DelayStoreModel):
        def make_store(self, config: Config) -> DelayStore:
            return make(config)

    return Machine


FAST = settings(max_examples=50, stateful_step_count=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REAL = settings(max_examples=40, stateful_step_count=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TestOnFakeredis(machine_on(TestingStore).TestCase):  # type: ignore[misc]
    settings = FAST


def test_on_embedded_valkey(valkey_url: str) -> None:
    def make(config: Config) -> DelayStore:
        store = DelayStore(connect(valkey_url), config)
        store.client.script_flush()  # each example loads the scripts again: the NOSCRIPT path
        return store

    run_state_machine_as_test(machine_on(make), settings=REAL)


# -- bugs the model found (fixed in 3f2fe2b), as plain regression tests -----------------------


@pytest.mark.parametrize("void_first", ["replace", "release"])  # a reschedule leaves a leased item alone
@pytest.mark.parametrize("leases", [(1_000, 0, 1_000), (5_000, 4_000, 1_000)])
def test_a_stale_claim_never_acts_on_a_later_claims_item(void_first: str, leases: tuple[int, int, int]) -> None:
    """Two claims of one item with the same deadline: the same ms and lease, or a shorter lease
    later. The first claim's lease is void; its ack must not delete what the second holds."""
    first_lease, later, second_lease = leases
    store = TestingStore(Config(prefix=f"collide{uuid.uuid4().hex[:8]}", shards=1))
    store.schedule("x", T0 / 1000, Envelope("list", "out", b"v1"))
    first = store.claim(0, lease_ms=first_lease, now=T0)
    if void_first == "replace":
        store.schedule("x", T0 / 1000, Envelope("list", "out", b"v2"))
    else:
        store.release(first)
    second = store.claim(0, lease_ms=second_lease, now=T0 + later)
    assert first.deadline_ms == second.deadline_ms and [i.id for i in second.items] == ["x"]
    assert store.ack(first) == 0
    assert store.fail(first, [FailedDelivery("x", None, "stale")], now=T0 + later) == FailCounts(0, 0)
    assert store.release(first) == 0
    assert store.release(second) == 1  # the second claim still holds it


def test_purging_the_dead_letter_named_star_purges_only_it() -> None:
    """ "*" is a valid id; it once also meant "every dead letter of the shard"."""
    store = TestingStore(Config(prefix="star", shards=1))
    for item_id in ("*", "a"):
        store.schedule(item_id, T0 / 1000, Envelope("list", "out", b"x"))
        store.fail(store.claim(0, now=T0), [FailedDelivery(item_id, None, "boom")], now=T0)
    assert sorted(d.id for d in store.dead_letters()) == ["*", "a"]
    assert store.purge_dead(["*"]) == 1
    assert [d.id for d in store.dead_letters()] == ["a"]
