"""``delayq batches``: batches of sub-jobs, their progress and completion."""

from __future__ import annotations

import click

from ..errors import BatchError
from ..models import BatchStatus
from ..storespec import StoreSpec
from ..timeutil import from_ms
from .options import json_option, open_store, store_options
from .output import Column, echo_json, print_table

__all__ = ["batches"]

COLUMNS = [
    Column("key"),
    Column("total", "right"),
    Column("done", "right"),
    Column("failed", "right"),
    Column("closed"),
    Column("completed"),
]


@click.group(invoke_without_command=True)
@click.pass_context
def batches(ctx: click.Context) -> None:
    """Batches: sub-jobs of one request, and one on_complete once all have finished
    (``delayq batches list``, ``show KEY``)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _row(key: str, status: BatchStatus | None | BatchError) -> list[object]:
    if isinstance(status, BatchError):
        return [key, None, None, None, "garbage: see `delayq batches show`", None]
    if status is None:  # expired between the scan and the read
        return [key, None, None, None, None, None]
    return [key, status.total, status.done, status.failed, _yes(status.closed), _yes(status.completed)]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


@batches.command("list")
@store_options
@json_option
def batches_list(spec: StoreSpec, as_json: bool) -> None:
    """Every batch (open, or completed less than its TTL ago): sub-jobs added, finished and failed,
    closed, completed."""
    store = open_store(spec, writes=False)
    keys = store.batch_keys_in_use()
    statuses = dict(zip(keys, store.batch_statuses(keys)))  # pipelined rounds, not a read a batch
    if as_json:
        echo_json(
            [
                {"key": key, "error": str(s)} if isinstance(s, BatchError) else s.as_dict()
                for key, s in statuses.items()
                if s is not None
            ]
        )
        return
    print_table(f"batches of {spec.prefix!r}", COLUMNS, (_row(key, s) for key, s in statuses.items()))


@batches.command("show")
@store_options
@json_option
@click.argument("key")
def batches_show(spec: StoreSpec, as_json: bool, key: str) -> None:
    """Batch KEY's progress, and the first failed sub-job ids."""
    status = open_store(spec, writes=False).batch_status(key)  # garbage: BatchError says what to do
    if status is None:
        raise BatchError(f"no batch {key!r} in prefix {spec.prefix!r} (never opened, or expired after completion)")
    if as_json:
        echo_json(status.as_dict())
        return
    done_at = "-" if status.completed_ms is None else from_ms(status.completed_ms).isoformat()
    click.echo(
        f"batch {key!r}: {status.done}/{status.total} done ({status.succeeded} succeeded, {status.failed} failed), "
        f"{'closed' if status.closed else 'open'}, {'completed at ' + done_at if status.completed else 'not completed'}"
    )
    click.echo(f"opened at {from_ms(status.created_ms).isoformat()}; on_complete: {_yes(status.on_complete)}")
    if status.failed_ids:
        click.echo("failed: " + ", ".join(status.failed_ids))


@batches.command("pending")
@store_options
@json_option
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.argument("key")
def batches_pending(spec: StoreSpec, as_json: bool, limit: int, key: str) -> None:
    """The sub-jobs batch KEY still waits for (a closed batch that does not complete: one was
    never delivered, or a member was written by hand); end one with `delayq batches fail`."""
    pending = open_store(spec, writes=False).pending_in_batch(key, limit=limit)
    if as_json:
        echo_json(pending)
        return
    click.echo(f"batch {key!r} waits for {len(pending)}{'+' if len(pending) == limit else ''} sub-job(s)")
    for item_id in pending:
        click.echo(item_id)


@batches.command("fail")
@store_options
@click.argument("key")
@click.argument("ids", nargs=-1, required=True)
def batches_fail(spec: StoreSpec, key: str, ids: tuple[str, ...]) -> None:
    """Record sub-jobs IDS of batch KEY as failed: they will never run (cancelled elsewhere, lost,
    or written by hand), so the batch stops waiting for them. Completes it when they were the last."""
    store = open_store(spec, writes=True)
    for item_id in ids:
        completed = store.finish_in_batch(key, item_id, False)
        click.echo(f"{item_id}: recorded as failed" + (f"; batch {key!r} completed" if completed else ""))
