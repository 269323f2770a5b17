"""The ``delayq`` command line: run a forwarder, inspect and repair a delay store, run the demo.

Every command that opens a store takes ``--url``, ``--prefix`` and ``--shards`` (or
``DELAYQ_URL``, ``DELAYQ_PREFIX``, ``DELAYQ_SHARDS``). delayq errors end as one line on stderr
with exit code 1, never as a traceback, and URLs are printed with their password hidden.

A thin layer: each module parses options and prints; the work is the library's. No library
module imports this package. ``celery -A proj delayq`` lives in :mod:`.celery`.
"""

from __future__ import annotations

import click

from .. import __version__
from .admin import acl, functions_group
from .batches import batches
from .capacity import capacity
from .dashboard import dashboard
from .demo import demo
from .dlq import dlq
from .exporter import exporter
from .forward import forward
from .groups import groups
from .inspect import cancel, list_, stats, why
from .options import ErrorsAsMessages
from .periodic import periodic
from .rq import rq_cron, rq_migrate, rq_upgrade
from .slots import slots
from .spark import spark

__all__ = ["main"]


@click.group(cls=ErrorsAsMessages)
@click.version_option(__version__, prog_name="delayq")
def main() -> None:
    """delayq: delayed Celery/RQ jobs in sharded Redis sorted sets, forwarded at their time."""


COMMANDS = (
    forward,
    periodic,
    stats,
    list_,
    why,
    cancel,
    dlq,
    groups,
    slots,
    batches,
    rq_migrate,
    rq_upgrade,
    rq_cron,
    acl,
    functions_group,
    demo,
    capacity,
)
for command in COMMANDS:
    main.add_command(command)
main.add_command(spark, "spark")
main.add_command(exporter, "exporter")
main.add_command(dashboard, "dashboard")
