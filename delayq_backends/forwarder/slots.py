"""How often a forwarder looks again at a group it could not release from (issue 31: the slot
keys are the groups' keys, see :mod:`.groups`)."""

from __future__ import annotations

__all__ = ["FOLD_KEYS", "FOLD_MS", "MAX_RECHECK_MS", "RECHECK_MS", "RUN_RECHECK_MS"]

#: How soon a group at its limit is looked at again (its lines' ``gready``): a slot freed with
#: no end report (a hold that lapsed, a forwarder killed after its release) idles at most this
#: long; one given back with a report is taken within a pass (the groups' wake channel).
RECHECK_MS = 1_000
#: How soon a periodic run that waits for its entry's slot (an RQ entry's overlap "buffer") asks again.
RUN_RECHECK_MS = 200
#: How long a group whose keys cannot be read (an error reply) waits before it is tried again.
MAX_RECHECK_MS = 5_000
#: How often a forwarder reads the workers' reports of the groups it took slots of (when no item
#: of the group asks meanwhile): a slot given back shows as free this soon, and beats do not pile up.
FOLD_MS = 1_000
#: Groups one look reads at most (in one round trip), taking turns when more are held.
FOLD_KEYS = 500
