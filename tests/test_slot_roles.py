"""Concurrency slots against the roles' own credentials (issue 30, finding 2): a worker
credential can neither block a slot key (a day-long hold, phantom holds or places in line) nor
overrun it (ending holds it was not given), and a producer's items sent where nobody reads hold
their slots no longer than the forwarder's start window. Real servers, the ACL users
``delayq acl`` makes, a real forwarder (in a thread, on the forwarder role's credential)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
import redis

from delayq_backends import DelayStore
from delayq_backends import keys as layout
from delayq_backends.forwarder import Forwarder
from delayq_backends.scripts import function_name
from delayq_backends.slots import SlotGuard
from delayq_backends.store import SlotRun
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.helpers import wait_for
from tests.test_security import Admin, admin, open_store, user_url  # noqa: F401 (admin: a fixture)

DAY_MS = 86_400_000
#: What a worker credential may try on a slot key's keys, each raw (the scripts of the release
#: before this one included): refused, or nothing comes of it.
REFUSED = (redis.exceptions.NoPermissionError, redis.exceptions.ResponseError)


@dataclass
class Roles:
    """A forwarder (in a thread, over a collecting target), a producer and a worker, each on
    its role's credential for one prefix."""

    producer: DelayStore
    worker: DelayStore
    forwarder_store: DelayStore
    start_window: float = 60.0
    inbox: CollectingTarget = field(default_factory=lambda: CollectingTarget("list"))
    forwarder: Forwarder | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.forwarder = Forwarder(
            self.forwarder_store, [self.inbox], poll_interval=0.05, slot_start_window=self.start_window
        )
        self.thread = threading.Thread(target=self.forwarder.run, kwargs={"install_signals": False})
        self.thread.start()

    def stop(self) -> None:
        if self.forwarder is not None and self.thread is not None:
            self.forwarder.stop()
            self.thread.join(10)

    def of(self, key: str) -> list[str]:
        return [i for i in self.inbox.ids if i.startswith(f"{key}-")]

    def end(self, key: str, ids: list[str]) -> None:
        """The tasks of ``ids`` ended: their worker reports it with the tokens they came with."""
        tokens = {d.id: d.slot_token for d in self.inbox.delivered}
        self.worker.hold_slots({key: [SlotRun(i, tokens[i]) for i in ids]}, "end")

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 20) -> None:
        wait_for(check, timeout, lambda: f"{what}; delivered {self.inbox.ids}")

    def rechecks(self, n: int) -> None:
        """Let the waiting items ask again ``n`` times (nothing more may go meanwhile)."""
        assert self.forwarder is not None
        for _ in range(n):
            before = self.forwarder.stats.deferred
            self.wait(lambda b=before: self.forwarder is not None and self.forwarder.stats.deferred > b, "a recheck")


@pytest.fixture
def roles(admin: Admin, prefix: str) -> Iterator[Roles]:  # noqa: F811 (the imported fixture)
    admin.install_functions()
    found = Roles(
        producer=open_store(user_url(admin, prefix, "producer"), prefix),
        worker=open_store(user_url(admin, prefix, "worker"), prefix),
        forwarder_store=open_store(user_url(admin, prefix, "forwarder"), prefix),
    )
    found.forwarder_store.check_meta()
    yield found
    found.stop()


def past() -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=30)


def schedule(store: DelayStore, key: str, n: int, *, limit: int, rank: int = 0, out: str = "out") -> list[str]:
    ids = [f"{key}-{i:02d}" for i in range(n)]
    for i, item_id in enumerate(ids):
        envelope = RedisListTarget.envelope(out, item_id.encode()).encode()
        store.schedule(
            item_id, past() + timedelta(milliseconds=i), envelope, slot={"key": key, "limit": limit}, rank=rank
        )
    return ids


