"""Reading a store: ``delayq stats``, ``list``, ``why`` and ``cancel``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..connection import connect
from ..entries import (
    around_bad_shards,
    describe_collapsed,
    group_board_entry,
    iso,
    item_entry,
    listed_at,
    stats_entry,
    why_entry,
)
from ..kinds import RQ
from ..models import ScheduledItem
from ..store import DelayStore
from ..store.groupboard import group_board
from ..storespec import StoreSpec
from .options import (
    check_shard,
    closing,
    json_option,
    open_store,
    page_options,
    rq_redis_option,
    shard_option,
    store_options,
    when_option,
)
from .output import Column, duration, echo_json, print_table, warn

__all__ = ["cancel", "list_", "stats", "why"]


STATS_COLUMNS = [
    Column("shard", "right"),
    Column("scheduled", "right"),
    Column("due now", "right"),
    Column("leased", "right"),
    Column("dead", "right"),
    Column("parked", "right"),
    Column("next due"),
    Column("oldest overdue", "right"),
]


def _stats_cells(entry: dict[str, Any]) -> list[Any]:
    overdue = duration(entry["oldest_overdue_ms"]) if entry["due"] else None
    return [
        entry["shard"],
        entry["scheduled"],
        entry["due"],
        entry["leased"],
        entry["dead"],
        entry["parked"],
        entry["next_due"],
        overdue,
    ]


GROUP_COLUMNS = [
    Column("busiest groups"),
    Column("running", "right"),
    Column("parked", "right"),
    Column("limit", "right"),
    Column("rate", "right"),
    Column("held"),
]


@click.command()
@store_options
@click.option(
    "--groups",
    "busiest",
    type=click.IntRange(0, 1000),
    default=5,
    show_default=True,
    metavar="N",
    help="Show the N busiest groups (running plus parked) and the totals over all; 0: none "
    "(listing the groups is a SCAN of the database).",
)
@json_option
def stats(spec: StoreSpec, busiest: int, as_json: bool) -> None:
    """Counts per shard: scheduled, due now, leased, dead, parked (in a group's line, or no forwarder that
    claimed them could release them: a newer envelope format, a target it lacks), next due time, oldest
    overdue; then the busiest groups (``delayq groups list`` has them all)."""
    store = open_store(spec, writes=False)
    per_shard = store.stats()
    entries = [stats_entry(s.shard, [s]) for s in per_shard]
    totals = stats_entry("total", per_shard)
    board = group_board(store, store.groups_in_use(), limit=busiest) if busiest else None
    if as_json:
        shown: dict[str, Any] = {"now": iso(per_shard[0].now_ms), "shards": entries, "totals": totals}
        if board is not None:
            shown["groups"] = group_board_entry(board)
        echo_json(shown)
        return
    print_table(
        f"delayq {spec.prefix!r}, {spec.shards} shards, at {iso(per_shard[0].now_ms)}",
        STATS_COLUMNS,
        map(_stats_cells, entries),
        _stats_cells(totals),
    )
    if board is not None and board.groups:
        print_table(
            f"{board.groups} groups: {board.paused} paused, {board.throttled} throttled",
            GROUP_COLUMNS,
            (
                [e["key"], e["running"], e["parked"], e["limit"], e["rate"], e["held"]]
                for e in group_board_entry(board)["page"]
            ),
            ["all groups", board.running, board.parked, None, None, None],
        )


def _item_cells(entry: dict[str, Any]) -> list[Any]:
    where = f"{entry['target']}/{entry['destination']}"
    if entry["newer_format"] is not None:
        where = f"<newer format {entry['newer_format']}: upgrade this reader>"
    elif entry["corrupt"]:
        where = f"<corrupt: {entry['corrupt']}>"
    return [
        entry["id"],
        entry["shard"],
        entry["ready"],
        entry["attempts"],
        _held(entry),
        entry["rank"],
        where,
        entry["size"],
        describe_collapsed(entry["collapsed"]),
        _runs(entry),
    ]


def _held(entry: dict[str, Any]) -> Any:
    """The "leased until" cell: a parked item says why instead of its far parking time."""
    if entry["parked"] is not None:
        return f"parked ({entry['parked']})"
    return f"{entry['leased_until']} (awaiting start)" if entry["awaiting_start"] else entry["leased_until"]


def _runs(entry: dict[str, Any]) -> str:
    """What the item runs: an RQ job's function and args (its description), a Celery task's name."""
    if entry.get("job"):
        job = entry["job"]
        what = job["description"] if job["description"] is not None else f"<job {job['id']} is gone>"
        if job.get("overlap"):
            what = f"[{job['overlap']}: {job['skipped']} skipped] {what}"
        return what if len(what) <= RUNS_WIDTH else what[: RUNS_WIDTH - 1] + "…"
    return str((entry["task"] or {}).get("task") or "")


#: The widest "runs" cell; ``--json`` has the whole description.
RUNS_WIDTH = 60


ITEM_COLUMNS = [
    Column("id"),
    Column("shard", "right"),
    Column("ready"),
    Column("attempts", "right"),
    Column("leased until"),
    Column("rank", "right"),
    Column("target/destination"),
    Column("size", "right"),
    Column("collapsed"),
    Column("runs"),
]


@click.command("list")
@store_options
@shard_option
@click.option(
    "--from",
    "start",
    metavar="TIME",
    default=None,
    help="Earliest ready time: ISO-8601 with a zone (2030-01-31T12:00:00Z) or epoch seconds.",
)
@click.option("--to", "end", metavar="TIME", default=None, help="Latest ready time, same forms as --from.")
@page_options
@rq_redis_option("Redis of the RQ jobs, to show what each runs (may equal --url). [default: --url, unless a cluster]")
@json_option
def list_(
    spec: StoreSpec,
    shard: int | None,
    start: str | None,
    end: str | None,
    offset: int,
    limit: int,
    rq_redis: str | None,
    as_json: bool,
) -> None:
    """Scheduled items in ready-time order, one page at a time; for RQ jobs, the function and
    args (from the job's description, never unpickled)."""
    check_shard(spec, shard)
    low, high = when_option(start, "--from"), when_option(end, "--to")
    store = open_store(spec, writes=False)
    items, problems = around_bad_shards(
        store,
        shard,
        offset,
        limit,
        lambda s, n: store.scheduled(shard=s, start=low, end=high, count=n),
        listed_at,
    )
    entries = [item_entry(item) for item in items]
    _add_rq_jobs(store, rq_redis, items, entries)
    warn(problems)
    if as_json:
        echo_json(entries)
        return
    title = f"scheduled items {offset + 1}-{offset + len(entries)}" if entries else "no scheduled items here"
    print_table(title, ITEM_COLUMNS, map(_item_cells, entries))
    if len(entries) == limit:
        click.echo(f"more may follow: --offset {offset + limit}")


def _add_rq_jobs(
    store: DelayStore, rq_redis: str | None, items: Sequence[ScheduledItem], entries: list[dict[str, Any]]
) -> None:
    """Set ``job`` (id, description, status) on the entries of RQ items, read from RQ's Redis."""
    if not any(e["target"] == RQ.name for e in entries):
        return
    if rq_redis is None and store.cluster:
        click.echo("note: RQ jobs' functions are not shown: pass --rq-redis (the store is a cluster)", err=True)
        return
    try:
        from ..rq.describe import describe_jobs  # RQ is an optional extra
    except ImportError:
        return
    client = closing(connect(rq_redis)) if rq_redis else store.client
    views = describe_jobs(client, items)
    for entry in entries:
        if entry["id"] in views:
            entry["job"] = views[entry["id"]].to_json()


@click.command()
@store_options
@click.argument("item_id", metavar="ID")
@json_option
def why(spec: StoreSpec, item_id: str, as_json: bool) -> None:
    """Why item ID is where it is, in one line: not due until T; due; leased by forwarder F;
    held by flow control on queue Q; waiting for group G (2 of 2 running: ids...); over G's rate
    until T; G paused or throttled; behind k items of G; parked (why); dead (reason); unknown.
    Reads only (the reader role will do). Exit code 0, or 1 when the id is unknown."""
    found = open_store(spec, writes=False).why(item_id)
    if as_json:
        echo_json(why_entry(found))
    else:
        click.echo(f"{found.id}: {found.line}")
    if found.state == "unknown":
        raise click.exceptions.Exit(1)


@click.command()
@store_options
@click.argument("ids", nargs=-1, required=True)
def cancel(spec: StoreSpec, ids: Sequence[str]) -> None:
    """Remove scheduled items by id. Exit code 0 if all were cancelled, 1 if any was not found."""
    store = open_store(spec, writes=True)
    missing = 0
    for item_id in ids:
        done = store.cancel_item(item_id)
        missing += not done.outcome
        in_flight = (
            ": removed, but a forwarder holds it and may deliver it once" if done.outcome.value == "in flight" else ""
        )
        in_batch = f" (a sub-job of batch {done.batch!r}: reported to it as failed)" if done.batch else ""
        click.echo(f"{done.outcome.value} {item_id}{in_flight}{in_batch}")
    if missing:
        raise click.exceptions.Exit(1)
