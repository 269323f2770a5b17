"""Groups in the pass (issue 31): the release step that fills the due index from the groups'
lines, and the hook that admits each released item.

Waiting costs nothing: a grouped item waits parked in its shard's line of its group
(:mod:`delayq_backends.store.glines`), and a claim reads it only once its group released it.

- :class:`ReleaseStep` runs first in a pass, on the shards whose ``gready`` came: the groups
  due there (one round trip), their room (one: free slots from the groups' keys, weights), the
  line heads that may take a group's few free slots, earliest first across the shards (one,
  only for groups at a limit), then one ``group_release.lua`` call per shard (one round trip)
  that puts up to each group's allowance of line heads in the due index ahead of every other
  item. The allowances share each shard's batch by weight (deficit round robin, deficits kept
  here; the items of no group are one more group of weight 1), so a group's backlog delays
  another's items by at most a pass.
- :class:`GroupHook` admits each released item just before its publish (``slot_take.lua``, one
  call per group, one round trip): a refusal (another forwarder took the room first) puts the
  item back in its line (``group_park.lua``), never back in the due index.

A worker's end report (and a forwarder's give-back, from its script) names its group on the
groups' wake channel; a forwarder that hears it hands the group's free slots straight to the
earliest heads of its lines (:meth:`ReleaseStep.apply_wakes`, at most :data:`WAKES_PER_PASS`
groups a pass: its room with its heads, then their release into the due index, two round trips
and one script call per shard holding a head), so a slot given back is taken by the next claim, with no
look at the group's lines in every shard. A group at its limit is looked at again every
:data:`.slots.RECHECK_MS` anyway: a slot freed with no end report (a hold that lapsed, a
forwarder killed after its release) idles at most that long.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..envelope import Envelope, groups_of, slot_of
from ..flow import Admission
from ..models import Claim, LineRelease, SlotGrant
from ..scripts.store import LineItem
from ..store import WAIT_MS, DelayStore, SlotAsk, slot_member
from ..store.glines import LINE_RECHECK_MS, GroupRoom, line_order
from ..targets import Delivery, RunTarget, Target
from ..timeutil import Clock
from . import slots
from .hooks import PassHook
from .records import Published, Verdict
from .stats import ForwarderStats

__all__ = [
    "GROUP_FLOOR",
    "GROUPS_KEPT",
    "MAX_HEADS",
    "PASS_MS",
    "PROBES",
    "WAKES_PER_PASS",
    "WEIGHT_TTL_MS",
    "GroupHook",
    "ReleaseStep",
]

log = logging.getLogger("delayq.forwarder")

#: Most groups whose wake-ups one pass applies (the rest at the next): anyone allowed to publish
#: on the channel could otherwise make a forwarder write without end.
WAKES_PER_PASS = 100
#: How long a group's weight read is used before it is read again (ms).
WEIGHT_TTL_MS = 1_000
#: Groups a forwarder keeps what it learned of (weights, limits carried) before it forgets the
#: lot and learns again: memory stays bounded however many groups come and go.
GROUPS_KEPT = 100_000
#: Admissions of a group's items that carry no limit before it counts as unlimited (:meth:`GroupHook._learn`).
PROBES = 3
#: Line heads read per group at a limit to share its free slots across the shards, at most.
MAX_HEADS = 100
#: How long a pass should take while groups' backlogs are due (ms): a pass releases about what
#: this forwarder publishes in that time, so an item of another group that comes due waits a
#: pass this short, not a pass of a full batch per shard.
PASS_MS = 20
#: Fewest items a due group may release in a pass, whatever its share of the pass's budget.
GROUP_FLOOR = 25
#: A gap between passes (s) after which the release rate is measured again.
RATE_GAP_S = 0.5
_NOTHING = Verdict()


@dataclass(frozen=True)
class _Ask:
    """One delivery asking one of its groups: its member, the line item it goes back as if
    refused, its cost against the group's rate and the token its holds share (one per item:
    the worker reports each of its groups with the token its message carries)."""

    delivery: Delivery
    member: str
    back: LineItem
    cost: int
    token: str


@dataclass
class _Asking:
    """One group's deliveries of a publish call: the highest limit they carry, the first
    rate and weight they name, and each one's ask."""

    limit: int = 0
    rate: str | None = None
    weight: float | None = None
    items: list[_Ask] = field(default_factory=list)


