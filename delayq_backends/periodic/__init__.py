"""Periodic entries, for every kind (Celery, RQ): schedules, the entry state, the firing loop,
the registry and the runtime actions (add, update, pause, resume, run now, backfill, remove).

Nothing here imports Celery or RQ (an import-linter contract): each kind adds its run template
and its run maker (:class:`~delayq_backends.periodic.firing.RunMaker`) on top.
"""
