"""``celery -A proj delayq …``: the forwarder and stats of an app, configured by its settings.

Registered through Celery's ``celery.commands`` entry point, so the app's ``broker_url``,
broker SSL and transport options and ``delayq_*`` settings are used as the app has them.
"""

from __future__ import annotations

from dataclasses import replace

import click

from ..cli import ErrorsAsMessages, ForwardOptions, forward_options, stats
from ..connection import connect, redact_url
from ..store import DelayStore
from .settings import CelerySettings
from .target import CeleryTarget

__all__ = ["delayq"]


@click.group(name="delayq", cls=ErrorsAsMessages)
def delayq() -> None:
    """delayq: the app's delayed tasks wait in the delay store until they are due."""


@delayq.command()
@forward_options
@click.pass_context
def forward(ctx: click.Context, run: ForwardOptions) -> None:
    """Forward the app's due tasks to its broker until SIGTERM/SIGINT (then exit 0)."""
    app = ctx.find_root().obj.app
    settings = CelerySettings.of(app)
    config = replace(settings.config, **run.store_settings())
    store = DelayStore(connect(config.url), config)
    ctx.call_on_close(store.client.close)
    target = CeleryTarget.from_app(app)
    ctx.call_on_close(target.close)
    run = replace(run, flow=settings.flow.merged(run.flow))  # the options win for the queues they name
    run.run(store, [target], [f"celery -> {target.describe()}"])


@delayq.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
@click.pass_context
def stats_(ctx: click.Context, as_json: bool) -> None:
    """Counts per shard of the app's delay store."""
    config = CelerySettings.of(ctx.find_root().obj.app).config
    click.echo(f"delay store {redact_url(config.url)}", err=True)
    ctx.invoke(stats, url=config.url, prefix=config.prefix, shards=config.shards, as_json=as_json)