def _line_rank(envelope: Envelope) -> int:
    """The rank an item keeps in its line (a slotted item's envelope records it; else 0)."""
    found = slot_of(envelope)
    return 0 if found is None else found[1]


class GroupHook(PassHook):
    """Admission: a released item whose group has no room left goes back to its group's line;
    other groups and items of no group are not held up.

    ``admits`` turns on at the first claim holding a grouped item, so a store without groups
    keeps publishing all claims of a pass in one call.
    """

    def __init__(
        self, store: DelayStore, targets: Mapping[str, Target], start_window_ms: int, stats: ForwarderStats
    ) -> None:
        self.store = store
        self.start_window_ms = start_window_ms
        self.stats = stats
        self.run_targets = {kind: t for kind, t in targets.items() if isinstance(t, RunTarget)}
        self.admits = False
        #: the keys this forwarder took slots of that were still held at its last look
        self.holding: set[str] = set()
        #: the limit each group's items carried at its last admission (0: none): the release
        #: step's room where no runtime limit is set (a group not here releases one item first)
        self.limits: dict[str, int] = {}
        #: admissions per group that saw no limit carried, before the group counts as unlimited
        self._unlimited: dict[str, int] = {}
        #: items refused at admission, by id: they go back to their lines when their claim settles
        self._refused: dict[str, LineItem] = {}
        self._folded_ms = 0
        self._fold_turn = 0

    def prepare(self, claim: Claim, by_kind: Mapping[str, list[Delivery]]) -> Verdict:
        """Turn admission on at the first grouped item (nothing to write: its line holds its place)."""
        if not self.admits:
            self.admits = any(groups_of(d.envelope) for ds in by_kind.values() for d in ds)
        return _NOTHING

    def member(self, kind: str, delivery: Delivery) -> str:
        """The delivery's member in its group's holds: what its worker holds and gives back."""
        target = self.run_targets.get(kind)
        ref = None if target is None else target.run_of(delivery)
        return slot_member(delivery.id, None if ref is None else ref.run)

    def _grouped(self, kind: str, deliveries: list[Delivery], by_key: dict[str, _Asking], until: int) -> list[Delivery]:
        """Add the grouped ``deliveries`` to ``by_key`` (each under every group it names, in
        their order; it goes back to its line group's line if any refuses it); the others."""
        others: list[Delivery] = []
        for d in deliveries:
            groups = groups_of(d.envelope)
            if not groups:
                others.append(d)
                continue
            back = LineItem(d.id, d.ready_ms, _line_rank(d.envelope), groups[0].key, until_ms=until)
            member, token = self.member(kind, d), secrets.token_hex(16)
            for g in groups:
                asking = by_key.setdefault(g.key, _Asking())
                asking.limit = max(asking.limit, g.limit or 0)
                asking.rate = asking.rate or g.rate
                asking.weight = asking.weight if asking.weight is not None else g.weight
                asking.items.append(_Ask(d, member, back, g.cost, token))
        return others

    def _take(self, by_key: Mapping[str, _Asking], mode: str) -> dict[str, SlotGrant | Exception]:
        """Slots for ``by_key``'s items (mode "take"), or a look at their groups' reports ("join"
        of none). A refused item keeps its place in the slot key's line a while, in its group
        line's order: the release step lets that line's earliest through first, so the free slot
        it keeps is taken by the item it waits for (a periodic run its overlap policy buffered
        waits there too)."""
        asks = {
            key: SlotAsk(
                a.limit,
                [(i.member, line_order(i.back.rank, i.back.ready_ms)) for i in a.items],
                rate=a.rate,
                weight=a.weight,
                costs=[i.cost for i in a.items],
                tokens=[i.token for i in a.items],
            )
            for key, a in by_key.items()
        }
        return self.store.take_slots(asks, hold_ms=self.start_window_ms, wait_ms=WAIT_MS, mode=mode)

    def admit(self, kind: str, deliveries: list[Delivery], now_ms: int) -> Admission:
        by_key: dict[str, _Asking] = {}
        go = self._grouped(kind, deliveries, by_key, now_ms + slots.RECHECK_MS)
        if not by_key:
            return Admission(deliveries, [])
        grants = self._take(by_key, "take")
        later: dict[str, int] = {}
        held: dict[str, list[tuple[str, str]]] = {}  # id -> (group, member) of each grant
        refused: dict[str, int] = {}  # id -> when its group may take it (the latest of its refusals)
        for key, asking in by_key.items():
            grant = grants[key]
            if isinstance(grant, Exception):  # fail closed: the limit protects what the group names
                log.error("group %r failed (%s: %s); its items wait", key, type(grant).__name__, grant)
                later.update((i.delivery.id, now_ms + slots.MAX_RECHECK_MS) for i in asking.items)
                continue
            _report_reset(key, grant)
            self._learn(key, asking.limit)
            if grant.running:
                self.holding.add(key)
            n = 0
            for ask, place, why in zip(asking.items, grant.places, grant.reasons or ("",) * len(asking.items)):
                d = ask.delivery
                if place < 0:
                    held.setdefault(d.id, []).append((key, ask.member))
                    d.slot_token = ask.token
                else:
                    until = slots.asks_again_ms(grant, why or "limit", n, now_ms)
                    refused[d.id] = max(refused.get(d.id, 0), until)
                    n += 1
        go += [d for d in _in_order(by_key) if d.id not in refused and d.id not in later]
        lines = {i.delivery.id: i.back for a in by_key.values() for i in a.items}
        back: dict[str, list[str]] = {}
        for item_id, until in refused.items():
            self._refused[item_id] = replace(lines[item_id], until_ms=until)
            for key, member in held.get(item_id, ()):  # the groups that took it give their slot back
                back.setdefault(key, []).append(member)
        for item_id in later:
            for key, member in held.get(item_id, ()):
                back.setdefault(key, []).append(member)
        self._give_back(back)
        return Admission(go, sorted(later.items()))

    def _give_back(self, back: Mapping[str, list[str]]) -> None:
        """Give back the holds of ``back`` (group -> members): their items do not go now."""
        if back:
            for key, reply in self.store.give_back_slots(back).items():
                if isinstance(reply, Exception):  # its hold lapses after the start window
                    log.warning("group %r: could not give back %d slots (%s)", key, len(back[key]), reply)

    def _learn(self, key: str, carried: int) -> None:
        """Note the limit ``key``'s items carried at an admission. An item carrying none (a
        group named by key alone) does not undo a limit its others carry, and the group counts
        as unlimited only after :data:`PROBES` admissions saw none: until then the release step
        lets one item at a time through, so a limit carried by the next items still holds their
        order. This is only the release step's guess for a group no admission has met: once an
        item carrying a limit is admitted, ``slot_take.lua`` records it in the group's policy
        hash, and every forwarder's admissions and rooms apply it from there."""
        if len(self.limits) + len(self._unlimited) > GROUPS_KEPT:
            self.limits.clear()
            self._unlimited.clear()
        if carried:
            self.limits[key] = carried
        elif key not in self.limits:
            self._unlimited[key] = self._unlimited.get(key, 0) + 1
            if self._unlimited[key] >= PROBES:
                self.limits[key] = 0
                del self._unlimited[key]

    def fold(self, now_ms: int) -> None:
        """Read the workers' reports of the groups still held (at most every
        :data:`.slots.FOLD_MS`, one round trip of up to :data:`.slots.FOLD_KEYS` groups, taking
        turns): the next take reads them anyway, but a group none of whose items asks would show
        its ended tasks as running, and pile up its running tasks' beats."""
        if not self.holding or now_ms - self._folded_ms < slots.FOLD_MS:
            return
        self._folded_ms = now_ms
        keys = sorted(self.holding)
        start = self._fold_turn % len(keys)
        turn = (keys[start:] + keys[:start])[: slots.FOLD_KEYS]
        self._fold_turn = start + len(turn)
        for key, reply in self._take({key: _Asking() for key in turn}, "join").items():
            if isinstance(reply, Exception):
                log.debug("group %r: could not read its reports (%s)", key, reply)
                continue
            _report_reset(key, reply)
            if not reply.running:
                self.holding.discard(key)

    def settled(self, published: Published) -> None:
        """The claim's items refused at admission go back to their lines (no attempt counted, the
        ready time kept), each group looked at again when the refusal said."""
        lease = published.lease
        back = [self._refused.pop(i.id) for i in lease.items if i.id in self._refused]
        if back:
            n, deferred = self.store.to_lines(lease.claim, back, recheck_at=lease.now_ms() + LINE_RECHECK_MS)
            self.stats.deferred += n
            if deferred:
                log.error(
                    "shard %d: %d refused items deferred instead of put in their lines: a line key holds another "
                    "type (written by another tool); the release step makes it expire",
                    lease.shard, deferred,
                )  # fmt: skip

    def sent(self, kind: str, deliveries: Sequence[Delivery], published: Sequence[str]) -> None:
        """Give back the slots of the deliveries the target did not take (failed, unsent)."""
        if len(published) == len(deliveries):
            return
        took = set(published)
        back: dict[str, list[str]] = {}
        for d in deliveries:
            if d.id not in took:
                for g in groups_of(d.envelope):
                    back.setdefault(g.key, []).append(self.member(kind, d))
        self._give_back(back)


