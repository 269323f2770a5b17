"""``delayq groups``: how much runs, per group (a tenant, a customer, an endpoint): each group's
policy (limit, rate, weight, paused), what runs and what waits in its lines, and the policy set
at runtime. ``delayq slots`` stays as the view of the same keys by their old name (a slot key is
a group, its limit the group's).
"""

from __future__ import annotations

from typing import Any

import click

from ..entries import group_board_entry, group_entry
from ..store.groupboard import group_board
from ..storespec import StoreSpec
from .options import json_option, open_store, page_options, store_options
from .output import Column, echo_json, print_table

__all__ = ["groups"]

COLUMNS = [
    Column("group"),
    Column("limit", "right"),
    Column("rate", "right"),
    Column("weight", "right"),
    Column("running", "right"),
    Column("parked", "right"),
    Column("state"),
]


@click.group(invoke_without_command=True)
@click.pass_context
def groups(ctx: click.Context) -> None:
    """Groups: at most a limit running, at most a rate released, a weight's share when groups
    compete, paused or not (``delayq groups list``, ``show``, ``set``, ``pause``, ``resume``)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _state(entry: dict[str, Any]) -> str:
    """The "state" cell: who paused it, until when a worker throttled it, or "releasing"."""
    parts = []
    if entry["paused_by"]:
        parts.append(f"paused by {entry['paused_by']}")
    if entry["throttled_until"]:
        parts.append(f"throttled until {entry['throttled_until']} by {entry['throttled_by'] or '?'}")
    return "; ".join(parts) or "releasing"


def _row(entry: dict[str, Any]) -> list[Any]:
    return [
        entry["key"],
        entry["limit"],
        entry["rate"],
        entry["weight"],
        entry["running"],
        entry["parked"],
        _state(entry),
    ]


@groups.command("list")
@store_options
@page_options
@json_option
def groups_list(spec: StoreSpec, offset: int, limit: int, as_json: bool) -> None:
    """The groups in use (items running, parked in a line, or a policy set), busiest first
    (running plus parked), one page at a time, with the totals over every group."""
    store = open_store(spec, writes=False)
    board = group_board(store, store.groups_in_use(), offset=offset, limit=limit)
    shown = group_board_entry(board)
    if as_json:
        echo_json(shown)
        return
    entries = shown["page"]
    rows = f"{offset + 1}-{offset + len(entries)} of {board.groups}" if entries else f"none of {board.groups} here"
    print_table(
        f"groups of {spec.prefix!r}, busiest first ({rows}; {board.paused} paused, {board.throttled} throttled)",
        COLUMNS,
        map(_row, entries),
        ["all groups", None, None, None, board.running, board.parked, None],
    )
    if offset + len(entries) < board.groups:
        click.echo(f"more follow: --offset {offset + len(entries)}")


@groups.command("show")
@store_options
@json_option
@click.argument("key")
def groups_show(spec: StoreSpec, as_json: bool, key: str) -> None:
    """Group KEY's policy set at runtime ("-": none here; the items' own or a pattern's applies),
    its items running and parked, and whether it is paused or throttled."""
    store = open_store(spec, writes=False)
    entry = group_entry(store.group_statuses([key])[0], store.clock())
    if as_json:
        echo_json(entry)
        return
    policy = ", ".join(f"{name} {'-' if entry[name] is None else entry[name]}" for name in ("limit", "rate", "weight"))
    click.echo(f"group {key!r}: {policy}; {entry['running']} running, {entry['parked']} parked; {_state(entry)}")


def _limit(text: str) -> int | None:
    try:
        return None if text.lower() == "none" else int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use a whole number >= 1, or none", param_hint="--limit") from None


def _weight(text: str) -> float | None:
    try:
        return None if text.lower() == "none" else float(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: use a number > 0 (1: an equal share), or none", param_hint="--weight"
        ) from None


@groups.command("set")
@store_options
@click.option("--limit", "limit_text", metavar="N|none", help="At most N items of the group run at once.")
@click.option("--rate", metavar="N/s|N/m|N/h|none", help="At most N items released per second, minute or hour.")
@click.option("--weight", "weight_text", metavar="W|none", help="Its share when groups compete (default 1).")
@click.argument("key")
def groups_set(spec: StoreSpec, key: str, limit_text: str | None, rate: str | None, weight_text: str | None) -> None:
    """Set group KEY's policy from the next release on, at every forwarder (over the items' own
    and the patterns'); "none" removes that part. Parts not given stay as they are."""
    changes: dict[str, Any] = {}
    if limit_text is not None:
        changes["limit"] = _limit(limit_text)
    if rate is not None:
        changes["rate"] = None if rate.lower() == "none" else rate
    if weight_text is not None:
        changes["weight"] = _weight(weight_text)
    if not changes:
        raise click.UsageError("give at least one of --limit, --rate, --weight")
    store = open_store(spec, writes=True)
    store.set_group(key, **changes)  # a bad key, limit, rate or weight: the error says so, nothing written
    said = ", ".join(f"{name} {'removed' if value is None else value}" for name, value in changes.items())
    click.echo(f"group {key!r}: {said}")


@groups.command("pause")
@store_options
@click.option("--by", default="operator", show_default=True, help="Who paused it (shown with the pause).")
@click.argument("key")
def groups_pause(spec: StoreSpec, key: str, by: str) -> None:
    """Release no more items of group KEY, at every forwarder from its next release on; items
    already released run, the rest wait in its lines (nothing is lost) until ``resume``."""
    open_store(spec, writes=True).pause_group(key, by=by)
    click.echo(f"group {key!r}: paused by {by}")


@groups.command("resume")
@store_options
@click.argument("key")
def groups_resume(spec: StoreSpec, key: str) -> None:
    """Release group KEY's items again: its pause ends, and any worker's throttle with it (its
    limit, rate and weight stay as they were)."""
    open_store(spec, writes=True).resume_group(key)
    click.echo(f"group {key!r}: resumed")
