"""The Celery adapter's targets for ``delayq forward --celery-broker``: the ``targets`` of its row
in :mod:`delayq_backends.kinds`, built by :func:`delayq_backends.assemble.build_forwarder`."""

from __future__ import annotations

from contextlib import ExitStack

from ..assemble import DescribedTarget, ProcessSettings
from ..connection import redact_url
from ..store import DelayStore
from .periodic import PeriodicTarget
from .target import CeleryTarget

__all__ = ["targets"]


def targets(settings: ProcessSettings, store: DelayStore, resources: ExitStack) -> list[DescribedTarget]:
    """The Celery target of ``settings.celery_broker``, and the periodic entries' target that
    publishes their runs through it."""
    url = str(settings.celery_broker)  # set: it turned this row on
    target = CeleryTarget.from_url(url)
    resources.callback(target.close)
    where = f"celery (and periodic entries) -> {redact_url(url)}"
    return [DescribedTarget(target, where), DescribedTarget(PeriodicTarget(target), "")]
