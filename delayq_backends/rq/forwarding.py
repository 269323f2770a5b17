"""The RQ adapter's targets for ``delayq forward --rq-redis``: the ``targets`` of its row in
:mod:`delayq_backends.kinds`, built by :func:`delayq_backends.assemble.build_forwarder`."""

from __future__ import annotations

from contextlib import ExitStack

from ..assemble import DescribedTarget, ProcessSettings
from ..connection import connect_rq, redact_url
from ..store import DelayStore
from .adopt import RegistryAdopter
from .allowlist import NOT_ALLOWED_WAIT_S, ClassAllowlist
from .entries import RQPeriodicTarget, RQRunTarget
from .target import RQTarget

__all__ = ["targets"]


def targets(settings: ProcessSettings, store: DelayStore, resources: ExitStack) -> list[DescribedTarget]:
    """The RQ target of ``settings.rq_redis``, the targets of RQ periodic entries and their runs
    (and those an overlap policy buffers), and the adopter of jobs a plain ``rq.Queue`` wrote."""
    url = str(settings.rq_redis)  # set: it turned this row on
    connection = connect_rq(url, store)
    if connection is not store.client:
        resources.callback(connection.close)
    allow = ClassAllowlist.configured(settings.rq_allow_classes)
    retry = settings.rq_class_retry or NOT_ALLOWED_WAIT_S
    runs = RQRunTarget(connection)
    built = [
        DescribedTarget(RQTarget(connection, allow_classes=allow, class_retry=retry), f"rq -> {redact_url(url)}"),
        DescribedTarget(runs, ""),
        DescribedTarget(RQPeriodicTarget(runs), ""),
    ]
    if settings.rq_adopt:
        resources.callback(RegistryAdopter(connection, store).start().close)
    return built
