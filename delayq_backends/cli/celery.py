"""``celery -A proj delayq …``: the forwarder, periodic entries, stats, revoke and the waiting
tasks of an app, configured by its settings.

Registered through Celery's ``celery.commands`` entry point, so the app's ``broker_url``,
broker SSL and transport options and ``delayq_*`` settings are used as the app has them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from itertools import islice
from typing import Any

import click
from celery import Celery
from kombu.utils.json import dumps as kombu_json_dumps

from ..assemble import DescribedTarget, ProcessSettings
from ..celery.periodic import PeriodicTarget, sync, task_view
from ..celery.scheduled import get as get_scheduled
from ..celery.scheduled import revoke_everywhere
from ..celery.settings import CelerySettings, store_for
from ..celery.target import CeleryTarget
from ..connection import connect, redact_url
from ..entries import iso
from ..envelope import Envelope
from ..errors import EnvelopeError
from ..models import ScheduledItem
from ..periodic.ops import START_SWEEP_SECONDS, SyncReport
from ..store import DelayStore
from ..storespec import open_store
from .forward import ForwardOptions, forward_options, run_forwarder
from .inspect import stats, why
from .options import ErrorsAsMessages, closing, page_options
from .output import Column, print_table
from .periodic import PeriodicAccess, periodic_commands

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
    app_settings = CelerySettings.of(app)
    # the options win over the app's settings (for flow control: for the queues they name); the
    # app's broker is the one target
    settings = run.settings(ProcessSettings(app_settings.config, app_settings.forwarder, list_target=False))
    store = open_store(settings.store, writes=True)
    closing(store.client)
    if periodic_sync:
        _sync_at_start(app, store)
    target = CeleryTarget.from_app(app)
    ctx.call_on_close(target.close)
    where = f"celery (and periodic entries) -> {target.describe()}"
    targets = [DescribedTarget(target, where), DescribedTarget(PeriodicTarget(target, app=app), "")]
    run_forwarder(settings, store=store, targets=targets)


def _sync_at_start(app: Celery, store: DelayStore) -> None:
    """Sync the periodic entries; a failure is said, never fatal: forwarding is what matters,
    and the entries already stored keep firing as last synced."""
    try:
        report = sync(app, store, sweep_seconds=START_SWEEP_SECONDS)
    except Exception as exc:
        click.echo(
            f"periodic entries NOT synced ({type(exc).__name__}: {exc}); those already stored keep running as last "
            "synced: run `celery -A <app> delayq periodic sync` once the store answers",
            err=True,
        )
        return
    _say_synced(report)
    if report.sweep:
        report.sweep.finish_in_background()


def _say_synced(report: SyncReport) -> None:
    if report.refused:
        click.echo(f"periodic entries NOT synced: {report.refused}", err=True)
    elif any(getattr(report, k) for k in ("added", "changed", "removed", "errors", "unchanged", "kept", "sweep")):
        click.echo(f"periodic entries synced: {report.describe()}", err=True)
    for name in report.shadowed:
        click.echo(f"periodic entry {name!r} of beat_schedule is shadowed by a runtime entry of that name", err=True)
    for name, error in sorted(report.errors.items()):
        click.echo(f"periodic entry {name!r} refused: {error}", err=True)


def _store(ctx: click.Context) -> DelayStore:
    config = CelerySettings.of(ctx.find_root().obj.app).config
    store = DelayStore(closing(connect(config.url)), config)
    return store


@delayq.group()
def periodic() -> None:
    """The app's periodic entries (its beat_schedule and those added at runtime), fired by the
    forwarders: no celery beat process."""


@periodic.command("sync")
@click.option(
    "--schedule-version",
    type=click.IntRange(0, 2**53),
    default=None,
    help="This deploy's schedule version (default: the app's delayq_schedule_version); an older one changes nothing.",
)
@click.pass_context
def periodic_sync_(ctx: click.Context, schedule_version: int | None) -> None:
    """Make the store's code entries the app's beat_schedule (added, changed, removed); runtime
    entries are left alone.

    `celery -A proj delayq forward` does this at start. Exits 1 if an entry was refused, or the
    whole sync (an older schedule version).
    """
    report = sync(ctx.find_root().obj.app, _store(ctx), version=schedule_version)
    _say_synced(report)
    for kind in ("added", "changed", "removed"):
        for name in getattr(report, kind):
            click.echo(f"{kind}: {name}")
    if report.errors or report.refused:
        ctx.exit(1)


def _app_options(command: Callable[..., None]) -> Callable[..., None]:
    return command


periodic_commands(
    periodic,
    PeriodicAccess(_app_options, lambda ctx, _where: _store(ctx), lambda ctx, _where: ctx.find_root().obj.app),
)


@delayq.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
@click.pass_context
def stats_(ctx: click.Context, as_json: bool) -> None:
    """Counts per shard of the app's delay store."""
    config = CelerySettings.of(ctx.find_root().obj.app).config
    click.echo(f"delay store {redact_url(config.url)}", err=True)
    ctx.invoke(stats, url=config.url, prefix=config.prefix, shards=config.shards, as_json=as_json)


