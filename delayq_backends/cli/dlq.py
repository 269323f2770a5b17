"""``delayq dlq``: inspect, requeue or purge dead letters."""

from __future__ import annotations

from collections.abc import Sequence

import click

from ..entries import around_bad_shards, dead_entry
from ..storespec import StoreSpec
from .options import check_shard, json_option, open_store, page_options, shard_option, store_options
from .output import Column, echo_json, print_table, warn

__all__ = ["dlq"]


@click.group()
def dlq() -> None:
    """Inspect, requeue or purge dead letters (items that failed too often)."""


DEAD_COLUMNS = [
    Column("id"),
    Column("shard", "right"),
    Column("died at"),
    Column("attempts", "right"),
    Column("error"),
    Column("ready"),
]


@dlq.command("list")
@store_options
@shard_option
@page_options
@json_option
def dlq_list(spec: StoreSpec, shard: int | None, offset: int, limit: int, as_json: bool) -> None:
    """Dead letters, most recent first, with the error that killed each."""
    check_shard(spec, shard)
    store = open_store(spec, writes=False)
    letters, problems = around_bad_shards(
        store, shard, offset, limit, lambda s, n: store.dead_letters(shard=s, count=n), lambda d: -d.died_ms
    )
    entries = [dead_entry(d) for d in letters]
    warn(problems)
    if as_json:
        echo_json(entries)
        return
    print_table("dead letters", DEAD_COLUMNS, (list(e.values()) for e in entries))


def _selection(ids: Sequence[str], all_: bool, verb: str) -> list[str] | None:
    """The ids to act on, or None for all; refuses to guess when given neither or both."""
    if bool(ids) == all_:
        raise click.UsageError(f"give the ids to {verb}, or --all (not both)")
    return None if all_ else list(dict.fromkeys(ids))


def _report(done: int, ids: list[str] | None, verb: str) -> None:
    """Say what was done; exit 1 when named ids were not all dead letters."""
    click.echo(f"{verb} {done} dead letter(s)")
    if ids is not None and done < len(ids):
        click.echo(f"{len(ids) - done} of the given ids were not dead letters (or are scheduled again already)")
        raise click.exceptions.Exit(1)


@dlq.command("requeue")
@store_options
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter of the prefix.")
def dlq_requeue(spec: StoreSpec, ids: Sequence[str], all_: bool) -> None:
    """Schedule dead letters again, due now, with fresh attempts.

    Exit code 1 if some given ids were not requeued.
    """
    selected = _selection(ids, all_, "requeue")
    _report(open_store(spec, writes=True).requeue_dead(selected), selected, "requeued")


@dlq.command("purge")
@store_options
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead letter of the prefix.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(spec: StoreSpec, ids: Sequence[str], all_: bool, yes: bool) -> None:
    """Delete dead letters for good (asks first unless --yes).

    Exit code 1 if some given ids were not dead letters.
    """
    selected = _selection(ids, all_, "purge")
    what = f"ALL dead letters of prefix {spec.prefix!r}" if selected is None else f"{len(selected)} dead letter(s)"
    if not yes:
        click.confirm(f"Delete {what} for good?", abort=True)
    _report(open_store(spec, writes=True).purge_dead(selected), selected, "purged")
