"""How often a forwarder looks again at a group it could not release from (issue 31: the slot
keys are the groups' keys, see :mod:`.groups`)."""

from __future__ import annotations

import math

from ..models import SlotGrant

__all__ = [
    "FOLD_KEYS",
    "FOLD_MS",
    "MAX_RECHECK_MS",
    "PAUSED_RECHECK_MS",
    "RECHECK_MS",
    "asks_again_ms",
]

#: How soon a group at its limit is looked at again (its lines' ``gready``): a slot freed with
#: no end report (a hold that lapsed, a forwarder killed after its release) idles at most this
#: long; one given back with a report is taken within a pass (the groups' wake channel).
RECHECK_MS = 1_000
#: How soon a paused group is looked at again: a resume takes effect within this long.
PAUSED_RECHECK_MS = 1_000
#: How long a group whose keys cannot be read (an error reply) waits before it is tried again.
MAX_RECHECK_MS = 5_000
#: How often a forwarder reads the workers' reports of the groups it took slots of (when no item
#: of the group asks meanwhile): a slot given back shows as free this soon, and beats do not pile up.
FOLD_MS = 1_000
#: Groups one look reads at most (in one round trip), taking turns when more are held.
FOLD_KEYS = 500


def asks_again_ms(grant: SlotGrant, why: str, refused: int, now_ms: int) -> int:
    """When an item refused by its group (``why``; the ``refused``-th of its call) asks again:
    at its turn of the group's rate (the next token's time, then one a token apart), when its
    throttle ends, within a second of a resume (a paused group) or of a slot freed."""
    if why == "rate" and grant.rate_until is not None and grant.rate_per_s:
        return grant.rate_until + math.ceil(refused * 1000 / grant.rate_per_s)
    if why == "throttled" and grant.throttled_until is not None:
        return grant.throttled_until
    if why == "paused":
        return now_ms + PAUSED_RECHECK_MS
    return now_ms + RECHECK_MS  # at its limit: sooner on a wake (a slot given back)
