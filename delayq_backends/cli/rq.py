"""``delayq rq-migrate`` and ``rq-upgrade``: bring RQ's scheduled jobs, and jobs stored by
older versions, into the store. RQ is imported when they run, so ``delayq`` starts without it."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import click
import redis

from ..connection import connect, redact_url
from ..periodic.ops import START_SWEEP_SECONDS
from ..store import DelayStore
from ..storespec import StoreSpec
from .options import closing, open_store, rq_redis_option, store_options

if TYPE_CHECKING:  # RQ is imported when a command runs
    from ..rq.cron import CronConfig
    from ..rq.migrate import MigrationReport

__all__ = ["rq_cron", "rq_migrate", "rq_upgrade", "schedule_version_option", "show_migration", "sync_rq_cron"]


@click.command("rq-migrate")
@store_options
@rq_redis_option("Redis of the RQ queues (may equal --url).", required=True)
@click.option("--queue-class", default=None, help="Queue class the forwarder moves jobs with (module.Class).")
@click.option("--job-class", default=None, help="Job class, as given to `rq worker --job-class`.")
@click.option("--serializer", default=None, help="Serializer, as given to `rq worker --serializer`.")
@click.option("--dry-run", is_flag=True, help="Count what would move; change nothing.")
def rq_migrate(
    spec: StoreSpec,
    rq_redis: str,
    queue_class: str | None,
    job_class: str | None,
    serializer: str | None,
    dry_run: bool,
) -> None:
    """Move jobs waiting in RQ's rq:scheduled:* registries and rq-scheduler's set into the store.

    Stop `rq worker --with-scheduler` and `rqscheduler` first. Safe to run again: nothing is
    lost or duplicated.
    """
    from ..rq import migrate  # without RQ: one line naming the extra (MissingExtraError), no traceback

    import_attribute = importlib.import_module("rq.utils").import_attribute  # RQ is there from here on

    store = open_store(spec, writes=True)
    client = closing(connect(rq_redis))
    classes: dict[str, Any] = {
        name: import_attribute(path)
        for name, path in (("queue_class", queue_class), ("job_class", job_class), ("serializer", serializer))
        if path
    }
    report = migrate(cast(redis.Redis, client), store, dry_run=dry_run, **classes)
    show_migration(report, f"{redact_url(spec.url)} prefix {spec.prefix!r}", dry_run)


def show_migration(report: MigrationReport, into: str, dry_run: bool) -> None:
    """Print what ``delayq rq-migrate`` (or ``periodic import --from rq-scheduler``) moved, per source key."""
    verb = "would move" if dry_run else "moved"
    for key in sorted(set(report.moved) | set(report.missing)):
        click.echo(
            f"{key}: {verb} {report.moved.get(key, 0)}, already in the store {report.already.get(key, 0)}, "
            f"job gone {report.missing.get(key, 0)}"
        )
    click.echo(f"{verb} {report.total_moved} job(s) into {into}")


@click.command("rq-upgrade")
@store_options
@click.option("--rq-redis", metavar="URL", default=None, help="Redis of the RQ jobs. [default: --url]")
@click.option("--serializer", default=None, help="The jobs' serializer, as given to `rq worker --serializer`.")
@click.option(
    "--rq-allow-class",
    multiple=True,
    metavar="PREFIX",
    help="Let envelopes name job classes/serializers under this module prefix, as for `delayq forward`.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be upgraded; change nothing.")
def rq_upgrade(
    spec: StoreSpec, rq_redis: str | None, serializer: str | None, rq_allow_class: tuple[str, ...], dry_run: bool
) -> None:
    """Put the schedule of Scheduler jobs stored by delayq_backends 0.1 into their envelopes.

    Reads each such job's meta with its serializer (a pickle by default) in this process, so run
    it where you would run `rq worker`. Scheduled items and dead letters are rewritten in place;
    safe to run again. Then `delayq dlq requeue` the upgraded dead letters.
    Exit code 1 if some could not be upgraded.
    """
    from ..rq import ClassAllowlist, upgrade

    store = open_store(spec, writes=True)
    client = closing(connect(rq_redis or spec.url))
    report = upgrade(
        cast(redis.Redis, client), store, serializer=serializer,
        allow_classes=ClassAllowlist.configured(rq_allow_class), dry_run=dry_run,
    )  # fmt: skip
    verb = "would upgrade" if dry_run else "upgraded"
    for what, done in (("scheduled", report.upgraded), ("dead letter", report.upgraded_dead)):
        for item_id, schedule in done.items():
            click.echo(f"{verb} {what} {item_id}: schedule {json.dumps(schedule, sort_keys=True)}")
    for item_id in report.gone:
        click.echo(f"left {item_id}: its job hash is gone (the forwarder skips it)")
    for item_id in report.changed:
        click.echo(f"left {item_id}: it changed while being read (forwarded or scheduled again); run again")
    for item_id, why in report.failed:
        click.echo(f"FAILED {item_id}: {why}", err=True)
    requeue = f"; requeue these with `delayq dlq requeue {' '.join(report.upgraded_dead)}`"
    click.echo(
        f"{verb} {len(report.upgraded)} scheduled item(s) and {len(report.upgraded_dead)} dead letter(s) in "
        f"{redact_url(spec.url)} prefix {spec.prefix!r}" + (requeue if report.upgraded_dead else "")
    )
    if report.failed:
        raise click.exceptions.Exit(1)


def sync_rq_cron(store: DelayStore, config: CronConfig, version: int | None, *, at_start: bool = False) -> bool:
    """Sync a loaded ``rq cron`` config into ``store`` and say what changed; False when the sync
    was refused or an entry was (the others synced). ``at_start``: a forwarder's, whose sweep of
    the registry is bounded (:data:`~delayq_backends.periodic.ops.START_SWEEP_SECONDS`), the rest
    of it in the background, so junk in the registry cannot delay its forwarding."""
    from ..rq.cron import sync

    report = sync(store, config, version=version, sweep_seconds=START_SWEEP_SECONDS if at_start else None)
    click.echo(f"rq cron entries of {config.path}: {report.describe()}", err=True)
    for kind in ("added", "changed", "removed", "shadowed"):
        _listed([f"{kind}: {name}" for name in getattr(report, kind)], err=False)
    _listed([f"entry {name!r} refused: {error}" for name, error in sorted(report.errors.items())], err=True)
    if report.sweep:
        report.sweep.finish_in_background()
    return not (report.refused or report.errors)


#: Lines of one kind a sync prints at most (a registry full of junk: the counts say the rest).
MAX_LINES = 100


def _listed(lines: list[str], *, err: bool) -> None:
    for line in lines[:MAX_LINES]:
        click.echo(line, err=err)
    if len(lines) > MAX_LINES:
        click.echo(f"... and {len(lines) - MAX_LINES} more", err=err)


def schedule_version_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--schedule-version N`` (env ``DELAYQ_SCHEDULE_VERSION``): a number that grows per deploy."""
    return click.option(
        "--schedule-version",
        type=click.IntRange(min=0),
        default=None,
        envvar="DELAYQ_SCHEDULE_VERSION",
        help="This deploy's schedule version (a build number, a commit's Unix time): a sync older than the one "
        "synced last changes nothing. [default: unversioned, last sync wins]",
    )(command)


@click.group("rq-cron")
def rq_cron() -> None:
    """A `rq cron` config (rq.cron.register calls) run by the forwarders: no `rq cron` process."""


@rq_cron.command("sync")
@store_options
@schedule_version_option
@click.argument("config")
def rq_cron_sync(spec: StoreSpec, schedule_version: int | None, config: str) -> None:
    """Make the store's RQ code entries those of CONFIG (a module path or a .py file, as `rq cron`
    takes it): added, changed, removed by name. Runtime entries are never touched.

    `delayq forward --rq-redis … --rq-cron CONFIG` does this at start. Exits 1 if the sync or an
    entry was refused.
    """
    from ..rq.cron import load_config

    loaded = load_config(config)
    if not sync_rq_cron(open_store(spec, writes=True), loaded, schedule_version):
        raise SystemExit(1)
