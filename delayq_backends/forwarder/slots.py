"""Concurrency slots in the pass: an item whose key has no free slot waits in the store.

:class:`SlotHook` is one more :class:`~.hooks.PassHook` (the design of :mod:`.hooks`): ``admit``
takes a slot per delivery whose key has one free, for all keys of the call in one round trip
(``slot_take.lua`` per key), and gives the delivery the slot's token (``Delivery.slot_token``),
which the target puts in the message; ``sent`` gives back the slots of deliveries the target did
not take; the worker reports the task's start and end with the token (:mod:`delayq_backends.slots`).

Waiting items keep their order: each key has a line (its ``waiting`` set, ordered by rank band,
then ready time) and a free slot goes to the head of it. An item refused is deferred (no attempt
counted, original ready time kept) by :data:`RECHECK_MS` per ``limit`` places ahead of it, up to
:data:`MAX_RECHECK_MS`: the next in line look again soon, the far back rarely, so a deep line is
not claimed over and over. A slot given back does not wait for a recheck: the worker's end passes
it to the head of the line and brings that item forward (``DelayStore.hold_slots``); the
rechecks cover what no end passes on (a lapsed hold, a hand-over that failed).
A slot taken is held :attr:`~.settings.ForwarderSettings.slot_start_window` for the worker's
start: what a message nobody reads (or a lost one) costs its key.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..envelope import slot_of
from ..flow import Admission
from ..keys import MAX_RANK, RANK_SPAN
from ..models import Claim, SlotGrant
from ..store import WAIT_MS, DelayStore, SlotAsk, slot_member
from ..targets import Delivery, RunTarget, Target
from .hooks import PassHook
from .records import Published, Verdict

__all__ = ["FOLD_KEYS", "FOLD_MS", "MAX_RECHECK_MS", "PAUSED_RECHECK_MS", "RECHECK_MS", "SlotHook", "asks_again_ms"]

log = logging.getLogger("delayq.forwarder")

#: How soon an item next in line for a slot asks again (a slot freed by a lapsed hold idles at most
#: this long; one given back is passed on at once).
RECHECK_MS = 200
#: How long the items far back in a line wait between two asks, at most.
MAX_RECHECK_MS = 5_000
#: How soon the items of a paused group ask again: a resume takes effect within this long.
PAUSED_RECHECK_MS = 1_000
#: How often a forwarder reads the workers' reports of the keys it took slots of (when no item
#: of the key asks meanwhile): a slot given back shows as free this soon, and beats do not pile up.
FOLD_MS = 1_000
#: Keys one look reads at most (in one round trip), taking turns when more are held.
FOLD_KEYS = 500
_NOTHING = Verdict()


@dataclass
class _Asking:
    """One slot key's deliveries of a publish call: the highest limit they carry, and each with
    its member and order."""

    limit: int = 0
    items: list[tuple[Delivery, str, int]] = field(default_factory=list)


class SlotHook(PassHook):
    """Concurrency slots: a delivery whose key is at its limit waits in the store, in its
    place in the key's line; other keys and items without a slot are not held up.

    ``admits`` turns on at the first claim holding a slotted item, so a store without slots
    keeps publishing all claims of a pass in one call. A slotted claim costs two round trips
    more: its items join their lines when prepared, and take slots just before their publish.
    """

    def __init__(self, store: DelayStore, targets: Mapping[str, Target], start_window_ms: int) -> None:
        self.store = store
        self.start_window_ms = start_window_ms
        self.run_targets = {kind: t for kind, t in targets.items() if isinstance(t, RunTarget)}
        self.admits = False
        #: the keys this forwarder took slots of that were still held at its last look
        self.holding: set[str] = set()
        self._folded_ms = 0
        self._fold_turn = 0

    def prepare(self, claim: Claim, groups: Mapping[str, list[Delivery]]) -> Verdict:
        """Put the claim's slotted items in their keys' lines: a pass prepares all its claims
        before it publishes any, so slots go in each key's order across the shards."""
        by_key: dict[str, _Asking] = {}
        for kind, deliveries in groups.items():
            self._slotted(kind, deliveries, by_key)
        if by_key:
            self.admits = True
            for key, reply in self._take(by_key, "join").items():
                if isinstance(reply, Exception):  # admit meets it again, and holds the items back
                    log.debug("slot %r: could not join the line (%s)", key, reply)
                else:
                    _report_reset(key, reply)
        return _NOTHING

    def member(self, kind: str, delivery: Delivery) -> str:
        """The delivery's member in its key's sets: what its worker holds and gives back."""
        target = self.run_targets.get(kind)
        ref = None if target is None else target.run_of(delivery)
        return slot_member(delivery.id, None if ref is None else ref.run)

    def _slotted(self, kind: str, deliveries: list[Delivery], by_key: dict[str, _Asking]) -> list[Delivery]:
        """Add the slotted ``deliveries`` to ``by_key`` (by slot key, in their order); the others."""
        others: list[Delivery] = []
        for d in deliveries:
            found = slot_of(d.envelope)
            if found is None:
                others.append(d)
                continue
            slot, rank = found
            asking = by_key.setdefault(slot.key, _Asking())
            asking.limit = max(asking.limit, slot.limit or 0)
            asking.items.append((d, self.member(kind, d), (MAX_RANK - rank) * RANK_SPAN + d.ready_ms))
        return others

    def _take(self, by_key: Mapping[str, _Asking], mode: str = "take") -> dict[str, SlotGrant | Exception]:
        """Slots for ``by_key``'s items (or in ``mode`` "join"/"leave" their places in line): a
        slot taken is held until its worker starts the item, a place kept while its item asks again."""
        asks = {key: SlotAsk(a.limit, [(m, order) for _, m, order in a.items]) for key, a in by_key.items()}
        return self.store.take_slots(asks, hold_ms=self.start_window_ms, wait_ms=WAIT_MS, mode=mode)

    def admit(self, kind: str, deliveries: list[Delivery], now_ms: int) -> Admission:
        by_key: dict[str, _Asking] = {}
        go = self._slotted(kind, deliveries, by_key)
        if not by_key:
            return Admission(deliveries, [])
        grants = self._take(by_key)
        later: list[tuple[str, int]] = []
        for key, asking in by_key.items():
            grant = grants[key]
            if isinstance(grant, Exception):  # fail closed: the limit protects what the key names
                log.error("slot %r failed (%s: %s); its items wait", key, type(grant).__name__, grant)
                later += [(d.id, now_ms + MAX_RECHECK_MS) for d, _, _ in asking.items]
                continue
            _report_reset(key, grant)
            if grant.running:
                self.holding.add(key)
            refused = 0
            for (d, _, _), place, token, why in zip(asking.items, grant.places, grant.tokens, grant.reasons):
                if place < 0:
                    d.slot_token = token
                    go.append(d)
                else:
                    later.append((d.id, asks_again_ms(grant, why, place, refused, now_ms)))
                    refused += 1
        return Admission(go, later)

    def fold(self, now_ms: int) -> None:
        """Read the workers' reports of the keys still held (at most every :data:`FOLD_MS`, one
        round trip of up to :data:`FOLD_KEYS` keys, taking turns): the next take reads them
        anyway, but a key none of whose items asks would show its ended tasks as running, and
        pile up its running tasks' beats."""
        if not self.holding or now_ms - self._folded_ms < FOLD_MS:
            return
        self._folded_ms = now_ms
        keys = sorted(self.holding)
        start = self._fold_turn % len(keys)
        turn = (keys[start:] + keys[:start])[:FOLD_KEYS]
        self._fold_turn = start + len(turn)
        quiet = {key: _Asking() for key in turn}
        for key, reply in self._take(quiet, "join").items():
            if isinstance(reply, Exception):
                log.debug("slot %r: could not read its reports (%s)", key, reply)
                continue
            _report_reset(key, reply)
            if not reply.running:
                self.holding.discard(key)

    def settled(self, published: Published) -> None:
        """The items of the claim that will not be published (found started by lossless mode,
        failed before their publish) give up the places they took in ``prepare``: a place at
        the head of a line would keep a free slot for them until it lapses."""
        prepared = published.prepared
        gone = prepared.skipped | {f.id for f in prepared.failures}
        if not gone:
            return
        by_key: dict[str, _Asking] = {}
        for kind, deliveries in prepared.groups.items():
            self._slotted(kind, [d for d in deliveries if d.id in gone], by_key)
        if by_key:
            for key, reply in self._take(by_key, "leave").items():
                if isinstance(reply, Exception):  # the places lapse by themselves
                    log.warning("slot %r: could not give up %d places in line (%s)", key, len(by_key[key].items), reply)

    def sent(self, kind: str, deliveries: Sequence[Delivery], published: Sequence[str]) -> None:
        """Give back the slots of the deliveries the target did not take (failed, unsent)."""
        if len(published) == len(deliveries):
            return
        took = set(published)
        back: dict[str, list[str]] = {}
        for d in deliveries:
            if d.id not in took and (found := slot_of(d.envelope)) is not None:
                back.setdefault(found[0].key, []).append(self.member(kind, d))
        if back:
            for key, reply in self.store.give_back_slots(back).items():
                if isinstance(reply, Exception):  # its hold lapses after the start window
                    log.warning("slot %r: could not give back %d slots (%s)", key, len(back[key]), reply)


