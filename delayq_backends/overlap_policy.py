"""Overlap policies of periodic entries: what a period does while the entry's previous run runs.

- ``allow`` (the default): it runs; runs may overlap (what Celery beat and rq-scheduler do).
- ``skip``: it is skipped and counted while the previous run holds the entry's slot.
- ``buffer_one``: it waits for the slot, in line as slotted items wait; while one waits, the
  periods that fall due are skipped and counted.

Built on concurrency slots (:mod:`delayq_backends.slots`): an entry with a policy other than
``allow`` has the slot key ``periodic:<entry>`` with limit 1, and each run carries it, so its
worker holds the slot while it runs and gives it back when it ends. The forwarder asks the key
when it fires the entry (``slot_take.lua`` in mode "skip" or "buffer", one call per key): the
run goes (slot taken), waits (buffer_one, first in line) or is skipped. The slot is a lease, so a
worker killed mid-run holds it at most a run hold (60 s) after its last beat: under ``skip``, the
periods of that window are skipped; and the forwarder's own hold of a run that no worker has
started yet lasts up to 5 min (a message lost on the way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import NamedTuple

from .envelope import MAX_RATE_KEY, Slot
from .errors import ConfigError, DelayqError
from .store import START_HOLD_MS, WAIT_MS, DelayStore, SlotAsk

__all__ = [
    "ALLOW",
    "BUFFER_ONE",
    "POLICIES",
    "RUN_RECHECK_MS",
    "SKIP",
    "SLOT_PREFIX",
    "Fire",
    "OverlapAsk",
    "check_policy",
    "fire_runs",
    "overlap_slot",
]

ALLOW, SKIP, BUFFER_ONE = "allow", "skip", "buffer_one"
POLICIES = (ALLOW, SKIP, BUFFER_ONE)
#: The slot key of entry ``name`` is ``periodic:<name>``.
SLOT_PREFIX = "periodic:"
#: How soon a periodic run that waits for its entry's slot (an RQ entry's overlap "buffer") asks again.
RUN_RECHECK_MS = 200
#: slot_take.lua's mode per policy
_MODES = {SKIP: "skip", BUFFER_ONE: "buffer"}


class Fire(Enum):
    """What a period of an entry with an overlap policy does."""

    RUN = "run"  # the slot is taken: publish the run
    WAIT = "wait"  # buffer_one: the run waits first in the slot's line
    SKIP = "skip"  # the previous run still holds the slot (or one waits): skipped, counted


class OverlapAsk(NamedTuple):
    """A period about to fire: its entry's policy, its run's slot member and its order in line."""

    policy: str
    member: str
    order: int


def check_policy(entry: str, value: object) -> str:
    """``value`` as an overlap policy of entry ``entry``.

    Raises:
        ConfigError: not a policy, or an entry name too long for a slot key; saying what to use.
    """
    if value not in POLICIES:
        raise ConfigError(
            f"periodic entry {entry!r}: overlap policy {value!r} is not one; use one of "
            f"{', '.join(repr(p) for p in POLICIES)} (default {ALLOW!r})"
        )
    policy = str(value)
    if policy != ALLOW:
        overlap_slot(entry)
    return policy


def overlap_slot(entry: str) -> Slot:
    """The concurrency slot of entry ``entry``'s runs: key ``periodic:<entry>``, limit 1.

    Raises:
        ConfigError: the name cannot make a slot key (too long, not printable).
    """
    key = f"{SLOT_PREFIX}{entry}"
    if not key.isprintable() or len(key) > MAX_RATE_KEY:
        raise ConfigError(
            f"periodic entry {entry!r}: an overlap policy needs a printable name of at most "
            f"{MAX_RATE_KEY - len(SLOT_PREFIX)} characters (its slot key is {SLOT_PREFIX}<name>); shorten it"
        )
    return Slot(key, 1)


def fire_runs(store: DelayStore, asks: Mapping[str, OverlapAsk]) -> dict[str, Fire | DelayqError]:
    """Ask each entry's slot (by entry name) whether its period runs now, waits or is skipped:
    one script call per entry, one round trip per policy. An entry whose call failed gets the
    error (its caller lets the entry wait: the limit is what it protects)."""
    out: dict[str, Fire | DelayqError] = {}
    for policy, mode in _MODES.items():
        mine = {name: a for name, a in asks.items() if a.policy == policy}
        if policy == BUFFER_ONE and mine:  # a run buffered before waits in its group's line
            waiting = store.group_lines([overlap_slot(name).key for name in mine])
            out.update((name, Fire.SKIP) for name in mine if waiting[overlap_slot(name).key])
            mine = {name: a for name, a in mine.items() if name not in out}
        if not mine:
            continue
        by_key = {overlap_slot(name).key: SlotAsk(1, [(a.member, a.order)]) for name, a in mine.items()}
        grants = store.take_slots(by_key, hold_ms=START_HOLD_MS, wait_ms=WAIT_MS, mode=mode)
        for name, key in zip(mine, by_key):
            grant = grants[key]
            out[name] = _fire(grant.places) if not isinstance(grant, Exception) else _error(key, grant)
    return out


def _fire(places: Sequence[int]) -> Fire:
    place = places[0] if places else -2
    return Fire.RUN if place == -1 else Fire.SKIP if place < -1 else Fire.WAIT


def _error(key: str, exc: Exception) -> DelayqError:
    return DelayqError(f"slot {key!r} could not be asked ({type(exc).__name__}: {exc})")
