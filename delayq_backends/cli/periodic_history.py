"""``delayq periodic history NAME`` (and ``celery -A proj delayq periodic history NAME``): an
entry's last runs (due, published, started, finished, outcome), its last success's age and its
missed and late periods."""

from __future__ import annotations

from typing import Any

import click

from ..entries import iso
from ..periodic.history import HISTORY_SIZE, EntryHistory, entry_history
from ..store import DelayStore
from .output import Column, duration, echo_json, print_table

__all__ = ["history_json", "limit_option", "show_history"]

COLUMNS = [
    Column("run id"),
    Column("kind"),
    Column("due"),
    Column("published"),
    Column("late by", "right"),
    Column("started"),
    Column("finished"),
    Column("outcome"),
]

limit_option = click.option(
    "--limit",
    type=click.IntRange(1, HISTORY_SIZE),
    default=HISTORY_SIZE,
    show_default=True,
    help="Show at most this many runs, the newest first.",
)


def history_json(found: EntryHistory, now_ms: int) -> dict[str, Any]:
    """An entry's history for scripts and the HTTP API: its runs, counters and last success's age."""
    return {**found.to_json(), "now": now_ms, "last_success_age_ms": found.last_success_age_ms(now_ms)}


def show_history(store: DelayStore, name: str, as_json: bool, limit: int) -> None:
    """Print entry ``name``'s history; exit 1 for a name that is neither registered nor has any.

    Raises:
        click.ClickException: no such entry (names ``periodic list``).
    """
    try:
        found = entry_history(store, name, limit=limit)
    except ValueError as exc:
        raise click.BadParameter(f"{name!r}: {exc}", param_hint="NAME") from None
    now = store.clock()
    if as_json:
        echo_json(history_json(found, now))
        return
    age = found.last_success_age_ms(now)
    success = "never (in its kept history)" if age is None else f"{iso(found.last_success_ms)} ({duration(age)} ago)"
    click.echo(f"entry {name!r}: last success {success}; missed {found.missed}; late {found.late}")
    rows = [
        [r.run_id, r.kind, iso(r.due_ms), iso(r.published_ms), _late_by(r.lateness_ms), iso(r.started_ms),
         iso(r.finished_ms), r.outcome or ("running" if r.started_ms else None)]
        for r in found.runs
    ]  # fmt: skip
    print_table(f"last {len(rows)} run(s) of {name!r} (times UTC)", COLUMNS, rows)


def _late_by(lateness_ms: int | None) -> str | None:
    return None if lateness_ms is None else duration(max(0, lateness_ms))