def _report_reset(key: str, grant: SlotGrant) -> None:
    """Log what the slot script found out of place in ``key``'s keys and dropped (whichever call
    met it first: a key of another type is gone a millisecond later), or reports that did not
    count: a key that would block, or run over its limit, says so here."""
    if grant.reset:
        log.warning(
            "slot %r: %s; dropped or refused (holds are the forwarders', reports count only with their hold's "
            "token: check what else writes the store's keys)",
            key,
            grant.reset,
        )


def asks_again_ms(grant: SlotGrant, why: str, place: int, refused: int, now_ms: int) -> int:
    """When an item refused by its group (``why``; the ``refused``-th of its call) asks again:
    at its turn of the group's rate (the next token's time, then one a token apart), when its
    throttle ends, within a second of a resume (a paused group), else by its place in line."""
    if why == "rate" and grant.rate_until is not None and grant.rate_per_s:
        return grant.rate_until + math.ceil(refused * 1000 / grant.rate_per_s)
    if why == "throttled" and grant.throttled_until is not None:
        return grant.throttled_until
    if why == "paused":
        return now_ms + PAUSED_RECHECK_MS
    return now_ms + recheck_ms(place, grant.limit)


def recheck_ms(place: int, limit: int) -> int:
    """How long an item ``place`` places back in a line waits before it asks again."""
    return min(MAX_RECHECK_MS, RECHECK_MS * (1 + place // max(1, limit)))
