"""``delayq periodic import --from SOURCE``: move in from another scheduler with one command.

Sources: ``redbeat`` (celery-redbeat's keys, ``--redbeat-redis``), ``django-celery-beat`` (its
tables: ``--database sqlite:///path``, or the Django ORM with ``DJANGO_SETTINGS_MODULE``),
``rq-scheduler`` (what ``delayq rq-migrate`` moves: rq-scheduler's and RQ's scheduled jobs,
repeating ones included) and ``rq-cron`` (an ``rq cron`` config, synced as ``delayq rq-cron
sync`` and ``delayq forward --rq-cron`` do). ``--dry-run`` prints the diff and writes nothing;
an import run again changes nothing. The readers are :mod:`delayq_backends.celery.imports` and
:mod:`delayq_backends.rq.cron`, the diff :mod:`delayq_backends.periodic.imports`.
"""

from __future__ import annotations

import os
from typing import Any, cast

import click
import redis

from ..connection import connect
from ..kinds import adapter
from ..periodic.imports import ImportReport, import_entries, preview_sync, synced
from ..store import DelayStore
from .options import PeriodicAccess, closing, json_option, secret_option
from .output import echo_json
from .rq import schedule_version_option, show_migration

__all__ = ["SOURCES", "import_command"]

#: where ``--from`` may import from
SOURCES = ("redbeat", "django-celery-beat", "rq-scheduler", "rq-cron")


def import_command(group: click.Group, access: PeriodicAccess) -> None:
    """Add ``import`` to a periodic command group (``delayq periodic``, ``celery -A proj delayq periodic``)."""

    @group.command("import")
    @click.option("--from", "source", type=click.Choice(SOURCES), required=True, help="The scheduler to move from.")
    @secret_option(
        "redbeat-redis",
        envvar="DELAYQ_REDBEAT_REDIS",
        help="redbeat: the Redis its entries are in (its redbeat_redis_url, by default the app's broker).",
    )
    @click.option(
        "--redbeat-prefix", default="redbeat:", show_default=True, help="redbeat: its redbeat_key_prefix setting."
    )
    @click.option(
        "--database",
        default=None,
        metavar="URL",
        help="django-celery-beat: its SQLite database, sqlite:///path. Without it the tables are read through the "
        "Django ORM, with the settings DJANGO_SETTINGS_MODULE names (any database Django reaches).",
    )
    @click.option(
        "--tz",
        default=None,
        help="The time zone of crontabs that name none (redbeat's: the old app's timezone setting). "
        "[default: this app's]",
    )
    @click.option("--config", default=None, help="rq-cron: the config, a module path or a .py file (as `rq cron`).")
    @schedule_version_option
    @click.option(
        "--dry-run", is_flag=True, help="Print what would be added, changed, left and refused; write nothing."
    )
    @json_option
    @access.options
    @click.pass_context
    def import_(
        ctx: click.Context,
        /,
        source: str,
        redbeat_redis: str | None,
        redbeat_prefix: str,
        database: str | None,
        tz: str | None,
        config: str | None,
        schedule_version: int | None,
        dry_run: bool,
        as_json: bool,
        **where: Any,
    ) -> None:
        """Import the entries of another scheduler as periodic entries, each with its enabled flag,
        last run and run count, start, end and one-off times, time zone and options.

        Stop the old scheduler first (docs/migrating.md says how, and how to go back). Entries it
        cannot express (solar schedules) are refused by name, the others imported. Safe to run
        again: what is already here is left unchanged. Exit 1 if an entry was refused.
        """
        store = access.store(ctx, where)
        if source == "rq-scheduler":
            if as_json:
                raise click.UsageError("--json: rq-scheduler's jobs are reported per source key, as rq-migrate does")
            _rq_scheduler(access, ctx, where, store, dry_run)
            return
        if source == "rq-cron":
            report = _rq_cron(store, config, schedule_version, dry_run)
        else:
            reader = adapter("celery.imports")
            if source == "redbeat":
                if not redbeat_redis:
                    raise click.UsageError(
                        "--from redbeat needs --redbeat-redis URL: the Redis redbeat keeps its keys in"
                    )
                client = closing(connect(redbeat_redis))
                read = reader.read_redbeat(cast(redis.Redis, client), redbeat_prefix)
            elif database is not None:
                read = reader.read_django_sqlite(database)
            elif os.environ.get("DJANGO_SETTINGS_MODULE"):
                read = reader.read_django_orm()
            else:
                raise click.UsageError(
                    "--from django-celery-beat reads the Django ORM with DJANGO_SETTINGS_MODULE set, or an SQLite "
                    "database given as --database sqlite:///path"
                )
            specs, refused = reader.specs_of(access.app(ctx, where), read, zone=tz)
            report = import_entries(store, specs, refused, source=source, dry_run=dry_run)
        _show(report, as_json)
        if report.refused:
            raise SystemExit(1)


def _show(report: ImportReport, as_json: bool) -> None:
    if as_json:
        echo_json(report.to_json())
        return
    for line in report.lines():
        click.echo(line)
    click.echo(report.describe())


def _rq_scheduler(
    access: PeriodicAccess, ctx: click.Context, where: dict[str, Any], store: DelayStore, dry_run: bool
) -> None:
    """What ``delayq rq-migrate`` does, with RQ's default classes (rq-migrate takes others)."""
    if access.rq is None:
        raise click.UsageError("--from rq-scheduler: run `delayq periodic import --rq-redis URL ...`")
    migrate = adapter("rq").migrate
    report = migrate(access.rq(ctx, where, store), store, dry_run=dry_run)
    show_migration(report, f"prefix {store.config.prefix!r}", dry_run)


def _rq_cron(store: DelayStore, config: str | None, version: int | None, dry_run: bool) -> ImportReport:
    """An ``rq cron`` config synced as code entries (the config stays the truth), or its diff."""
    if config is None:
        raise click.UsageError("--from rq-cron needs --config CONFIG (a module path or a .py file, as `rq cron`)")
    cron = adapter("rq.cron")
    loaded = cron.load_config(config)
    source = f"rq cron config {loaded.path}"
    if dry_run:
        specs, errors = cron.code_entries(loaded)
        return preview_sync(store, specs, errors, kind=adapter("rq.entries").KIND, source=source)
    done = cron.sync(store, loaded, version=version)
    if done.refused:
        raise click.ClickException(f"nothing synced: {done.refused}")
    return synced(done, source=source)
