"""``delayq demo``: schedule, forward and measure lateness on a throw-away store."""

from __future__ import annotations

import click
from rich.console import Console

from ..demo import GRACE_SECONDS, print_result, run_demo

__all__ = ["demo"]


@click.command()
@click.option(
    "--url",
    metavar="URL",
    default=None,
    help="Use this server (under a fresh random prefix, deleted at the end). [default: start an embedded Valkey]",
)
@click.option("--items", type=click.IntRange(1, 1_000_000), default=3000, show_default=True, help="Items to schedule.")
@click.option(
    "--spread",
    type=click.FloatRange(0, 3600),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Ready times are spread uniformly over this many seconds from now.",
)
@click.option("--shards", type=int, default=16, show_default=True, help="Shards of the demo store.")
def demo(url: str | None, items: int, spread: float, shards: int) -> None:
    """Schedule items, forward them at their time, and report how late they arrived.

    Exit code 1 if items were still missing SPREAD + 30 seconds after scheduling.
    """
    console = Console()
    result = run_demo(url=url, items=items, spread=spread, shards=shards, console=console)
    print_result(result, console)
    if result.missing:
        raise click.ClickException(
            f"{result.missing} of {items} items were not forwarded within {spread + GRACE_SECONDS:g} s"
        )
