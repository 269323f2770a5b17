"""A delay store for your own unit tests: the real Lua scripts on fakeredis, driven by a fake clock.

An application can assert "signing up schedules a reminder 3 days later" with no Redis running
and no waiting::

    from datetime import timedelta
    from delayq_backends.testing import CollectingTarget, FakeClock, advance_and_run, scheduled, testing_store

    clock = FakeClock()
    store = testing_store(clock=clock)
    app.sign_up("ada", store=store)                       # calls store.schedule(..., timedelta(days=3), ...)

    [entry] = scheduled(store, target="list")
    assert entry.ready == clock.now() + timedelta(days=3)

    mail = CollectingTarget("list")
    assert advance_and_run(store, timedelta(days=2), mail) == []   # not due yet
    [delivery] = advance_and_run(store, timedelta(days=1), mail)   # due now, delivered once

Why fakeredis rather than an in-memory imitation: the scripts *are* the store's behaviour
(leases, attempts, dead letters), so running the same ``.lua`` files keeps what your tests see
identical to production. The fake clock is given once, to the store (``store.clock``, the one
clock of production too), and everything that reads "now" (claims, failures, retries, ``stats``,
``timedelta`` ready times, ``requeue_dead``, the forwarder, periodic firing and the targets)
reads it from there, never the wall clock.

Needs the ``testing`` extra: ``pip install "delayq_backends[testing]"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import import_module
from typing import Any

from .config import Config
from .envelope import Envelope
from .errors import EnvelopeError, install_hint
from .forwarder import Forwarder
from .models import DeliveryFailure
from .store import DelayStore, Lease
from .targets import ClaimTarget, Delivery, PublishReport, Target
from .timeutil import from_ms, now_ms, to_ms

__all__ = [
    "CollectingTarget",
    "FakeClock",
    "ScheduledEntry",
    "Targets",
    "TestingForwarder",
    "TestingStore",
    "advance_and_run",
    "run_due",
    "scheduled",
    "testing_store",
]

INSTALL_HINT = f"delayq_backends.testing runs the store on fakeredis with Lua: {install_hint('testing')}"

#: What :func:`run_due` delivers through: targets keyed by kind (or a sequence of them, or one
#: target), or a plain callable that receives every due :class:`Delivery` whatever its kind.
Targets = Mapping[str, Target] | Sequence[Target] | Target | Callable[[Delivery], object]


class FakeClock:
    """Integer UTC milliseconds that move only when a test says so.

    It is a :data:`~delayq_backends.timeutil.Clock` (call it for "now" in ms), so it can be
    given to :class:`DelayStore` as ``clock=``. It starts at the real current time, so dates
    your application computes from ``datetime.now()`` before the first ``advance`` still line
    up with the store.

    Args:
        start: aware ``datetime`` or epoch seconds; the real current time by default.
    """

    def __init__(self, start: datetime | int | float | None = None) -> None:
        self._ms = now_ms()
        if start is not None:
            self.set(start)

    def __call__(self) -> int:
        return self._ms

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()})"

    @property
    def ms(self) -> int:
        """Now, in integer UTC milliseconds since the epoch."""
        return self._ms

    def now(self) -> datetime:
        """Now, as an aware UTC ``datetime``."""
        return from_ms(self._ms)

    def advance(self, delta: timedelta | int | float) -> int:
        """Move forward by ``delta`` (a ``timedelta`` or seconds); returns the new ms.

        Raises:
            ValueError: ``delta`` is negative; use :meth:`set` to go back on purpose.
        """
        ms = delta / timedelta(milliseconds=1) if isinstance(delta, timedelta) else float(delta) * 1000
        if ms < 0:
            raise ValueError(f"cannot advance by {delta!r}: pass a delay >= 0, or set() an earlier time")
        self._ms += int(round(ms))
        return self._ms

    def set(self, when: datetime | int | float) -> int:
        """Jump to ``when`` (aware ``datetime`` or epoch seconds), back or forth; returns the new ms.

        Raises:
            InvalidTimeError: naive datetime or an impossible time.
            ValueError: the epoch itself, which the scripts read as "use the server's clock".
        """
        if isinstance(when, timedelta):
            raise TypeError("set() takes a point in time; use advance(timedelta) to move by a delay")
        ms = to_ms(when)
        if ms <= 0:
            raise ValueError("the fake clock must stay after the epoch: a 0 clock means 'server time' to the store")
        self._ms = ms
        return self._ms


@cache
def _fake_client_class() -> Any:
    """``fakeredis.FakeRedis``, checked to run Lua, or an ImportError saying what to install."""
    try:
        import fakeredis

        import_module("lupa")  # fakeredis runs Lua through it: fail here, not at the first EVALSHA
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return fakeredis.FakeRedis


class TestingStore(DelayStore):
    """A :class:`DelayStore` on an in-process fakeredis server, on a :class:`FakeClock`.

    The behaviour is the production store's (same class, same scripts); only "now" differs:
    every call that reads the time (claims, keeps, failures, lease extensions, re-arms, rate
    tokens) uses the fake clock unless given ``now=``, and ``server_time_ms`` (hence ``stats()``)
    reads it too.

    Args:
        config: prefix, shards, limits; ``config.url`` is ignored.
        clock: the fake clock; a new one at the real current time by default.
        server: a ``fakeredis.FakeServer`` to share with other fake clients (an RQ connection,
            a second store); a fresh, private one by default.

    Raises:
        ImportError: fakeredis or lupa is missing; the message says what to install.
    """

    __test__ = False  # not a pytest test class, whatever its name says

    clock: FakeClock

    def __init__(self, config: Config | None = None, *, clock: FakeClock | None = None, server: Any = None) -> None:
        client_class = _fake_client_class()
        if server is None:
            import fakeredis

            server = fakeredis.FakeServer()
        self.server = server
        super().__init__(client_class(server=server), config, clock=clock if clock is not None else FakeClock())

    def script_now(self, now: int | None) -> int:
        """The fake clock unless ``now`` is given: every role's script that reads the time (claim,
        keep, fail, extend, rearm, rate tokens) asks here, so none of them falls back to the server's."""
        return self.clock() if now is None else now

    def server_time_ms(self) -> int:
        """The fake clock: a forwarder or ``stats()`` must see the same "now" as the claims."""
        return self.clock()

    def slot_token_proof(self, token: str) -> str:
        """The token itself: fakeredis's scripts have no ``redis.sha1hex``, so ``slot_take.lua``
        keeps tokens as they are here (an in-process store guards nothing)."""
        return token