def attempts(
    store: DelayStore, prefix: str, key: str, members: list[str], *, ahead_ms: int, ending: bool
) -> list[Callable[[], object]]:
    """What a worker credential could do to slot ``key``'s keys, as raw commands (no API of this
    release needed; the scripts of the release before it included): hold ``members`` and
    phantoms ``ahead_ms``, and crowd the head of the line, or (``ending``) end ``members``' holds."""
    c, until = store.client, store.server_time_ms() + ahead_ms
    holds, waiting, waits = (
        layout.slot_holds_key(prefix, key),
        layout.slot_waiting_key(prefix, key),
        layout.slot_waits_key(prefix, key),
    )
    tokens = layout.slot_tokens_key(prefix, key)
    fcall = lambda name, keys, *args: c.fcall(function_name(name), len(keys), *keys, *args)  # noqa: E731
    if ending:
        return [
            lambda: c.zrem(holds, *members),
            lambda: c.zrange(holds, 0, -1),  # reads: the holds, their tokens' hashes, other workers' reports
            lambda: c.hgetall(tokens),
            lambda: c.hscan(layout.slot_reports_key(prefix, key)),
            lambda: c.hdel(layout.slot_reports_key(prefix, key), "x"),
            lambda: c.hset(tokens, mapping={m: "0" * 40 for m in members}),
            lambda: fcall("slot_end", (holds, waiting, waits, layout.slot_limit_key(prefix, key)), 15_000, 0, *members),
            lambda: fcall("slot_end", (holds, tokens), *members),
        ]
    return [
        lambda: c.zadd(holds, {m: until for m in members}),
        lambda: c.zadd(holds, {f"ghost-{i}": until for i in range(3)}),
        lambda: c.zadd(waiting, {f"ghost-{i}": -(10**12) for i in range(3)}),
        lambda: c.zadd(waits, {f"ghost-{i}": until for i in range(3)}),
        lambda: c.delete(layout.slot_reports_key(prefix, key)),
        lambda: fcall("slot_hold", (holds,), "start", ahead_ms, 0, *members, "ghost-9"),
    ]


def attack(
    store: DelayStore,
    prefix: str,
    key: str,
    members: list[str],
    *,
    ahead_ms: int = DAY_MS - 60_000,
    ending: bool = False,
) -> int:
    """Run every attempt; how many the server took."""
    took = 0
    for attempt in attempts(store, prefix, key, members, ahead_ms=ahead_ms, ending=ending):
        with contextlib.suppress(*REFUSED):
            attempt()
            took += 1
    return took


