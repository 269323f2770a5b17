"""``delayq slots``: the concurrency slot keys (limit, running, waiting), and their limits set at
runtime: the groups' limits by their older name (:mod:`.groups` has the rest of a group's policy)."""

from __future__ import annotations

from dataclasses import asdict

import click

from ..storespec import StoreSpec
from .options import json_option, open_store, store_options
from .output import Column, echo_json, print_table

__all__ = ["slots"]

COLUMNS = [Column("key"), Column("limit", "right"), Column("running", "right"), Column("waiting", "right")]


@click.group(invoke_without_command=True)
@click.pass_context
def slots(ctx: click.Context) -> None:
    """Concurrency slots: at most a key's limit of its items run at once (``delayq slots list``, ``set``).
    A slot key is a group: ``delayq groups`` shows and sets its rate, weight and pause too."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@slots.command("list")
@store_options
@json_option
def slots_list(spec: StoreSpec, as_json: bool) -> None:
    """Every slot key in use: its runtime limit ("-": the items' own, or none), the items holding a
    slot (running, or released and not started yet) and those waiting in its line."""
    store = open_store(spec, writes=False)
    statuses = store.slot_statuses(store.slot_keys_in_use())
    if as_json:
        echo_json([asdict(s) for s in statuses])
        return
    print_table(f"slots of {spec.prefix!r}", COLUMNS, ([s.key, s.limit, s.running, s.waiting] for s in statuses))


@slots.command("set")
@store_options
@click.argument("key")
@click.argument("limit")
def slots_set(spec: StoreSpec, key: str, limit: str) -> None:
    """Let at most LIMIT items of KEY run at once from the next release on (over the items' own
    limit); LIMIT "none" removes it."""
    try:
        n = None if limit.lower() == "none" else int(limit)
    except ValueError:
        raise click.BadParameter(f"{limit!r}: use a whole number >= 1, or none", param_hint="LIMIT") from None
    open_store(spec, writes=True).set_slot_limit(key, n)  # a limit < 1 or a bad key: InvalidSlotError says so
    click.echo(f"slot {key!r}: limit {'removed' if n is None else n}")
