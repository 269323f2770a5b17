"""How the ``delayq`` commands print: rich tables for people, JSON for scripts, warnings on stderr."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import click
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "cells", "duration", "echo_json", "print_table", "warn"]


class Column(NamedTuple):
    """A table column: numbers are right-justified so their digits line up."""

    header: str
    justify: JustifyMethod = "left"


def duration(ms: int) -> str:
    """A short human duration: "850ms", "12.3s", "4m 05s", "2h 07m", "3d 04h"."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours:02d}h"
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {sec:02d}s"


def print_table(
    title: str, columns: Sequence[Column], rows: Iterable[Sequence[Any]], totals: Sequence[Any] | None = None
) -> None:
    """Print a rich table; None cells show as "-" so empty never looks like zero.

    Cells are plain :class:`Text`, so an id or error holding ``[...]`` is not read as markup.
    """
    table = Table(title=Text(title))
    for column in columns:
        table.add_column(column.header, justify=column.justify, overflow="fold")
    for row in rows:
        table.add_row(*cells(row))
    if totals is not None:
        table.add_section()
        table.add_row(*cells(totals), style="bold")
    console = Console()
    if not console.is_terminal:
        # A pipe or file gets the table at its natural width, not squeezed into 80 columns, so
        # no id or time is split across lines for the grep or script reading it.
        natural = console.measure(table, options=console.options.update_width(10_000)).maximum
        console = Console(width=natural)
    console.print(table)


def cells(row: Sequence[Any]) -> list[Text]:
    return [Text("-" if cell is None else str(cell)) for cell in row]


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def warn(problems: list[str]) -> None:
    """Name the shards a listing had to leave out, on stderr (the listing itself stays parseable)."""
    for problem in problems:
        click.echo(f"warning: {problem}; the other shards are listed", err=True)
