"""Flow control in the forwarder: back-pressure on full broker queues, and rate caps.

*Back-pressure*: a queue may have a ceiling on its broker depth. At or above it, the forwarder
stops forwarding to that queue: its items wait in the delay store (cheap) instead of piling up
in a broker whose workers are down, and items for other queues keep flowing.

*Rate caps*: a queue may have a forwarding rate, shared by every forwarder through a token
bucket kept in Redis (``take.lua``). Items that get no token book the next free slots, so a
million jobs due at midnight reach the workers at the rate, and the backlog is not claimed
again on every pass.

*Per-key rate caps*: a queue may also cap each *rate key* (a tenant, a customer: the envelope's
``rate_key``, see :func:`~delayq_backends.envelope.rate_key_of`) at its own rate, one bucket per
key of that queue, with the same booked slots: one key's midnight burst waits at its cap while
the other keys' items go. Buckets expire when idle, so many keys cost memory only while active.

Held-back items go back to the store with ``defer.lua``: not before a time, no attempt
counted, original ready time kept.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import redis

from .config import setting
from .envelope import INVALID_RATE_KEY, rate_key_of
from .errors import ConfigError, StoreFullError
from .keys import key_rate_key, rate_key
from .models import TokenGrant
from .store import DelayStore
from .targets import Delivery, DepthTarget, Target

__all__ = [
    "Admission",
    "FlowControl",
    "FlowGate",
    "burst_of",
    "check_depth",
    "check_rate",
    "parse_depth",
    "parse_rate",
    "slot_quantum_ms",
]

log = logging.getLogger("delayq.flow")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _split(spec: str, what: str, example: str) -> tuple[str, str]:
    queue, sep, value = spec.rpartition("=")
    if not sep or not queue.strip() or not value.strip():
        raise ConfigError(f"{what} {spec!r}: use QUEUE=VALUE, e.g. {example}")
    return queue.strip(), value.strip()


def parse_depth(spec: str) -> tuple[str, int]:
    """``"QUEUE=N"`` -> (queue, N): the most messages the broker queue may hold."""
    queue, value = _split(spec, "max queue depth", "celery=10000")
    return queue, check_depth(queue, value)


def check_depth(queue: str, value: Any) -> int:
    """A depth ceiling as an int >= 1, or a ConfigError naming the queue."""
    try:
        depth = None if isinstance(value, (bool, float)) else int(value)
    except (TypeError, ValueError):
        depth = None
    if depth is None or depth < 1:
        raise ConfigError(f"max queue depth of {queue!r} is {value!r}: use a whole number of messages >= 1")
    return depth


def parse_rate(spec: str) -> tuple[str, float]:
    """``"QUEUE=N/s"`` (or ``/m``, ``/h``; a bare N is per second) -> (queue, per second)."""
    queue, value = _split(spec, "rate", "celery=500/s")
    return queue, check_rate(queue, value)


def check_rate(queue: str, value: Any) -> float:
    """A rate (``500``, ``"500/s"``, ``"30/m"``, ``"100/h"``) as items per second > 0."""
    amount: Any = math.nan
    unit = "s"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        amount = value
    elif isinstance(value, str):
        amount, sep, unit = value.partition("/")
        unit = unit.strip() if sep else "s"
    try:
        number = float(amount)
    except ValueError:
        number = math.nan
    if unit not in _UNITS or not math.isfinite(number) or number <= 0:
        raise ConfigError(f"rate of {queue!r} is {value!r}: use N/s, N/m or N/h with N > 0, e.g. '500/s'")
    return number / _UNITS[unit]


@dataclass(frozen=True)
class FlowControl:
    """Flow-control settings of a forwarder, per target queue (the envelope's destination).

    Attributes:
        max_depth: queue -> most messages its broker queue may hold before forwarding pauses.
        rates: queue -> most items per second forwarded to it, by all forwarders together.
        key_rates: queue -> most items per second of each one rate key forwarded to it, by all
            forwarders together; items without a rate key are not held by it.
        recheck: seconds a paused queue's items wait before the forwarder looks again; doubles
            while the queue stays full, up to ``max_recheck``.
        max_recheck: cap of that wait.
        probe_ttl: seconds a broker depth reading is reused, so a busy forwarder does not ask
            the broker once per batch.
    """

    # fmt: off
    # (a table: one setting per entry)
    max_depth: Mapping[str, int] = setting({},
        "Stop forwarding to QUEUE while its broker queue holds N messages or more; its items wait in the delay "
        "store, other queues keep flowing. Repeatable (env: space-separated).", flag="--max-queue-depth",
        envvar="DELAYQ_MAX_QUEUE_DEPTH", celery="delayq_max_queue_depth", metavar="QUEUE=N",
        specs=lambda texts: dict(map(parse_depth, texts)))
    rates: Mapping[str, float] = setting({},
        "Forward at most N items per second (or N/m, N/h) to QUEUE, all forwarders together. Repeatable (env: "
        "space-separated).", flag="--rate", envvar="DELAYQ_RATE", celery="delayq_rate_limits", metavar="QUEUE=N/s",
        specs=lambda texts: dict(map(parse_rate, texts)))
    key_rates: Mapping[str, float] = setting({},
        "Forward at most N items per second (or N/m, N/h) of each rate key (a tenant: Celery header "
        "delayq_rate_key, RQ meta delayq_rate_key) to QUEUE, all forwarders together; items without a key are not "
        "held. Repeatable (env: space-separated).", flag="--key-rate", envvar="DELAYQ_KEY_RATE",
        celery="delayq_key_rate_limits", metavar="QUEUE=N/s", specs=lambda texts: dict(map(parse_rate, texts)))
    # fmt: on
    recheck: float = 0.5
    max_recheck: float = 5.0
    probe_ttl: float = 0.5

    def __post_init__(self) -> None:
        for queue, depth in self.max_depth.items():
            check_depth(queue, depth)
        for queue, rate in (*self.rates.items(), *self.key_rates.items()):
            check_rate(queue, rate)
        if not 0 < self.recheck <= self.max_recheck:
            raise ConfigError(f"recheck={self.recheck}, max_recheck={self.max_recheck}: use 0 < recheck <= max_recheck")
        if self.probe_ttl < 0:
            raise ConfigError(f"probe_ttl={self.probe_ttl}: use seconds >= 0")

    @classmethod
    def from_specs(
        cls, depths: Iterable[str] = (), rates: Iterable[str] = (), key_rates: Iterable[str] = (), **settings: Any
    ) -> FlowControl:
        """From texts: ``QUEUE=N`` depths, ``QUEUE=N/s`` rates and per-key rates (a later one wins)."""
        return cls(
            dict(map(parse_depth, depths)), dict(map(parse_rate, rates)), dict(map(parse_rate, key_rates)), **settings
        )

    @classmethod
    def from_mappings(
        cls,
        depths: Mapping[str, Any],
        rates: Mapping[str, Any],
        key_rates: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> FlowControl:
        """From configuration dicts such as ``{"q": 100}`` and ``{"q": "500/s"}``."""
        key_rates = {} if key_rates is None else key_rates
        for name, value in (("max queue depth", depths), ("rate limits", rates), ("key rate limits", key_rates)):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{name} {value!r}: use a dict of queue name -> value")
        return cls(
            {str(q): check_depth(str(q), v) for q, v in depths.items()},
            {str(q): check_rate(str(q), v) for q, v in rates.items()},
            {str(q): check_rate(str(q), v) for q, v in key_rates.items()},
            **settings,
        )

    def merged(self, override: FlowControl) -> FlowControl:
        """These settings with ``override``'s queues on top (a process's own settings over an app's)."""
        return replace(
            self,
            max_depth={**self.max_depth, **override.max_depth},
            rates={**self.rates, **override.rates},
            key_rates={**self.key_rates, **override.key_rates},
        )

    @property
    def active(self) -> bool:
        return bool(self.max_depth or self.rates or self.key_rates)

    def describe(self) -> str:
        parts = [f"{q} depth<={n}" for q, n in sorted(self.max_depth.items())]
        parts += [f"{q} {r:g}/s" for q, r in sorted(self.rates.items())]
        parts += [f"{q} {r:g}/s per key" for q, r in sorted(self.key_rates.items())]
        return ", ".join(parts) or "off"


def burst_of(rate: float) -> int:
    """Tokens a bucket holds: 0.1 s worth, so a cap is kept within a tenth of a second."""
    return max(1, math.ceil(rate / 10))


def slot_quantum_ms(rate: float) -> int:
    """Booked slots are rounded up to this grid, so items come due in groups of about half a
    burst (one claim each) rather than one by one."""
    return max(50, math.ceil(1000 / rate))


class Admission(NamedTuple):
    """One queue's share of a batch: what may go now, and (id, not-before ms) for the rest."""

    go: list[Delivery]
    later: list[tuple[str, int]]


@dataclass
class _Depth:
    value: int | None  # None: unknown (probe failed or impossible), treated as flowing
    read_at: float


class FlowGate:
    """Applies :class:`FlowControl` to a forwarder's batches.

    :attr:`state` maps each depth-capped queue seen so far to True while it is paused (its
    broker queue full) and False while it flows; metrics read it.
    """

    def __init__(
        self,
        control: FlowControl,
        store: DelayStore,
        targets: Mapping[str, Target],
    ) -> None:
        self.control = control
        self.store = store
        self.targets = targets
        self.state: dict[str, bool] = {}
        self._depths: dict[tuple[str, str], _Depth] = {}
        self._holds: dict[str, tuple[int, int]] = {}  # paused queue -> (wait ms, held until ms)

    def admit(self, kind: str, queue: str, deliveries: Sequence[Delivery], now_ms: int) -> Admission:
        """Split one queue's deliveries into what goes now and what waits in the store."""
        go, later = self._room(kind, queue, list(deliveries), now_ms)
        key_rate = self.control.key_rates.get(queue)
        if key_rate is not None and go:
            go, booked = self._key_tokens(queue, go, key_rate, now_ms)
            later += booked
        rate = self.control.rates.get(queue)
        if rate is not None and go:
            go, booked = self._tokens(queue, go, rate, now_ms)
            later += booked
        return Admission(go, later)

    def sent(self, kind: str, deliveries: Sequence[Delivery], published: Sequence[str]) -> None:
        """Count published items into the cached depths, so they stay right until the next probe."""
        if not self._depths:
            return
        sent = set(published)
        for d in deliveries:
            depth = self._depths.get((kind, d.envelope.destination))
            if depth is not None and depth.value is not None and d.id in sent:
                depth.value += 1

    def _room(self, kind: str, queue: str, deliveries: list[Delivery], now_ms: int) -> Admission:
        """Back-pressure: as many as the broker queue has room for; the rest wait a recheck."""
        cap = self.control.max_depth.get(queue)
        if cap is None:
            return Admission(deliveries, [])
        depth = self._depth(kind, queue)
        room = len(deliveries) if depth is None else max(0, cap - depth)
        paused = room < len(deliveries)  # the queue is at its ceiling: some must wait
        if paused != self.state.get(queue, False):
            log.warning(
                "queue %r %s (depth %s, max %d)", queue, "is full: paused" if paused else "flows again", depth, cap
            )
        self.state[queue] = paused
        if not paused:
            self._holds.pop(queue, None)
            return Admission(deliveries, [])
        return Admission(deliveries[:room], [(d.id, self._hold(queue, now_ms)) for d in deliveries[room:]])

    def _hold(self, queue: str, now_ms: int) -> int:
        """Until when a paused queue's items wait: one time for every batch of a hold, so they
        come due together; doubled (up to ``max_recheck``) each time a recheck finds it full."""
        wait_ms, until = self._holds.get(queue, (0, 0))
        if now_ms >= until:
            wait_ms = min(int(self.control.max_recheck * 1000), wait_ms * 2 or int(self.control.recheck * 1000))
            until = now_ms + wait_ms
            self._holds[queue] = (wait_ms, until)
        return until

    def _depth(self, kind: str, queue: str) -> int | None:
        """The broker queue's depth, read at most once per ``probe_ttl``; None when unknown."""
        cached = self._depths.get((kind, queue))
        now = time.monotonic()  # an age, not a time: not the store's clock
        if cached is not None and now - cached.read_at < self.control.probe_ttl:
            return cached.value
        target = self.targets.get(kind)
        value: int | None = None
        if isinstance(target, DepthTarget):
            try:
                value = target.queue_depth(queue)
            except Exception as exc:  # a failed probe must not stop forwarding: flow, and say so
                log.warning(
                    "cannot read the depth of %s queue %r (%s: %s); forwarding to it",
                    kind,
                    queue,
                    type(exc).__name__,
                    exc,
                )
        elif cached is None:
            log.warning("the %s target cannot report queue depths: max depth of %r is not applied", kind, queue)
        self._depths[(kind, queue)] = _Depth(value, now)
        return value

    def _key_tokens(self, queue: str, deliveries: list[Delivery], rate: float, now_ms: int) -> Admission:
        """Per-key rate cap: each rate key's items take tokens from that key's bucket, in
        ready-time order within the key; items without a key go. Runs before the queue's own
        cap, so an item that gets a key token and no queue token spends that key token."""
        by_key: dict[str, list[Delivery]] = {}
        out = Admission([], [])
        for d in deliveries:
            key = rate_key_of(d.envelope)
            if key is None:
                out.go.append(d)
            else:
                if key == INVALID_RATE_KEY:
                    log.warning(
                        "item %s of %r carries an invalid rate key: capped with the other such items", d.id, queue
                    )
                by_key.setdefault(key, []).append(d)
        if not by_key:
            return out
        wanted = {key: len(group) for key, group in by_key.items()}
        taken = self.store.take_key_tokens(queue, wanted, rate=rate, burst=burst_of(rate))
        for key, group in by_key.items():
            bucket = f"{queue!r} key {key!r} ({key_rate_key(self.store.config.prefix, queue, key)})"
            go, later = self._booked(bucket, group, taken[key], rate, now_ms)
            out.go.extend(go)
            out.later.extend(later)
        return out

    def _tokens(self, queue: str, deliveries: list[Delivery], rate: float, now_ms: int) -> Admission:
        """Rate cap: those with a token go; the rest wait for the slots booked for them."""
        taken: TokenGrant | Exception
        try:
            taken = self.store.take_tokens(queue, len(deliveries), rate=rate, burst=burst_of(rate))
        except (redis.ResponseError, StoreFullError) as exc:
            taken = exc
        bucket = f"{queue!r} ({rate_key(self.store.config.prefix, queue)})"
        return self._booked(bucket, deliveries, taken, rate, now_ms)

    def _booked(
        self, bucket: str, deliveries: list[Delivery], taken: TokenGrant | Exception, rate: float, now_ms: int
    ) -> Admission:
        """What a bucket's answer (its grant, or its error) lets go now; the rest wait for their
        booked slots, or, when the bucket failed, a recheck."""
        if isinstance(taken, Exception):  # fail closed: the cap protects the workers
            log.error("rate bucket of %s failed (%s: %s); holding its items back", bucket, type(taken).__name__, taken)
            not_before = now_ms + int(self.control.recheck * 1000)
            return Admission([], [(d.id, not_before) for d in deliveries])
        if taken.reset:  # hand-written garbage: the script reset it, so the queue flows on
            log.warning(
                "rate bucket of %s held out-of-range values (%r): reset to a new bucket's; "
                "only forwarders write it (check what else writes the store's keys)",
                bucket,
                taken.reset,
            )
        granted, first = taken.granted, taken.first_slot_ms
        step, grid = 1000 / rate, slot_quantum_ms(rate)
        later = [(d.id, math.ceil((first + i * step) / grid) * grid) for i, d in enumerate(deliveries[granted:])]
        return Admission(deliveries[:granted], later)
