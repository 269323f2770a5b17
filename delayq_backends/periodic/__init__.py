"""Periodic entries, for every kind (Celery, RQ): their definitions, schedules and state, the
runtime actions (add, update, pause, resume, run now, backfill, remove), the listing, the sync
from code and the run history. The names below are the public ones; the modules:

- :mod:`.spec` (what an entry is), :mod:`.schedules` (when it runs), :mod:`.state` (its stored state);
- :mod:`.ops` (the actions and the listing), :mod:`.writes` (each change's compare-and-set),
  :mod:`.sync` (sync from code), :mod:`.registry` (the list of entries, the code schedule's version);
- :mod:`.firing` (the forwarder's firing), :mod:`.history` and :mod:`.gauges` (runs and alerts),
  :mod:`.trust` (an operator's definitions of the entries that carry code), :mod:`.imports`.

Nothing here imports Celery or RQ (an import-linter contract): each kind adds its run template
and its run maker (:class:`~delayq_backends.periodic.firing.RunMaker`) on top.
"""

from __future__ import annotations

from .history import EntryHistory, RunRecord, entry_history, read_history
from .ops import (
    EntryStatus,
    backfill,
    entry,
    get,
    pause,
    preview,
    remove,
    resume,
    run_now,
    status_page,
    statuses,
    trust_stored,
    upsert,
)
from .registry import CodeEntryError, EntryNotFound, PeriodicError, StaleScheduleError
from .schedules import Cron, Every, Misfire, Once, Schedule, interval
from .spec import EntryDefinition, EntrySpec, RunTemplate, item_id
from .sync import SyncReport, sync_code

__all__ = [
    "CodeEntryError",
    "Cron",
    "EntryDefinition",
    "EntryHistory",
    "EntryNotFound",
    "EntrySpec",
    "EntryStatus",
    "Every",
    "Misfire",
    "Once",
    "PeriodicError",
    "RunRecord",
    "RunTemplate",
    "Schedule",
    "StaleScheduleError",
    "SyncReport",
    "backfill",
    "entry",
    "entry_history",
    "get",
    "interval",
    "item_id",
    "pause",
    "preview",
    "read_history",
    "remove",
    "resume",
    "run_now",
    "status_page",
    "statuses",
    "sync_code",
    "trust_stored",
    "upsert",
]
