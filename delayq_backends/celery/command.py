"""``celery -A proj delayq …``: the forwarder, periodic entries and stats of an app, configured by its settings.

Registered through Celery's ``celery.commands`` entry point, so the app's ``broker_url``,
broker SSL and transport options and ``delayq_*`` settings are used as the app has them.
"""

from __future__ import annotations

from dataclasses import replace

import click
from celery import Celery

from ..cli import ErrorsAsMessages, ForwardOptions, forward_options, show_periodic, stats
from ..connection import connect, redact_url
from ..store import DelayStore
from .periodic import PeriodicTarget, SyncReport, remove, sync
from .settings import CelerySettings
from .target import CeleryTarget

__all__ = ["delayq"]


@click.group(name="delayq", cls=ErrorsAsMessages)
def delayq() -> None:
    """delayq: the app's delayed tasks wait in the delay store until they are due."""


@delayq.command()
@forward_options
@click.option(
    "--periodic-sync/--no-periodic-sync",
    default=True,
    show_default=True,
    help="Sync the app's beat_schedule into the store before forwarding (periodic tasks without celery beat).",
)
@click.pass_context
def forward(ctx: click.Context, run: ForwardOptions, periodic_sync: bool) -> None:
    """Forward the app's due tasks (and fire its periodic entries) until SIGTERM/SIGINT (then exit 0)."""
    app = ctx.find_root().obj.app
    settings = CelerySettings.of(app)
    config = replace(settings.config, **run.store_settings())
    store = DelayStore(connect(config.url), config)
    ctx.call_on_close(store.client.close)
    if periodic_sync:
        _sync_at_start(app, store)
    target = CeleryTarget.from_app(app)
    ctx.call_on_close(target.close)
    run = replace(run, flow=settings.flow.merged(run.flow))  # the options win for the queues they name
    run.run(store, [target, PeriodicTarget(target)], [f"celery (and periodic entries) -> {target.describe()}"])


def _sync_at_start(app: Celery, store: DelayStore) -> None:
    """Sync the periodic entries; a failure is said, never fatal: forwarding is what matters,
    and the entries already stored keep firing as last synced."""
    try:
        report = sync(app, store)
    except Exception as exc:
        click.echo(
            f"periodic entries NOT synced ({type(exc).__name__}: {exc}); those already stored keep running as last "
            "synced: run `celery -A <app> delayq periodic sync` once the store answers",
            err=True,
        )
        return
    _say_synced(report)


def _say_synced(report: SyncReport) -> None:
    if report.added or report.changed or report.removed or report.errors or report.unchanged:
        click.echo(f"periodic entries synced: {report.describe()}", err=True)
    for name, error in sorted(report.errors.items()):
        click.echo(f"periodic entry {name!r} refused: {error}", err=True)


def _store(ctx: click.Context) -> DelayStore:
    config = CelerySettings.of(ctx.find_root().obj.app).config
    store = DelayStore(connect(config.url), config)
    ctx.call_on_close(store.client.close)
    return store


@delayq.group()
def periodic() -> None:
    """The app's beat_schedule, fired by the forwarders: no celery beat process."""


@periodic.command("sync")
@click.pass_context
def periodic_sync_(ctx: click.Context) -> None:
    """Make the store's periodic entries the app's beat_schedule (added, changed, removed).

    `celery -A proj delayq forward` does this at start. Exits 1 if an entry was refused.
    """
    report = sync(ctx.find_root().obj.app, _store(ctx))
    _say_synced(report)
    for kind in ("added", "changed", "removed"):
        for name in getattr(report, kind):
            click.echo(f"{kind}: {name}")
    if report.errors:
        ctx.exit(1)


@periodic.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
@click.pass_context
def periodic_list(ctx: click.Context, as_json: bool) -> None:
    """Every periodic entry in the store: schedule, misfire policy, last run, next run."""
    show_periodic(_store(ctx), as_json)


@periodic.command("remove")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def periodic_remove(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Remove periodic entries by name (a sync adds them back while the config has them)."""
    removed = remove(_store(ctx), names)
    for name in names:
        click.echo(f"{'removed' if name in removed else 'not found'}: {name}")


@delayq.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
@click.pass_context
def stats_(ctx: click.Context, as_json: bool) -> None:
    """Counts per shard of the app's delay store."""
    config = CelerySettings.of(ctx.find_root().obj.app).config
    click.echo(f"delay store {redact_url(config.url)}", err=True)
    ctx.invoke(stats, url=config.url, prefix=config.prefix, shards=config.shards, as_json=as_json)
