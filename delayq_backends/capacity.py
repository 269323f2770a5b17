"""A capacity model: how many Redis Cluster masters, shards and forwarders a workload needs.

Pure arithmetic on measured per-item costs (``bench/capacity.py`` measures them on a machine),
so a plan can be made, tested and printed without a server. The model:

- A master is one core (Redis and Valkey run commands on one thread). Its CPU per second is
  ``schedule_rate · schedule_us + fire_rate · (claim_us + ack_us + per-call costs / batch)``,
  spread evenly over the masters, each used up to ``master_cpu_share``. Publishing runs on the
  broker (``publish_us``), which the forwarder waits for but no master pays.
- Memory is ``backlog · bytes_per_item`` over the masters (each replica holds as much again).
- Network: every item crosses a master's NIC when it is scheduled and again when it is
  claimed, ``wire_bytes_per_item`` each time.
- A claim is one script call that blocks its master for ``claim_call_us + batch · claim_us``:
  the batch is cut so that stays under ``max_block_us``.
- A forwarder is serial: it waits for each script while the server runs it, so one forwarder
  moves ``1e6 / (forwarder_us + store µs + publish_us + round trips · rtt_us / batch)`` items/s.
- Shards are a multiple of the masters (key layout 2 puts shard k mid-way in the k-th of N
  equal slot ranges, so N = m · masters spreads exactly), at least ``min_shards``, at most
  :data:`MAX_SHARDS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = [
    "MAX_SHARDS",
    "Costs",
    "Limits",
    "Plan",
    "Workload",
    "plan",
    "predict_forward_rate",
    "store_us_per_forwarded",
]

#: Shard count cap: key layout 2 balances up to 256 shards (``keys.BALANCED_MAX_SHARDS``).
MAX_SHARDS = 256


@dataclass(frozen=True)
class Costs:
    """Measured costs per item (µs of one core, bytes) and per script call.

    The defaults are what ``bench/capacity.py`` measured on the project's 2-core machine
    (``docs/capacity.md``); pass your own measurements for your hardware.
    """

    schedule_us: float = 1.9  # server CPU per item of schedule_many (500 items per call)
    claim_us: float = 3.3  # server CPU per claimed item, beyond the call's fixed cost
    ack_us: float = 1.7  # server CPU per acked item, beyond the call's fixed cost
    publish_us: float = 0.3  # server CPU per item RPUSHed into a Redis list (on the broker)
    claim_call_us: float = 73.0  # server CPU per claim call, whatever its size
    ack_call_us: float = 51.0  # server CPU per ack call
    forwarder_us: float = 2.3  # forwarder Python CPU per item (claim, decode, publish, ack)
    bytes_per_item: float = 259.0  # server memory per waiting item (100 B list body)
    wire_bytes_per_item: float = 205.0  # bytes on the wire per item, each way

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value >= 0:  # also refuses NaN
                raise ConfigError(f"cost {name}={value!r}: use a measured, non-negative number")


@dataclass(frozen=True)
class Limits:
    """What one master, one forwarder and the network may use (headroom included)."""

    master_cpu_share: float = 0.7  # of a master's one core; the rest absorbs bursts and replication
    master_memory_bytes: float = 25e9  # usable per master (maxmemory, below the machine's RAM)
    master_network_bytes_s: float = 600e6  # per master: about half of a 10 Gbit/s NIC
    forwarder_cpu_share: float = 0.8  # of a forwarder process's core
    max_block_us: float = 5_000.0  # longest a claim script may block its master
    batch: int = 200  # forwarder batch, cut to fit max_block_us
    rtt_us: float = 200.0  # one round trip between a forwarder and a master (LAN)
    # a pass's four (heads, claims, publishes, acks) shared by the batches of the shards due in
    # it: 1 is four shards due; a backlog on 16 shards is 0.25
    round_trips_per_batch: float = 1.0
    min_shards: int = 16

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ConfigError(f"limit {name}={value!r}: use a positive number")
        if self.master_cpu_share > 1 or self.forwarder_cpu_share > 1:
            raise ConfigError("a CPU share is a fraction of one core: use a number in (0, 1]")


@dataclass(frozen=True)
class Workload:
    """Items scheduled per second, items falling due per second, and items waiting."""

    schedule_rate: float
    fire_rate: float
    backlog: float

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value >= 0:
                raise ConfigError(f"{name}={value!r}: use a non-negative number of items (per second)")


@dataclass(frozen=True)
class Plan:
    """What a workload needs, and why.

    Attributes:
        masters: Redis Cluster primaries (the largest of ``masters_by``).
        masters_by: primaries each limit alone would need: ``cpu``, ``memory``, ``network``.
        binding: the limit that sets ``masters`` (ties go to the first in that order), ``none``
            when one master suffices, ``slot spread`` past :data:`MAX_SHARDS` masters.
        shards, forwarders, batch: the store's shard count, forwarder processes, claim batch.
        claim_block_us: how long one claim of ``batch`` items blocks its master.
        forwarder_rate: items/s one forwarder moves at ``batch``.
        cpu_per_master, memory_per_master, network_per_master: load of each primary
            (a fraction of one core, bytes, bytes/s).
        notes: limits near or past their edge, in words.
    """

    masters: int
    masters_by: dict[str, int]
    binding: str
    shards: int
    forwarders: int
    batch: int
    claim_block_us: float
    forwarder_rate: float
    cpu_per_master: float
    memory_per_master: float
    network_per_master: float
    notes: list[str] = field(default_factory=list)


def _batch(costs: Costs, limits: Limits) -> int:
    """The largest batch up to ``limits.batch`` whose claim stays under ``max_block_us``."""
    room = limits.max_block_us - costs.claim_call_us
    fits = math.floor(room / costs.claim_us) if costs.claim_us > 0 else limits.batch
    if fits < 1:
        raise ConfigError(
            f"a claim call alone costs {costs.claim_call_us} µs, over max_block_us={limits.max_block_us}: "
            "raise max_block_us"
        )
    return min(limits.batch, fits)


def store_us_per_forwarded(costs: Costs, batch: int) -> float:
    """Store (master) CPU per forwarded item at ``batch``: claim and ack, their per-call costs
    shared by the batch. The publish runs on the broker, not on a master."""
    return costs.claim_us + costs.ack_us + (costs.claim_call_us + costs.ack_call_us) / batch


def predict_forward_rate(
    costs: Costs, batch: int, *, rtt_us: float, round_trips_per_batch: float = Limits.round_trips_per_batch
) -> float:
    """Items/s of one forwarder with a server to itself: it waits for each script and for the
    broker, so its Python time, the servers' time and the round trips add up."""
    per_item = (
        costs.forwarder_us
        + store_us_per_forwarded(costs, batch)
        + costs.publish_us
        + round_trips_per_batch * rtt_us / batch
    )
    return 1e6 / per_item


