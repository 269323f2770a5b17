"""Celery adapter: delayed tasks wait in the delay store, not in worker RAM.

Enable with one line, next to where the app is made::

    from delayq_backends.celery import install
    install(app)          # or: Celery(..., amqp="delayq_backends.celery:AMQP")

Then run ``delayq forward --celery-broker <broker URL>`` (or ``celery -A proj delayq forward``)
beside the workers. See the README's Celery section for the settings.
"""

from __future__ import annotations

from ..errors import MissingExtraError

try:
    from celery import Celery
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(f"delayq_backends.celery needs Celery ({exc})", "celery") from exc

from .amqp import AMQP, Control, StoreUnavailableError, use_plugin_control
from .batches import BATCH_HEADER, Batch, use_batches
from .dedupe import DedupeTask, use_dedupe
from .history import use_history
from .message import StoredMessage, TaskView
from .scheduled import RevokeReport, StoreRevoke, get, reschedule, revoke, revoke_everywhere
from .settings import CelerySettings, DuplicateTaskIdError, forget_store, store_for
from .slots import GROUP_HEADER, SLOT_HEADER, throttle, use_slots
from .target import CeleryTarget
from .watch import use_watch

__all__ = [
    "AMQP",
    "BATCH_HEADER",
    "Batch",
    "CelerySettings",
    "CeleryTarget",
    "Control",
    "DedupeTask",
    "DuplicateTaskIdError",
    "GROUP_HEADER",
    "RevokeReport",
    "SLOT_HEADER",
    "StoreRevoke",
    "StoreUnavailableError",
    "StoredMessage",
    "TaskView",
    "forget_store",
    "get",
    "install",
    "reschedule",
    "revoke",
    "revoke_everywhere",
    "store_for",
    "throttle",
]


def install(app: Celery) -> None:
    """Send the app's delayed tasks to the delay store and let revoke reach them there.

    Call it where the app is created, so producers, beat and workers (for ``Task.retry``
    with a countdown) all load it. Settings are read at the first delayed publish, except
    ``delayq_dedupe``: set it before this call (see :mod:`delayq_backends.celery.dedupe`).
    """
    app.amqp_cls = f"{AMQP.__module__}:{AMQP.__qualname__}"
    if not isinstance(app.__dict__.get("amqp"), AMQP):
        app.__dict__.pop("amqp", None)  # a cached_property: the next access builds ours
    use_plugin_control(app)
    use_dedupe(app)
    use_slots(app)
    use_batches(app)
    use_watch(app)
    use_history(app)