class ReleaseStep:
    """The release step of a pass: line heads into the due index, by room and weight."""

    def __init__(self, store: DelayStore, hook: GroupHook, clock: Clock, stats: ForwarderStats, batch: int) -> None:
        self.store = store
        self.hook = hook
        self.clock = clock
        self.stats = stats
        self.batch = batch
        #: the shards whose lines may release now, as the last heads read (and releases) said
        self.due_lines: set[int] = set()
        #: deficit round robin: (shard, group) -> the share not used yet, carried between passes
        self.deficits: dict[tuple[int, str], float] = {}
        self._woken: set[str] = set()
        #: whether ``due_lines`` comes from a read of every shard's lines since the last pass
        self._fresh = False
        self._bound: set[str] = set()
        #: group -> (weight, when read)
        self._weight_read: dict[str, tuple[float, int]] = {}
        #: the shard that goes first at the pass's caps (turns)
        self._turn = 0
        #: items/s this forwarder released lately (None: not measured yet), and the last pass's
        #: (perf_counter time, items released)
        self._rate: float | None = None
        self._last: tuple[float, int] | None = None

    def saw(self, lines: Sequence[int | None]) -> None:
        """The lines' heads per shard (``gready``'s earliest), as the loop's heads read them."""
        now = self.clock()
        self.due_lines = {s for s, at in enumerate(lines) if at is not None and at <= now}
        self._fresh = True

    def woken(self, group: object) -> None:
        """A wake-up on the groups' channel: its group's lines are made due at the next pass."""
        if isinstance(group, bytes) and 0 < len(group) <= 1024 and len(self._woken) < 10 * WAKES_PER_PASS:
            self._woken.add(group.decode("utf-8", "replace"))

    def apply_wakes(self) -> None:
        """Hand the woken groups' free slots to their lines' heads (:meth:`~delayq_backends.store.
        glines.GroupLines.hand_over`: two round trips), held as a bound group is."""
        if not self._woken:
            return
        woken = sorted(self._woken)[:WAKES_PER_PASS]
        self._woken.difference_update(woken)
        now = self.clock()
        rooms = self.store.hand_over(
            woken, now=now, held_until=now + slots.RECHECK_MS, limits=self.hook.limits,
            hold_ms=self.hook.start_window_ms,
        )  # fmt: skip
        for g, room in rooms.items():
            if isinstance(room, GroupRoom):
                _report_reset(g, room)

    def release(self, due: Sequence[int]) -> list[int]:
        """Release line heads where lines may release now; the shards to claim: those of ``due``
        whose lines released something or whose due index holds an item due (a look at a full
        group's lines costs no claim), and the others whose lines released something.

        Once this forwarder has met a grouped item, every pass of a sweep but its first looks at
        every shard's lines (one round trip): a quiet group's item that came due during a sweep
        of another group's backlog, in a shard no claim was going to, is released by the next
        pass, not after the sweep. The first pass looks only where the loop's read of every
        shard's heads just now (:meth:`saw`) found a line due: a slot handed over costs no look.
        A pass releases at most :meth:`_pass_budget` items, shared by the groups due by weight
        (at least one each): however large a group's backlog, the next pass comes soon."""
        every = self.hook.admits and not self._fresh
        self._fresh = False
        shards = list(range(self.store.shards)) if every else [s for s in due if s in self.due_lines]
        if not shards:
            return list(due)
        now = self.clock()
        looked = self.store.due_groups(shards, now=now)
        self.due_lines.difference_update(s for s in shards if s not in looked)
        if not looked:
            return list(due)
        groups = {g for found, _ in looked.values() for g in found}
        rooms = self.store.group_rooms(groups, limits=self.hook.limits, hold_ms=self.hook.start_window_ms)
        for g, room in rooms.items():
            if isinstance(room, GroupRoom):
                _report_reset(g, room)
        quota = self._room_shares(looked, rooms, now)
        weights = self._weights(groups, now)
        caps = self._caps(weights, any(others for _, others in looked.values()), len(looked))
        plan: dict[int, list[tuple[str, int, int]]] = {}
        waits: set[int] = set()  # shards whose lines keep due items this pass gave no allowance
        order = sorted(looked)
        self._turn = (self._turn + 1) % len(order)
        for shard in order[self._turn :] + order[: self._turn]:  # the shards take turns at the caps
            found, others_due = looked[shard]
            if not found:  # its gready holds another type: the call drops it
                plan[shard] = []
            total = sum(weights[g] for g in found) + (1.0 if others_due else 0.0)
            for g in found:
                share = self.batch * weights[g] / total
                group, allowance, held = self._allowance(shard, g, share, rooms[g], quota, now)
                capped = min(allowance, caps[g])
                caps[g] -= capped
                if allowance and not capped and not held:  # its turn comes at a next pass
                    waits.add(shard)
                else:
                    plan.setdefault(shard, []).append((group, capped, held))
        released = self._apply(plan, self.store.release_lines(plan), now) if plan else {}
        self.due_lines.update(waits)
        self._count(sum(released.values()))
        return sorted({s for s in due if s not in looked or looked[s][1]} | {s for s, n in released.items() if n})

    def _caps(self, weights: Mapping[str, float], others_due: bool, shards: int) -> dict[str, int]:
        """Each due group's most releases this pass, over all shards: the pass's budget shared by
        weight (the items of no group one more group of weight 1), at least :data:`GROUP_FLOOR`
        each (a group's look costs a pass a few calls whatever it releases: many groups due make
        a pass longer, not each group's share tiny)."""
        total = sum(weights.values()) + (1.0 if others_due else 0.0)
        budget = self._pass_budget(shards)
        floor = min(GROUP_FLOOR, self.batch)
        return {g: max(floor, int(budget * w / total)) for g, w in weights.items()}

    def _pass_budget(self, shards: int) -> int:
        """Most items a pass releases: what this forwarder published in :data:`PASS_MS` lately
        (at least a batch; a full batch per shard until it has published a while)."""
        most = self.batch * max(shards, 1)
        if self._rate is None:
            return most
        return max(self.batch, min(most, int(self._rate * PASS_MS / 1000)))

    def _count(self, released: int) -> None:
        """Note a pass's releases: the rate between passes while lines keep releasing (a pause
        over :data:`RATE_GAP_S` starts the measure again)."""
        at = time.perf_counter()
        if self._last is not None and released and at - self._last[0] < RATE_GAP_S and self._last[1]:
            seen = self._last[1] / max(at - self._last[0], 1e-4)
            self._rate = seen if self._rate is None else 0.7 * self._rate + 0.3 * seen
        self._last = (at, released)

    def _weights(self, groups: set[str], now: int) -> dict[str, float]:
        """The groups' weights, read again at most every :data:`WEIGHT_TTL_MS` (a changed weight
        applies within a second; most passes read none)."""
        stale = sorted(g for g in groups if now - self._weight_read.get(g, (0.0, -WEIGHT_TTL_MS))[1] >= WEIGHT_TTL_MS)
        for g, w in self.store.group_weights(stale).items():
            self._weight_read[g] = (w, now)
        if len(self._weight_read) > GROUPS_KEPT:  # groups gone quiet: forget them
            self._weight_read = {g: v for g, v in self._weight_read.items() if now - v[1] < WEIGHT_TTL_MS}
        return {g: self._weight_read[g][0] for g in groups}

    def _room_shares(
        self, looked: Mapping[int, tuple[list[str], bool]], rooms: Mapping[str, GroupRoom | Exception], now: int
    ) -> tuple[dict[str, dict[int, int]], dict[str, int]]:
        """The room of each group with a limit, shared across the shards. A group with at most
        :data:`MAX_HEADS` free slots gives them to the earliest due line heads across the shards
        (how many each shard takes: one round trip for all such groups); one with more has a
        budget the shards draw on in turn. A group whose limit this forwarder has not seen yet
        (its items may carry it) gets one: its admission tells the limit for the next pass."""
        few: dict[str, int] = {}
        left: dict[str, int] = {}
        # a limit the store recorded from the items (slot_take.lua) is known to every forwarder
        known = {g for g, r in rooms.items() if g in self.hook.limits or (isinstance(r, GroupRoom) and r.limit)}
        for g, r in rooms.items():
            if not isinstance(r, GroupRoom):
                continue
            free = r.free if g in known else (1 if r.free is None else min(1, r.free))
            if free is not None:
                (few if free <= MAX_HEADS else left)[g] = free
        wanted = {g: [s for s, (found, _) in looked.items() if g in found] for g, free in few.items() if free}
        heads = self.store.line_heads(wanted, count=max(few.values(), default=0), now=now)
        shares: dict[str, dict[int, int]] = {g: {} for g in few}
        for g, found in heads.items():
            for _, shard in sorted(found)[: few[g]]:
                shares[g][shard] = shares[g].get(shard, 0) + 1
        #: the groups whose free slots the due heads take up: held until a look or a wake
        self._bound = {g for g in few if g in known and sum(shares[g].values()) >= few[g]}
        return shares, left

    def _allowance(
        self,
        shard: int,
        group: str,
        share: float,
        room: GroupRoom | Exception,
        quota: tuple[Mapping[str, Mapping[int, int]], dict[str, int]],
        now: int,
    ) -> tuple[str, int, int]:
        """(group, allowance, held-until) of ``group`` in ``shard``: its weighted share plus its
        deficit, within its room; held until the next look when the room is the bound."""
        if isinstance(room, Exception):  # fail closed: looked at again later
            log.error("group %r: cannot read its room (%s); its line waits", group, room)
            return group, 0, now + slots.MAX_RECHECK_MS
        stopped = room.stopped_until(now, slots.PAUSED_RECHECK_MS)
        if stopped is not None:  # paused or throttled: its lines wait, read by no claim
            return group, 0, stopped
        credit = self.deficits.get((shard, group), 0.0) + share
        self.deficits[shard, group] = credit
        allowance = int(credit)
        shares, left = quota
        if group in shares:
            cap = shares[group].get(shard, 0)
            if allowance >= cap:
                return group, cap, now + slots.RECHECK_MS if group in self._bound else 0
        elif group in left:
            if allowance >= left[group]:
                # the budget is spent by allowances, not releases (a short line takes less): its
                # room is read again at the next pass, and a full group is held there (few slots)
                allowance, left[group] = left[group], 0
                return group, allowance, 0
            left[group] -= allowance
        return group, allowance, 0

    def _apply(
        self,
        plan: Mapping[int, Sequence[tuple[str, int, int]]],
        results: Mapping[int, tuple[list[LineRelease], str] | Exception],
        now: int,
    ) -> dict[int, int]:
        """Carry the deficits, count what waits for room, and keep the shards whose lines may
        release again at once; the items each shard's lines released."""
        released: dict[int, int] = {}
        for shard, reply in results.items():
            if isinstance(reply, Exception):
                log.error("shard %d: cannot release its group lines (%s); they wait for the next pass", shard, reply)
                continue
            result, reset = reply
            if reset:
                log.error(
                    "shard %d: %s held another type (written by another tool): made to expire; the lines go on",
                    shard, reset,
                )  # fmt: skip
            again = bool(reset)
            for (group, _, held), done in zip(plan[shard], result):
                key = (shard, group)
                left = self.deficits.get(key, 0.0) - done.released
                if done.waiting == 0:
                    self.deficits.pop(key, None)  # an empty line keeps no credit (deficit round robin)
                else:
                    # an item is the unit: only the fraction of a share is carried, so a group
                    # held back by its room (or by a first item) banks no burst for later
                    self.deficits[key] = min(max(left, 0.0), 1.0)
                    if held:
                        self.stats.deferred += done.waiting
                # due items left and not held (the script's clock may be a ms past ``now``)
                again = again or (done.next_ms is not None and done.next_ms <= now) or (done.waiting > 0 and not held)
            if not again:
                self.due_lines.discard(shard)
            released[shard] = sum(done.released for done in result)
        return released


def _in_order(by_key: Mapping[str, _Asking]) -> list[Delivery]:
    """The deliveries of ``by_key``, each once, in the order they asked."""
    return list({i.delivery.id: i.delivery for a in by_key.values() for i in a.items}.values())


def _report_reset(key: str, grant: SlotGrant | GroupRoom) -> None:
    """Log what the slot script found out of place in group ``key``'s slot keys and dropped (whichever call
    met it first: a key of another type is gone a millisecond later), or reports that did not
    count: a key that would block, or run over its limit, says so here."""
    if grant.reset:
        log.warning(
            "slot %r: %s; dropped or refused (holds are the forwarders', reports count only with their hold's "
            "token: check what else writes the store's keys)",
            key,
            grant.reset,
        )
