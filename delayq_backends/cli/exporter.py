"""``delayq exporter``: the store's per-shard gauges for Prometheus, without a forwarder.

For stores whose forwarders run elsewhere (or not at all yet), and for one scrape target per
store however many forwarders there are. It only reads (ZCARD/ZCOUNT/HLEN at scrape time), so
it may run with the ``reader`` ACL role; the slot gauges also need SCAN and GET, which that role
lacks (without them they read as ``delayq_slots_up 0``, the rest serves on). The group gauges
list the groups with SCAN too (``delayq_groups_up 0`` without what they read). The periodic entries'
gauges (:mod:`delayq_backends.periodic.gauges`) read the registry, each entry and its history.
"""

from __future__ import annotations

import signal
import threading

import click
from prometheus_client import CollectorRegistry

from ..connection import redact_url
from ..metrics import (
    DEFAULT_GROUPS,
    DEFAULT_METRICS_HOST,
    DEFAULT_SLOT_KEYS,
    GroupCollector,
    SlotCollector,
    StoreCollector,
    serve_metrics,
)
from ..periodic.gauges import DEFAULT_PERIODIC_ENTRIES, PeriodicCollector
from ..storespec import StoreSpec
from .options import open_store, store_options

__all__ = ["exporter"]


@click.command()
@store_options
@click.option(
    "--port",
    envvar="DELAYQ_METRICS_PORT",
    show_envvar=True,
    type=click.IntRange(1, 65535),
    default=9478,
    show_default=True,
    help="Port of the /metrics endpoint.",
)
@click.option(
    "--host",
    envvar="DELAYQ_METRICS_HOST",
    show_envvar=True,
    default=DEFAULT_METRICS_HOST,
    show_default=True,
    metavar="ADDR",
    help="Address to listen on; 0.0.0.0 to be scraped from other hosts (e.g. in a container).",
)
@click.option(
    "--slot-keys",
    envvar="DELAYQ_METRICS_SLOT_KEYS",
    show_envvar=True,
    type=click.IntRange(0, 10_000),
    default=DEFAULT_SLOT_KEYS,
    show_default=True,
    metavar="N",
    help="Concurrency slot keys named in the slot gauges, busiest first (the rest count in the totals); "
    "0: no slot gauges (their key list is a SCAN every 30 s).",
)
@click.option(
    "--groups",
    envvar="DELAYQ_METRICS_GROUPS",
    show_envvar=True,
    type=click.IntRange(0, 10_000),
    default=DEFAULT_GROUPS,
    show_default=True,
    metavar="N",
    help='Groups named in the per-group gauges, busiest first (the rest summed as group="(other)"); '
    "0: no group gauges (their list is a SCAN every 30 s).",
)
@click.option(
    "--periodic-entries",
    envvar="DELAYQ_METRICS_PERIODIC_ENTRIES",
    show_envvar=True,
    type=click.IntRange(0, 100_000),
    default=DEFAULT_PERIODIC_ENTRIES,
    show_default=True,
    metavar="N",
    help='Periodic entries named in the per-entry gauges, worst first (the rest summed as entry="_other"); '
    "0: no periodic gauges (each scrape reads every entry and its history).",
)
def exporter(spec: StoreSpec, port: int, host: str, slot_keys: int, groups: int, periodic_entries: int) -> None:
    """Serve the store's per-shard gauges (scheduled, due, leased, dead, oldest overdue), its
    groups' (running, parked, limit, rate, weight, paused, throttled) and its concurrency slots'
    (in use, waiting, limit) until SIGTERM/SIGINT.

    The store must answer at start; later outages show as delayq_store_up 0 while it keeps serving.
    """
    registry = CollectorRegistry()
    # under Prometheus's default 10 s scrape timeout: a hung store reads as up 0, not a stalled scrape
    store = open_store(spec, writes=False, socket_timeout=5)
    shards = StoreCollector(store)
    registry.register(shards)
    if slot_keys:
        registry.register(SlotCollector(store, max_keys=slot_keys))
    if groups:
        registry.register(GroupCollector(store, max_groups=groups))
    if periodic_entries:
        registry.register(PeriodicCollector(store, max_entries=periodic_entries, after=shards))
    serve_metrics(registry, host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(
        f"delayq exporter: store {redact_url(spec.url)} prefix {spec.prefix!r}, {spec.shards} shards; "
        f"metrics: http://{host}:{port}/metrics",
        err=True,
    )
    stop.wait()