def testing_store(
    prefix: str = "delayq", shards: int = 16, clock: FakeClock | None = None, **settings: Any
) -> TestingStore:
    """A fresh :class:`TestingStore`; ``settings`` are further :class:`Config` fields
    (``max_attempts``, ``lease_seconds``, ``max_payload_bytes``).

    Raises:
        ImportError: fakeredis or lupa is missing; the message says what to install.
        ConfigError: a bad or unknown setting.
    """
    config = Config.from_mapping({"prefix": prefix, "shards": shards, **settings})
    return TestingStore(config, clock=clock)


testing_store.__test__ = False  # type: ignore[attr-defined]  # imported into test modules; not a test


class TestingForwarder(Forwarder):
    """A :class:`Forwarder` that never sleeps for an outage. Like any forwarder it reads the
    store's clock, so on a :class:`TestingStore` back-off for failed items (``retry_at``) and
    lateness are on the fake clock.

    Args:
        store: any delay store (a :class:`TestingStore`, or a real one in integration tests).
        targets: as for :class:`Forwarder`.
        options: further :class:`Forwarder` options (``batch``, ``retry_delay``, ...).
    """

    __test__ = False

    def __init__(
        self,
        store: DelayStore,
        targets: Mapping[str, Target] | Sequence[Target],
        **options: Any,
    ) -> None:
        options.setdefault("max_outage_backoff", 0.0)  # an outage pause would be real seconds
        super().__init__(store, targets, **options)


class CollectingTarget:
    """A target that records what it is given, optionally calling ``callback`` on each.

    A ``callback`` that raises makes that item a failed delivery (retried with back-off, then
    dead-lettered after ``max_attempts``), which lets tests exercise the failure path.

    Attributes:
        delivered: every :class:`Delivery` accepted, in delivery order.
    """

    def __init__(self, kind: str, callback: Callable[[Delivery], object] | None = None) -> None:
        self.kind = kind
        self.callback = callback
        self.delivered: list[Delivery] = []

    def __repr__(self) -> str:
        return f"CollectingTarget({self.kind!r}, {len(self.delivered)} delivered)"

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.delivered]

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        report = PublishReport()
        for d in deliveries:
            try:
                if self.callback is not None:
                    self.callback(d)
            except Exception as exc:  # the application's code failed: a retryable delivery failure
                report.failed.append(DeliveryFailure(d.id, f"{type(exc).__name__}: {exc}"))
                continue
            self.delivered.append(d)
            report.published.append(d.id)
        return report

    def clear(self) -> None:
        self.delivered.clear()

    def close(self) -> None:
        pass


class _Recorder:
    """Wraps a target to note which deliveries it reported published, passing the batch's
    lease on to a :class:`ClaimTarget` as the forwarder would (an RQ periodic job re-arms there)."""

    def __init__(self, target: Target, sink: list[Delivery]) -> None:
        self.kind = target.kind
        self.target = target
        self.sink = sink

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        return self._noted(deliveries, self.target.publish_many(deliveries))

    def publish_claimed(self, deliveries: Sequence[Delivery], lease: Lease) -> PublishReport:
        if isinstance(self.target, ClaimTarget):
            return self._noted(deliveries, self.target.publish_claimed(deliveries, lease))
        return self.publish_many(deliveries)

    def _noted(self, deliveries: Sequence[Delivery], report: PublishReport) -> PublishReport:
        published = set(report.published)
        self.sink.extend(d for d in deliveries if d.id in published)
        return report

    def close(self) -> None:
        self.target.close()