@delayq.command("why")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of one line (for scripts).")
@click.pass_context
def why_(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Why a task is where it is, in one line (``delayq why``): not due until T, leased by a
    forwarder, waiting for its group, held by flow control, dead; exits 1 if the store knows
    no such id."""
    config = CelerySettings.of(ctx.find_root().obj.app).config
    ctx.invoke(why, url=config.url, prefix=config.prefix, shards=config.shards, item_id=task_id, as_json=as_json)


@delayq.command("revoke")
@click.argument("task_ids", nargs=-1, required=True)
@click.option("--terminate", is_flag=True, help="Also terminate the task if a worker is running it.")
@click.option("--signal", default=None, help="Signal for --terminate (default TERM).")
@click.pass_context
def revoke_(ctx: click.Context, task_ids: tuple[str, ...], terminate: bool, signal: str | None) -> None:
    """Revoke tasks everywhere: the broadcast to workers first, then the delay store.

    Use this rather than ``celery control revoke``, which only broadcasts: a task still waiting
    in the store would be forwarded later and run on a worker started after the broadcast.
    Prints one line per id; exits 1 if the store could not be reached for any of them.
    """
    app = ctx.find_root().obj.app
    options: dict[str, Any] = {"terminate": terminate} | ({"signal": signal} if signal else {})
    report = revoke_everywhere(app, task_ids, **options)
    if report.broadcast_error is not None:
        click.echo(f"the broadcast failed: {report.broadcast_error}; workers were not told", err=True)
    for one in report.store:
        click.echo(one.describe())
    if report.broadcast_error is not None or report.store_failures:
        ctx.exit(1)


@delayq.command("list")
@page_options
@click.option(
    "--task", "task_name", default=None, help="Only tasks of this name (--offset/--limit count those; reads the store)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
@click.pass_context
def list_(ctx: click.Context, offset: int, limit: int, task_name: str | None, as_json: bool) -> None:
    """Tasks waiting in the store, earliest first: name, args, kwargs, eta, queue, priority.

    Arguments are decoded from JSON bodies only; other serializers show Celery's argsrepr.
    """
    store = store_for(ctx.find_root().obj.app)
    if task_name is None:
        items = store.scheduled(offset=offset, count=limit)
        rows, more = [row for row in map(_task_row, items) if row is not None], len(items) == limit
    else:  # one more than the page says whether more follow
        named = (row for row in _all_task_rows(store) if row["task"] == task_name)
        rows = list(islice(named, offset, offset + limit + 1))
        rows, more = rows[:limit], len(rows) > limit
    if as_json:
        click.echo(json.dumps(json.loads(kombu_json_dumps(rows)), indent=2, ensure_ascii=False))
        return
    title = f"waiting tasks {offset + 1}-{offset + limit}" if rows else "no waiting tasks here"
    print_table(title, _COLUMNS, (_cells(row) for row in rows))
    if more:
        click.echo(f"more may follow: --offset {offset + limit}", err=True)


@delayq.command("get")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text (for scripts).")
@click.pass_context
def get_(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """One waiting task in full; exits 1 if it is not waiting in the store."""
    item = get_scheduled(ctx.find_root().obj.app, task_id)
    row = None if item is None else _task_row(item)
    if row is None:
        raise click.ClickException(f"task {task_id} is not waiting in the delay store (forwarded, revoked or unknown)")
    if as_json:
        click.echo(json.dumps(json.loads(kombu_json_dumps(row)), indent=2, ensure_ascii=False))
        return
    for key, value in row.items():
        if value is not None:
            click.echo(f"{key:>12}: {value}")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_COLUMNS = [Column("id"), Column("task"), Column("ready"), Column("queue"), Column("priority", "right"), Column("args")]


def _all_task_rows(store: DelayStore, page: int = 1000) -> Iterator[dict[str, Any]]:
    """Every waiting Celery task, earliest first, read a page at a time. Each page starts at
    the last one's score (past the ids already read there), so a page costs the same however
    deep it lies."""
    score, at_score = None, 0
    while True:
        start = None if score is None else _EPOCH + timedelta(milliseconds=score)
        items = store.scheduled(start=start, offset=at_score, count=page)
        for item in items:
            item_score = item.leased_until_ms if item.leased_until_ms is not None else item.ready_ms
            score, at_score = item_score, at_score + 1 if item_score == score else 1
            row = _task_row(item)
            if row is not None:
                yield row
        if len(items) < page:
            return


def _task_row(item: ScheduledItem) -> dict[str, Any] | None:
    """A waiting Celery task (or periodic entry, as its next run) as JSON-ready values; None for an
    item of another kind."""
    row: dict[str, Any] = {"id": item.id, "ready": iso(item.ready_ms), "attempts": item.attempts}
    try:
        view = task_view(Envelope.decode(item.envelope))
        if view is None:
            return None
        row.update(view.as_dict(), id=item.id)
    except EnvelopeError as exc:
        row.update(task=None, note=f"cannot be read: {exc}")
    return row


def _cells(row: dict[str, Any]) -> list[Any]:
    args = row.get("argsrepr") if row.get("args") is None else row["args"]
    kwargs = row.get("kwargsrepr") if row.get("kwargs") is None else row["kwargs"]
    shown = f"{args} {kwargs}" if row.get("note") is None else f"{args} {kwargs} ({row['note']})"
    return [row["id"], row.get("task"), row["ready"], row.get("queue"), row.get("priority"), shown]
