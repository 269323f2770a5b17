"""The Lua scripts: one ``.lua`` file each, loaded and run by :mod:`.library`, called through
one typed object each (:mod:`.store` for the store's, :mod:`.rq` for the RQ target's).

Each script receives only the keys it touches; its helpers in ``includes/`` take those keys as
parameters.
"""

from __future__ import annotations

from . import library
from .library import *  # noqa: F403  (the loader's names: LIBRARY, ScriptRunner, install_functions, ...)
from .rq import RqEnqueue, RqFail, RqFailed, RqFields, RqJobWrites, RqMove, RqMoved, RqNewJob, RqRun, RqSchedule

__all__ = [
    *library.__all__,
    "RqEnqueue",
    "RqFail",
    "RqFailed",
    "RqFields",
    "RqJobWrites",
    "RqMove",
    "RqMoved",
    "RqNewJob",
    "RqRun",
    "RqSchedule",
]
