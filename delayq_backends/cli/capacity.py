"""``delayq capacity``: print the masters, shards and forwarders a workload needs.

The arithmetic is :mod:`delayq_backends.capacity`; this module only reads options and prints.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace

import click

from ..capacity import Costs, Limits, Plan, Workload, plan
from ..errors import ConfigError

__all__ = ["capacity", "parse_amount"]

_SUFFIXES = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9}  # B: a billion items; G: gigabytes


def parse_amount(text: str) -> float:
    """``10k``, ``1.5M``, ``1B`` (10^9), ``1e6`` or ``250000`` as a number.

    Raises:
        ConfigError: anything else; the message shows the accepted forms.
    """
    value = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(value[-1:].lower(), 1.0)
    if scale != 1.0:
        value = value[:-1]
    try:
        number = float(value) * scale
    except ValueError:
        raise ConfigError(f"{text!r} is not an amount: use e.g. 250000, 10k, 1.5M or 1B") from None
    if not number >= 0 or number == float("inf"):
        raise ConfigError(f"{text!r}: use a non-negative, finite amount")
    return number


def _amount(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """Click callback: an option's amount, or a usage error that shows the accepted forms."""
    try:
        return parse_amount(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def _costs(path: str | None) -> Costs:
    """Costs from a ``bench/capacity.py`` JSON report (its ``costs`` object), else the defaults."""
    if path is None:
        return Costs()
    with open(path, encoding="utf-8") as handle:
        try:
            document = json.load(handle)
        except ValueError as exc:
            raise click.BadParameter(f"{path} is not JSON: pass the report bench/capacity.py writes") from exc
    given = document.get("costs", document) if isinstance(document, dict) else None
    known = {f.name for f in fields(Costs)}
    if not isinstance(given, dict) or not set(given) <= known:
        extra = sorted(set(given) - known) if isinstance(given, dict) else given
        raise click.BadParameter(f"{path}: unknown costs {extra}; expected some of {sorted(known)}")
    try:
        return Costs(**given)
    except (ConfigError, TypeError) as exc:
        raise click.BadParameter(f"{path}: {exc}") from exc


def render(workload: Workload, result: Plan) -> str:
    """The plan as text, one fact per line."""
    by = ", ".join(f"{name} {need}" for name, need in result.masters_by.items())
    lines = [
        f"workload: schedule {workload.schedule_rate:,.0f}/s, fire {workload.fire_rate:,.0f}/s, "
        f"backlog {workload.backlog:,.0f}",
        f"masters:    {result.masters}  (bound by {result.binding}; needed by {by})",
        f"shards:     {result.shards}",
        f"forwarders: {result.forwarders}  (each about {result.forwarder_rate:,.0f} items/s at batch {result.batch})",
        f"per master: {result.cpu_per_master:.0%} of a core, {result.memory_per_master / 1e9:,.2f} GB, "
        f"{result.network_per_master / 1e6:,.1f} MB/s",
        f"claim blocks its master {result.claim_block_us / 1000:.2f} ms per call",
    ]
    return "\n".join(lines + [f"note: {note}" for note in result.notes])


@click.command()
@click.option(
    "--schedule-rate", callback=_amount, metavar="N", required=True, help="Items scheduled per second (10k, 1M…)."
)
@click.option("--fire-rate", callback=_amount, metavar="N", required=True, help="Items falling due per second.")
@click.option("--backlog", callback=_amount, metavar="N", required=True, help="Items waiting at once (10M, 1B…).")
@click.option(
    "--costs",
    "costs_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Measured costs: the JSON report of bench/capacity.py. [default: this project's machine]",
)
@click.option(
    "--master-memory",
    callback=_amount,
    default="25G",
    metavar="BYTES",
    show_default=True,
    help="Usable bytes per master.",
)
@click.option(
    "--max-block-us",
    type=float,
    default=Limits.max_block_us,
    show_default=True,
    help="Longest a claim may block a master.",
)
@click.option(
    "--batch", type=int, default=Limits.batch, show_default=True, help="Forwarder batch (cut to fit --max-block-us)."
)
@click.option("--rtt-us", type=float, default=Limits.rtt_us, show_default=True, help="Round trip forwarder ↔ master.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def capacity(
    schedule_rate: float,
    fire_rate: float,
    backlog: float,
    costs_path: str | None,
    master_memory: float,
    max_block_us: float,
    batch: int,
    rtt_us: float,
    as_json: bool,
) -> None:
    """How many Redis Cluster masters, shards and forwarders a workload needs (docs/capacity.md)."""
    try:
        workload = Workload(schedule_rate, fire_rate, backlog)
        limits = replace(
            Limits(), master_memory_bytes=master_memory, max_block_us=max_block_us, batch=batch, rtt_us=rtt_us
        )
        result = plan(workload, _costs(costs_path), limits)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(
        json.dumps({"workload": asdict(workload), **asdict(result)}, indent=2) if as_json else render(workload, result)
    )