class _EveryKind(dict[str, Target]):
    """Targets of a callback: every kind is known, each a :class:`CollectingTarget` made on first use."""

    def __init__(self, callback: Callable[[Delivery], object], sink: list[Delivery]) -> None:
        super().__init__()
        self.callback = callback
        self.sink = sink

    def __contains__(self, kind: object) -> bool:
        return isinstance(kind, str)

    def __missing__(self, kind: str) -> Target:
        target = self[kind] = _Recorder(CollectingTarget(kind, self.callback), self.sink)
        return target


@dataclass(frozen=True)
class ScheduledEntry:
    """An item as a test wants to see it: when it is due, and what it will deliver.

    ``ready`` is the item's own ready time, also while a forwarder holds it leased. ``parked``
    says why no forwarder that claimed it could deliver it (``target:<kind>``: it had no such
    target); ``leased_until`` is None then.
    """

    id: str
    ready: datetime
    envelope: Envelope
    ready_ms: int
    attempts: int
    leased_until: datetime | None
    parked: str | None = None


def scheduled(store: DelayStore, *, target: str | None = None, destination: str | None = None) -> list[ScheduledEntry]:
    """Every scheduled item (leased ones included), earliest ready time first, optionally only
    those for one target kind and/or destination.

    Raises:
        EnvelopeError: an item's stored bytes are not an envelope (something other than
            delayq stored it); the message names the item.
    """
    out = []
    page, offset = 1000, 0
    while True:
        items = store.scheduled(offset=offset, count=page)
        for item in items:
            try:
                envelope = Envelope.decode(item.envelope)
            except EnvelopeError as exc:
                raise EnvelopeError(f"item {item.id!r}: {exc}") from exc
            if target is not None and envelope.target != target:
                continue
            if destination is not None and envelope.destination != destination:
                continue
            leased = None if item.leased_until_ms is None or item.parked else from_ms(item.leased_until_ms)
            out.append(
                ScheduledEntry(
                    item.id, from_ms(item.ready_ms), envelope, item.ready_ms, item.attempts, leased, item.parked
                )
            )
        if len(items) < page:
            break
        offset += page
    out.sort(key=lambda e: (e.ready_ms, e.id))
    return out


def run_due(
    store: DelayStore,
    targets: Targets,
    *,
    batch: int = 500,
    retry_delay: float = 1.0,
    max_retry_delay: float = 300.0,
) -> list[Delivery]:
    """Deliver everything due at ``store.clock()``; returns what the targets accepted, in
    delivery order.

    The production forwarder does it, in burst mode (:meth:`Forwarder.run_until_idle`) on the
    store's clock: accepted items are acked (a periodic job re-armed), failed ones retried
    ``retry_delay`` later (doubling per attempt) or dead-lettered, unsent ones released and left
    for the next call.

    Args:
        store: the store (normally a :class:`TestingStore`).
        targets: targets keyed by kind, a sequence or one of them, or a callable that gets each
            :class:`Delivery` of any kind (if it raises, the delivery failed).
        batch: items per claim.
    """
    delivered: list[Delivery] = []
    callback = _callback_of(targets)
    forwarder = TestingForwarder(
        store,
        _EveryKind(callback, delivered)
        if callback is not None
        else {k: _Recorder(t, delivered) for k, t in _targets_by_kind(targets).items()},
        batch=batch,
        retry_delay=retry_delay,
        max_retry_delay=max_retry_delay,
    )
    forwarder.run_until_idle()
    return delivered


def advance_and_run(
    store: DelayStore,
    delta: timedelta | int | float,
    targets: Targets,
    **options: Any,
) -> list[Delivery]:
    """Advance the store's fake clock by ``delta`` (``timedelta`` or seconds), then :func:`run_due`.

    Raises:
        TypeError: ``store.clock`` is not a :class:`FakeClock`.
    """
    fake = store.clock
    if not isinstance(fake, FakeClock):
        raise TypeError(
            f"advance_and_run needs a store on a FakeClock, got {type(fake).__name__}: build the store "
            "with testing_store(clock=FakeClock())"
        )
    fake.advance(delta)
    return run_due(store, targets, **options)


def _callback_of(targets: Targets) -> Callable[[Delivery], object] | None:
    if isinstance(targets, (Mapping, Target)) or not callable(targets):
        return None
    return targets


def _targets_by_kind(targets: Targets) -> dict[str, Target]:
    if isinstance(targets, Mapping):
        return dict(targets)
    if isinstance(targets, Target):
        return {targets.kind: targets}
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        raise TypeError(
            f"targets must be a Target, targets keyed by kind, a sequence of targets or a callable, "
            f"got {type(targets).__name__}"
        )
    return {t.kind: t for t in targets}