def test_a_worker_credential_cannot_block_a_slot_key(
    roles: Roles, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding: one slot_hold with a 24 h hold, or phantom members at the head of the line,
    stopped a key (0 of 20 released in 60 s, no log line). Now every raw write to the holds,
    tokens and line is refused, and the reports a worker may write (a day-long start for
    phantoms and for the key's real holds, tokenless or forged) count for nothing: all 20 go,
    at most 2 at once, and the forged reports are logged."""
    ids = schedule(roles.producer, "k", 20, limit=2)
    roles.start()
    roles.wait(lambda: len(roles.of("k")) == 2, "2 of k")
    assert attack(roles.worker, prefix, "k", [*roles.of("k"), "ghost-0"]) == 0
    runs = [SlotRun(m, "") for m in [*roles.of("k"), "ghost-0"]] + [SlotRun(roles.of("k")[0], "f" * 32)]
    roles.worker.hold_slots({"k": runs}, "start", hold_ms=DAY_MS)
    for n in range(2, 20):
        roles.end("k", [roles.of("k")[n - 2]])
        roles.wait(lambda n=n: len(roles.of("k")) > n, f"item {n} of k")
        assert roles.forwarder_store.slot_status("k").running <= 2
    assert sorted(roles.of("k")) == ids
    assert any("reports without their hold's token" in r.message for r in caplog.records)


def test_a_worker_credential_cannot_end_holds_it_was_not_given(roles: Roles, prefix: str) -> None:
    """Finding: ending other members' holds let 10 run at once with limit 2. Now a worker
    credential that reads the items (it may) and tries every way to end their holds (raw ZREM,
    the scripts, reports without the token or with another's) leaves the key at 2."""
    schedule(roles.producer, "k", 10, limit=2)
    roles.start()
    roles.wait(lambda: len(roles.of("k")) == 2, "2 of k")
    for _ in range(3):
        running = roles.of("k")
        assert attack(roles.worker, prefix, "k", running, ending=True) == 0
        tokens = {d.id: d.slot_token for d in roles.inbox.delivered}
        others = [SlotRun(m, t) for m in running for i, t in tokens.items() if i != m]  # another's token
        forged = [*others, *(SlotRun(m, t) for m in running for t in ("", "0" * 32))]
        roles.worker.hold_slots({"k": forged}, "end")
        roles.rechecks(2)
        assert len(roles.of("k")) == 2, "a hold was ended by a credential that was not given it"
    roles.end("k", roles.of("k"))  # their own worker: the next two go
    roles.wait(lambda: len(roles.of("k")) == 4, "4 of k")


def test_a_producers_items_nobody_reads_hold_their_slots_one_start_window(admin: Admin, prefix: str) -> None:  # noqa: F811
    """Finding: a producer's two rank-255 items to a list nobody reads held both slots for 5
    minutes, again and again. Now a slot taken is held only the start window (here 1 s) unless
    its worker reports the start with the slot's token, which a worker credential without the
    message cannot: raw writes and tokenless starts do not keep it."""
    admin.install_functions()
    roles = Roles(
        producer=open_store(user_url(admin, prefix, "producer"), prefix),
        worker=open_store(user_url(admin, prefix, "worker"), prefix),
        forwarder_store=open_store(user_url(admin, prefix, "forwarder"), prefix),
        start_window=1.0,
    )
    roles.forwarder_store.check_meta()
    try:
        schedule(roles.producer, "hog", 2, limit=2, rank=255, out="nobody-reads-this")
        roles.start()
        roles.wait(lambda: len(roles.of("hog")) == 2, "the 2 hogs released")
        released = time.monotonic()
        for i in range(3):
            envelope = RedisListTarget.envelope("out", b"x").encode()
            roles.producer.schedule(f"hog-real-{i}", past(), envelope, slot={"key": "hog", "limit": 2})
        attack(roles.worker, prefix, "hog", roles.of("hog"), ahead_ms=3_600_000)
        roles.worker.hold_slots({"hog": [SlotRun(m, "") for m in roles.of("hog")]}, "start", hold_ms=3_600_000)
        roles.wait(lambda: len(roles.of("hog")) == 4, "2 real items once the hogs' start window lapsed", timeout=15)
        assert time.monotonic() - released < 10
    finally:
        roles.stop()


def test_a_message_released_without_a_token_runs_and_ends_its_old_hold(roles: Roles, prefix: str) -> None:
    """A message the previous release's forwarder released carries no token, and its hold none:
    its worker's tokenless start and end count for that hold (and only for a hold without a
    token), so a rolling upgrade neither blocks the key nor lets it run over."""
    holds = layout.slot_holds_key(prefix, "k")
    schedule(roles.producer, "k", 3, limit=1)
    roles.forwarder_store.client.zadd(holds, {"old": roles.forwarder_store.server_time_ms() + 300_000})  # 0.1's grant
    roles.start()
    roles.rechecks(2)
    assert roles.of("k") == []
    guard = SlotGuard(roles.worker, hold_ms=60_000)
    guard.start("k", SlotRun("old", ""))
    guard.end("k", SlotRun("old", ""))
    roles.wait(lambda: len(roles.of("k")) == 1, "the first item once the old run ended")
    guard.end("k", SlotRun(roles.of("k")[0], ""))  # tokenless: not this hold's
    roles.rechecks(2)
    assert len(roles.of("k")) == 1
    guard.close()