def plan(workload: Workload, costs: Costs = Costs(), limits: Limits = Limits()) -> Plan:
    """Masters, shards and forwarders for ``workload``, and which limit sets the master count."""
    batch = _batch(costs, limits)
    cpu_us = workload.schedule_rate * costs.schedule_us + workload.fire_rate * store_us_per_forwarded(costs, batch)
    memory = workload.backlog * costs.bytes_per_item
    network = (workload.schedule_rate + workload.fire_rate) * costs.wire_bytes_per_item
    masters_by = {
        "cpu": max(1, math.ceil(cpu_us / (1e6 * limits.master_cpu_share))),
        "memory": max(1, math.ceil(memory / limits.master_memory_bytes)),
        "network": max(1, math.ceil(network / limits.master_network_bytes_s)),
    }
    masters = max(masters_by.values())
    # one master is the floor, not a limit reached: then nothing binds
    binding = next(name for name, need in masters_by.items() if need == masters) if masters > 1 else "none"
    notes: list[str] = []
    if masters > MAX_SHARDS:
        notes.append(
            f"{masters} masters but at most {MAX_SHARDS} shards: masters past {MAX_SHARDS} hold no shard; "
            "split the work over several prefixes (stores)"
        )
        binding = "slot spread"
    shards = min(MAX_SHARDS, masters * math.ceil(limits.min_shards / masters))
    rate = predict_forward_rate(costs, batch, rtt_us=limits.rtt_us, round_trips_per_batch=limits.round_trips_per_batch)
    forwarders = max(1, math.ceil(workload.fire_rate / (rate * limits.forwarder_cpu_share)))
    block = costs.claim_call_us + batch * costs.claim_us
    if batch < limits.batch:
        notes.append(
            f"batch cut from {limits.batch} to {batch} so a claim blocks its master ≤ {limits.max_block_us:.0f} µs"
        )
    return Plan(
        masters=masters,
        masters_by=masters_by,
        binding=binding,
        shards=shards,
        forwarders=forwarders,
        batch=batch,
        claim_block_us=block,
        forwarder_rate=rate,
        cpu_per_master=cpu_us / 1e6 / masters,
        memory_per_master=memory / masters,
        network_per_master=network / masters,
        notes=notes,
    )
