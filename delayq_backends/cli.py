"""The ``delayq`` command line: run a forwarder, inspect and repair a delay store, run the demo.

Every command that opens a store takes ``--url``, ``--prefix`` and ``--shards`` (or
``DELAYQ_URL``, ``DELAYQ_PREFIX``, ``DELAYQ_SHARDS``). delayq errors end as one line on stderr
with exit code 1, never as a traceback, and URLs are printed with their password hidden.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence, cast

import click
import redis
from click.core import ParameterSource
from redis.cluster import RedisCluster
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from . import __version__
from .acl import ROLES, acl_setuser
from .audit import open_audit
from .config import DEFAULT_URL, Config
from .connection import connect, redact_url
from .demo import GRACE_SECONDS, print_result, run_demo
from .entries import around_bad_shards, dead_entry, iso, item_entry, listed_at, stats_entry
from .errors import ConfigError, DelayqError, InvalidTimeError
from .exporter import exporter_command
from .flow import FlowControl, parse_depth, parse_rate
from .forwarder import Forwarder
from .functions import NodeFunctions, functions_status, install_functions
from .metrics import DEFAULT_METRICS_HOST, ForwarderMetrics, LabelBounds, serve_metrics
from .scripts import LIBRARY
from .store import DelayStore
from .targets import RedisListTarget, Target
from .timeutil import When, to_ms

__all__ = ["ErrorsAsMessages", "ForwardOptions", "forward_options", "main"]


# -- the store every command opens ------------------------------------------------------------


@dataclass(frozen=True)
class StoreSpec:
    """Where the store is, from the shared options, so commands take one argument, not three."""

    url: str
    prefix: str
    shards: int

    def open(self, *, writes: bool, socket_timeout: Optional[float] = None, **settings: Any) -> DelayStore:
        """Connect and check the shard layout before anything is read or written.

        A read-only command (``writes=False``) checks against a recorded layout but never records
        one, so a mistyped ``--shards`` on an empty prefix cannot pin that layout for producers.
        Servers that answer requests (the exporter, the dashboard) pass a ``socket_timeout``, so a
        store that hangs, rather than refusing connections, fails a request instead of freezing it.

        Raises:
            ConfigError: the URL is unusable or the server unreachable.
            ShardMismatchError: ``shards`` differs from the count recorded for ``prefix``.
        """
        config = Config(url=self.url, prefix=self.prefix, shards=self.shards, **settings)
        store = DelayStore(connect(self.url, socket_timeout=socket_timeout), config)
        click.get_current_context().call_on_close(store.client.close)
        store.check_meta(record=writes)
        return store

    def check_shard(self, shard: Optional[int]) -> None:
        """Refuse a ``--shard`` outside this layout with a usage error instead of a traceback."""
        if shard is not None and not 0 <= shard < self.shards:
            raise click.BadParameter(f"shard {shard} does not exist: use 0..{self.shards - 1}", param_hint="--shard")


def secret_option(
    name: str,
    *,
    envvar: str,
    help: str,
    default: Optional[str] = None,
    required: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--NAME URL`` (env ENVVAR) and ``--NAME-file PATH`` (env ENVVAR_FILE), reaching the command
    as one argument ``NAME``.

    The file form keeps a password out of ``ps`` and the shell history (a command line is
    readable by every user of the host); it wins over the env var, and giving both forms on the
    command line is refused.
    """
    param = name.replace("-", "_")
    file_param = f"{param}_file"

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_secret(*args: Any, **kwargs: Any) -> Any:
            value, path = kwargs.pop(param), kwargs.pop(file_param)
            if path is not None:
                if click.get_current_context().get_parameter_source(param) == ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"pass --{name} or --{name}-file, not both")
                value = _read_secret(path, f"--{name}-file")
            if required and value is None:
                raise click.UsageError(f"pass --{name}, {envvar} or --{name}-file")
            return command(*args, **{param: value}, **kwargs)

        file_help = f"Read the --{name} value from this file (keeps a password out of `ps`)."
        with_secret = click.option(
            f"--{name}-file",
            file_param,
            envvar=f"{envvar}_FILE",
            show_envvar=True,
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            metavar="PATH",
            help=file_help,
        )(with_secret)
        return click.option(
            f"--{name}",
            param,
            envvar=envvar,
            show_envvar=True,
            default=default,
            show_default=default is not None,
            metavar="URL",
            help=help + " A password in it shows in `ps`: prefer the env var or the -file option.",
        )(with_secret)

    return decorate


def _read_secret(path: Path, option: str) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint=option) from exc
    if not value:
        raise click.BadParameter(f"{path} is empty", param_hint=option)
    return value


url_option = secret_option(
    "url", envvar="DELAYQ_URL", default=DEFAULT_URL, help="Redis/Valkey URL of the delay store (any node of a cluster)."
)


def store_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add ``--url``/``--url-file``/``--prefix``/``--shards`` (with their env vars) and pass them as ``spec``."""

    @functools.wraps(command)
    def with_spec(*args: Any, url: str, prefix: str, shards: int, **kwargs: Any) -> None:
        command(*args, spec=StoreSpec(url, prefix, shards), **kwargs)

    options = [
        click.option(
            "--prefix",
            envvar="DELAYQ_PREFIX",
            show_envvar=True,
            default="delayq",
            show_default=True,
            help="Key prefix of the store.",
        ),
        click.option(
            "--shards",
            envvar="DELAYQ_SHARDS",
            show_envvar=True,
            type=int,
            default=16,
            show_default=True,
            help="Shard count; must match the one recorded for the prefix.",
        ),
    ]
    for option in reversed(options):
        with_spec = option(with_spec)
    return url_option(with_spec)


class ErrorsAsMessages(click.Group):
    """A group that turns delayq and Redis errors into one clean ``Error:`` line (exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DelayqError as exc:
            raise click.ClickException(str(exc)) from exc
        except redis.RedisError as exc:
            raise click.ClickException(f"Redis error: {exc}") from exc


# -- formatting -------------------------------------------------------------------------------


class Column(NamedTuple):
    """A table column: numbers are right-justified so their digits line up."""

    header: str
    justify: JustifyMethod = "left"


def _duration(ms: int) -> str:
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


def _print_table(
    title: str, columns: Sequence[Column], rows: Iterable[Sequence[Any]], totals: Optional[Sequence[Any]] = None
) -> None:
    """Print a rich table; None cells show as "-" so empty never looks like zero.

    Cells are plain :class:`Text`, so an id or error holding ``[...]`` is not read as markup.
    """
    table = Table(title=Text(title))
    for column in columns:
        table.add_column(column.header, justify=column.justify, overflow="fold")
    for row in rows:
        table.add_row(*_cells(row))
    if totals is not None:
        table.add_section()
        table.add_row(*_cells(totals), style="bold")
    console = Console()
    if not console.is_terminal:
        # A pipe or file gets the table at its natural width, not squeezed into 80 columns, so
        # no id or time is split across lines for the grep or script reading it.
        natural = console.measure(table, options=console.options.update_width(10_000)).maximum
        console = Console(width=natural)
    console.print(table)


def _cells(row: Sequence[Any]) -> list[Text]:
    return [Text("-" if cell is None else str(cell)) for cell in row]


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (for scripts).")
shard_option = click.option("--shard", type=int, default=None, help="Only this shard.")


def page_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add ``--offset`` and ``--limit``: listings are paged so a huge store never floods a terminal."""
    command = click.option(
        "--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Rows per page."
    )(command)
    return click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="Rows to skip.")(
        command
    )


def _when_option(value: Optional[str], option: str) -> Optional[When]:
    """Read ``--from``/``--to``: ISO-8601 with a zone, or epoch seconds. A time without a zone is
    refused, because the store cannot guess which zone was meant."""
    if value is None:
        return None
    text = value.strip()
    when: When
    try:
        when = float(text)
    except ValueError:
        when = _parse_iso(text, option)
    try:
        to_ms(when)
    except InvalidTimeError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc
    return when


def _parse_iso(text: str, option: str) -> datetime:
    try:  # Python < 3.11 does not read a trailing "Z"
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an ISO-8601 time (2030-01-31T12:00:00Z) nor epoch seconds", param_hint=option
        ) from None
    if parsed.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} has no time zone, so it is ambiguous: add one, e.g. {text}Z for UTC or {text}+02:00",
            param_hint=option,
        )
    return parsed


# -- commands ---------------------------------------------------------------------------------


@click.group(cls=ErrorsAsMessages)
@click.version_option(__version__, prog_name="delayq")
def main() -> None:
    """delayq: delayed Celery/RQ jobs in sharded Redis sorted sets, forwarded at their time."""


def forward_options(command: Callable[..., None]) -> Callable[..., None]:
    """The run options of a forwarder, shared by ``delayq forward`` and ``celery delayq forward``.

    They reach the command as one :class:`ForwardOptions` argument, ``run``.
    """

    @functools.wraps(command)
    def with_run(
        *args: Any,
        batch: int,
        lease: float,
        max_attempts: int,
        poll: float,
        log_level: str,
        log_every: float,
        audit_dir: Optional[str],
        audit_stream: Optional[str],
        metrics_port: Optional[int],
        metrics_host: str,
        metrics_queue: tuple[str, ...],
        max_queue_depth: dict[str, int],
        rate: dict[str, float],
        **kwargs: Any,
    ) -> None:
        flow = FlowControl(max_queue_depth, rate)
        run = ForwardOptions(
            batch, lease, max_attempts, poll, log_level, log_every, audit_dir, audit_stream,
            metrics_port, metrics_host, flow, metrics_queue,
        )  # fmt: skip
        command(*args, run=run, **kwargs)

    options = [
        click.option(
            "--batch",
            type=click.IntRange(1, 10_000),
            default=200,
            show_default=True,
            help="Items per claim; a claim blocks Redis while it runs, so keep it modest (100-500).",
        ),
        click.option(
            "--lease",
            type=float,
            default=30.0,
            show_default=True,
            metavar="SECONDS",
            help="How long claimed items stay ours before another forwarder may take them.",
        ),
        click.option(
            "--max-attempts",
            type=int,
            default=10,
            show_default=True,
            help="Claims of one item before it goes to the dead letters.",
        ),
        click.option(
            "--poll",
            type=click.FloatRange(min=0.01),
            default=1.0,
            show_default=True,
            metavar="SECONDS",
            help="Longest sleep, so a lost wake-up never strands an item.",
        ),
        click.option(
            "--log-level",
            envvar="DELAYQ_LOG_LEVEL",
            show_envvar=True,
            default="info",
            show_default=True,
            type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
            help="debug logs one line per batch.",
        ),
        click.option(
            "--log-every",
            type=click.FloatRange(min=0.1),
            default=10.0,
            show_default=True,
            metavar="SECONDS",
            help="Interval of the summary line (forwarded, retried, dead, lateness).",
        ),
        click.option(
            "--audit-dir",
            envvar="DELAYQ_AUDIT_DIR",
            show_envvar=True,
            default=None,
            metavar="DIR",
            help="Log one JSON line per forwarded item to rotating files in DIR (for `delayq spark audit`).",
        ),
        click.option(
            "--audit-stream",
            envvar="DELAYQ_AUDIT_STREAM",
            show_envvar=True,
            default=None,
            metavar="KEY",
            help="Log one entry per forwarded item to this Redis stream of the store's server (about 1M kept).",
        ),
        click.option(
            "--metrics-port",
            envvar="DELAYQ_METRICS_PORT",
            show_envvar=True,
            type=click.IntRange(1, 65535),
            default=None,
            metavar="PORT",
            help="Serve Prometheus metrics (this forwarder's counters, the store's gauges) on PORT. [default: off]",
        ),
        click.option(
            "--metrics-host",
            envvar="DELAYQ_METRICS_HOST",
            show_envvar=True,
            default=DEFAULT_METRICS_HOST,
            show_default=True,
            metavar="ADDR",
            help="Address the metrics listen on; 0.0.0.0 to be scraped from other hosts (e.g. in a container).",
        ),
        click.option(
            "--metrics-queue",
            envvar="DELAYQ_METRICS_QUEUE",
            show_envvar=True,
            multiple=True,
            metavar="QUEUE",
            help="Label metrics with this queue's name (queues of --rate/--max-queue-depth are too); every other "
            "queue counts as 'other', so item data cannot grow the series. Repeatable (env: space-separated).",
        ),
        click.option(
            "--max-queue-depth",
            envvar="DELAYQ_MAX_QUEUE_DEPTH",
            show_envvar=True,
            multiple=True,
            metavar="QUEUE=N",
            callback=_specs(parse_depth),
            help="Stop forwarding to QUEUE while its broker queue holds N messages or more; its items wait "
            "in the delay store, other queues keep flowing. Repeatable (env: space-separated).",
        ),
        click.option(
            "--rate",
            envvar="DELAYQ_RATE",
            show_envvar=True,
            multiple=True,
            metavar="QUEUE=N/s",
            callback=_specs(parse_rate),
            help="Forward at most N items per second (or N/m, N/h) to QUEUE, all forwarders together. "
            "Repeatable (env: space-separated).",
        ),
    ]
    for option in reversed(options):
        with_run = option(with_run)
    return with_run


def _specs(parse: Callable[[str], tuple[str, Any]]) -> Callable[[click.Context, click.Parameter, Any], dict[str, Any]]:
    """A click callback turning repeated ``QUEUE=VALUE`` options into a dict (a later one wins)."""

    def callback(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, Any]:
        try:
            return dict(parse(v) for v in values)
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from exc

    return callback


@dataclass(frozen=True)
class ForwardOptions:
    """How a forwarder runs, from :func:`forward_options`."""

    batch: int
    lease: float
    max_attempts: int
    poll: float
    log_level: str
    log_every: float
    audit_dir: Optional[str] = None
    audit_stream: Optional[str] = None
    metrics_port: Optional[int] = None
    metrics_host: str = DEFAULT_METRICS_HOST
    flow: FlowControl = field(default_factory=FlowControl)
    metrics_queues: tuple[str, ...] = ()

    def store_settings(self) -> dict[str, Any]:
        return {"lease_seconds": self.lease, "max_attempts": self.max_attempts}

    def run(self, store: DelayStore, targets: Sequence[Target], described: Sequence[str]) -> None:
        """Log, banner, and forward until SIGTERM/SIGINT (then finish the batch and return)."""
        # Only delayq's own loggers follow --log-level; redis-py's debug chatter stays out.
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("delayq").setLevel(self.log_level.upper())
        config = store.config
        metrics = None
        if self.metrics_port is not None:  # first: a port in use fails before anything is opened
            queues = {*self.metrics_queues, *self.flow.max_depth, *self.flow.rates}
            bounds = LabelBounds(queues, [t.kind for t in targets])
            metrics = ForwarderMetrics(store=store, bounds=bounds)
            serve_metrics(metrics.registry, self.metrics_host, self.metrics_port)
        audit = open_audit(directory=self.audit_dir, stream=self.audit_stream, url=config.url, stem="forwarded")
        forwarder = Forwarder(
            store, targets, batch=self.batch, poll_interval=self.poll, audit=audit, metrics=metrics, flow=self.flow
        )
        click.echo(
            f"delayq forward: store {redact_url(config.url)} prefix {config.prefix!r}, {config.shards} shards; "
            f"targets: {'; '.join(described)}; flow control: {self.flow.describe()}"
            + (f"; audit: {audit!r}" if audit else "")
            + (f"; metrics: http://{self.metrics_host}:{self.metrics_port}/metrics" if metrics else ""),
            err=True,
        )
        try:
            forwarder.run(log_every=self.log_every)
        finally:
            if audit is not None:
                audit.close()


def celery_broker_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--celery-broker URL`` (env ``DELAYQ_CELERY_BROKER``) or ``--celery-broker-file``, for each
    command that reaches Celery's broker."""
    return secret_option("celery-broker", envvar="DELAYQ_CELERY_BROKER", help=help)


def rq_redis_option(help: str, *, required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--rq-redis URL`` (env ``DELAYQ_RQ_REDIS``) or ``--rq-redis-file``, for each command that
    reaches RQ's Redis."""
    return secret_option("rq-redis", envvar="DELAYQ_RQ_REDIS", help=help, required=required)


@main.command()
@store_options
@forward_options
@secret_option(
    "list-redis",
    envvar="DELAYQ_LIST_REDIS",
    help="Redis of the list target (RPUSH onto the list each envelope names). [default: --url]",
)
@celery_broker_option("Celery's broker_url (amqp://, redis://, ...): forward delayed Celery tasks there.")
@rq_redis_option("Redis of the RQ queues: adds the rq target (may equal --url). [default: no rq target]")
@click.option(
    "--rq-allow-class",
    multiple=True,
    metavar="PREFIX",
    help="Let RQ envelopes name queue/job classes under this dotted module prefix (whole components; "
    "rq and delayq_backends always allowed). Repeatable; env DELAYQ_RQ_ALLOW_CLASS adds more (space-separated).",
)
@click.option(
    "--rq-adopt/--no-rq-adopt",
    default=True,
    envvar="DELAYQ_RQ_ADOPT",
    show_default=True,
    help="Every second, move jobs that a plain rq.Queue scheduled into RQ's rq:scheduled:<queue> into the "
    "store (with a warning), so they do not stall without an RQ scheduler.",
)
def forward(
    spec: StoreSpec,
    run: ForwardOptions,
    list_redis: Optional[str],
    celery_broker: Optional[str],
    rq_redis: Optional[str],
    rq_allow_class: tuple[str, ...],
    rq_adopt: bool,
) -> None:
    """Forward due items to their targets until SIGTERM/SIGINT, then finish the batch and exit 0.

    Run as many as you like, anywhere: leases make every claim exclusive.
    """
    store = spec.open(writes=True, **run.store_settings())
    list_url = list_redis or spec.url
    # The list target shares the store's connections when the lists live on the same server.
    list_client = store.client if list_url == spec.url else connect(list_url)
    click.get_current_context().call_on_close(list_client.close)
    # RPUSH in a non-transactional pipeline works the same on a RedisCluster.
    targets: list[Target] = [RedisListTarget(cast(redis.Redis, list_client))]
    described = [f"list -> {redact_url(list_url)}"]
    if celery_broker:
        celery_target = _extra("celery").CeleryTarget.from_url(celery_broker)
        targets += [celery_target, _extra("celery.periodic").PeriodicTarget(celery_target)]
        described.append(f"celery (and periodic entries) -> {redact_url(celery_broker)}")
    if rq_redis:
        target = _rq_target(rq_redis, spec, store, rq_allow_class)
        targets.append(target)
        described.append(f"rq -> {redact_url(rq_redis)}")
        if rq_adopt:
            adopter = _extra("rq").RegistryAdopter(target.connection, store).start()  # type: ignore[attr-defined]
            click.get_current_context().call_on_close(adopter.close)
    run.run(store, targets, described)


def _extra(name: str) -> Any:
    """An adapter package, or a usage error that names the extra to install."""
    try:
        return importlib.import_module(f"delayq_backends.{name}")
    except ImportError as exc:
        raise click.UsageError(f"{exc}") from exc


def _rq_target(url: str, spec: StoreSpec, store: DelayStore, allow_classes: Sequence[str] = ()) -> Target:
    """The rq target for ``--rq-redis``; given the store's own URL it shares the store's client,
    so each job's enqueue and ack commit in one transaction."""
    client = store.client if url == spec.url and not store.cluster else connect(url)
    if not isinstance(client, redis.Redis):
        raise click.BadParameter(
            f"{redact_url(url)} is a Redis Cluster; RQ needs a single server", param_hint="--rq-redis"
        )
    click.get_current_context().call_on_close(client.close)
    rq = _extra("rq")
    return rq.RQTarget(client, allow_classes=rq.ClassAllowlist.configured(allow_classes))  # type: ignore[no-any-return]


PERIODIC_COLUMNS = [
    Column("entry"),
    Column("task"),
    Column("schedule"),
    Column("misfire"),
    Column("last run"),
    Column("sent"),
    Column("next run"),
    Column("runs", "right"),
    Column("state"),
]


def show_periodic(store: DelayStore, as_json: bool) -> None:
    """Print the periodic entries synced into ``store`` (``delayq periodic list`` and
    ``celery -A proj delayq periodic list``): schedule, last run, next run."""
    entries = _extra("celery.periodic").statuses(store)
    if as_json:
        _echo_json([e.to_json() for e in entries])
        return
    rows = [
        [e.name, e.task, e.schedule, e.misfire, iso(e.last_run_ms), iso(e.last_sent_ms), iso(e.next_run_ms), e.runs,
         e.state + (f", {e.last_missed} missed" if e.last_missed else "")]
        for e in entries
    ]  # fmt: skip
    _print_table(f"periodic entries of {store.config.prefix!r} (times UTC)", PERIODIC_COLUMNS, rows)


@main.group()
def periodic() -> None:
    """Periodic Celery entries synced into the store (``celery -A proj delayq periodic sync``)."""


@periodic.command("list")
@store_options
@json_option
def periodic_list(spec: StoreSpec, as_json: bool) -> None:
    """Every periodic entry: schedule, misfire policy, last run, next run, runs so far."""
    show_periodic(spec.open(writes=False), as_json)


STATS_COLUMNS = [
    Column("shard", "right"),
    Column("scheduled", "right"),
    Column("due now", "right"),
    Column("leased", "right"),
    Column("dead", "right"),
    Column("next due"),
    Column("oldest overdue", "right"),
]


def _stats_cells(entry: dict[str, Any]) -> list[Any]:
    overdue = _duration(entry["oldest_overdue_ms"]) if entry["due"] else None
    return [
        entry["shard"],
        entry["scheduled"],
        entry["due"],
        entry["leased"],
        entry["dead"],
        entry["next_due"],
        overdue,
    ]


@main.command()
@store_options
@json_option
def stats(spec: StoreSpec, as_json: bool) -> None:
    """Counts per shard: scheduled, due now, leased, dead, next due time, oldest overdue."""
    per_shard = spec.open(writes=False).stats()
    entries = [stats_entry(s.shard, [s]) for s in per_shard]
    totals = stats_entry("total", per_shard)
    if as_json:
        _echo_json({"now": iso(per_shard[0].now_ms), "shards": entries, "totals": totals})
        return
    _print_table(
        f"delayq {spec.prefix!r}, {spec.shards} shards, at {iso(per_shard[0].now_ms)}",
        STATS_COLUMNS,
        map(_stats_cells, entries),
        _stats_cells(totals),
    )


def _item_cells(entry: dict[str, Any]) -> list[Any]:
    where = f"<corrupt: {entry['corrupt']}>" if entry["corrupt"] else f"{entry['target']}/{entry['destination']}"
    return [
        entry["id"],
        entry["shard"],
        entry["ready"],
        entry["attempts"],
        entry["leased_until"],
        entry["rank"],
        where,
        entry["size"],
    ]


ITEM_COLUMNS = [
    Column("id"),
    Column("shard", "right"),
    Column("ready"),
    Column("attempts", "right"),
    Column("leased until"),
    Column("rank", "right"),
    Column("target/destination"),
    Column("size", "right"),
]


@main.command("list")
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
@json_option
def list_(
    spec: StoreSpec,
    shard: Optional[int],
    start: Optional[str],
    end: Optional[str],
    offset: int,
    limit: int,
    as_json: bool,
) -> None:
    """Scheduled items in ready-time order, one page at a time."""
    spec.check_shard(shard)
    low, high = _when_option(start, "--from"), _when_option(end, "--to")
    store = spec.open(writes=False)
    items, problems = around_bad_shards(
        store,
        shard,
        offset,
        limit,
        lambda s, n: store.scheduled(shard=s, start=low, end=high, count=n),
        listed_at,
    )
    entries = [item_entry(item) for item in items]
    _warn(problems)
    if as_json:
        _echo_json(entries)
        return
    title = f"scheduled items {offset + 1}-{offset + len(entries)}" if entries else "no scheduled items here"
    _print_table(title, ITEM_COLUMNS, map(_item_cells, entries))
    if len(entries) == limit:
        click.echo(f"more may follow: --offset {offset + limit}")


@main.command()
@store_options
@click.argument("ids", nargs=-1, required=True)
def cancel(spec: StoreSpec, ids: Sequence[str]) -> None:
    """Remove scheduled items by id. Exit code 0 if all were cancelled, 1 if any was not found."""
    store = spec.open(writes=True)
    missing = 0
    for item_id in ids:
        outcome = store.cancel(item_id)
        missing += not outcome
        in_flight = (
            ": removed, but a forwarder holds it and may deliver it once" if outcome.value == "in flight" else ""
        )
        click.echo(f"{outcome.value} {item_id}{in_flight}")
    if missing:
        raise click.exceptions.Exit(1)


# -- dead letters -----------------------------------------------------------------------------


@main.group()
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
def dlq_list(spec: StoreSpec, shard: Optional[int], offset: int, limit: int, as_json: bool) -> None:
    """Dead letters, most recent first, with the error that killed each."""
    spec.check_shard(shard)
    store = spec.open(writes=False)
    letters, problems = around_bad_shards(
        store, shard, offset, limit, lambda s, n: store.dead_letters(shard=s, count=n), lambda d: -d.died_ms
    )
    entries = [dead_entry(d) for d in letters]
    _warn(problems)
    if as_json:
        _echo_json(entries)
        return
    _print_table("dead letters", DEAD_COLUMNS, (list(e.values()) for e in entries))


def _warn(problems: list[str]) -> None:
    """Name the shards a listing had to leave out, on stderr (the listing itself stays parseable)."""
    for problem in problems:
        click.echo(f"warning: {problem}; the other shards are listed", err=True)


def _selection(ids: Sequence[str], all_: bool, verb: str) -> Optional[list[str]]:
    """The ids to act on, or None for all; refuses to guess when given neither or both."""
    if bool(ids) == all_:
        raise click.UsageError(f"give the ids to {verb}, or --all (not both)")
    return None if all_ else list(dict.fromkeys(ids))


def _report(done: int, ids: Optional[list[str]], verb: str) -> None:
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
    _report(spec.open(writes=True).requeue_dead(selected), selected, "requeued")


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
    _report(spec.open(writes=True).purge_dead(selected), selected, "purged")


# -- rq -----------------------------------------------------------------------------------------


@main.command("rq-migrate")
@store_options
@rq_redis_option("Redis of the RQ queues (may equal --url).", required=True)
@click.option("--queue-class", default=None, help="Queue class the forwarder moves jobs with (module.Class).")
@click.option("--job-class", default=None, help="Job class, as given to `rq worker --job-class`.")
@click.option("--serializer", default=None, help="Serializer, as given to `rq worker --serializer`.")
@click.option("--dry-run", is_flag=True, help="Count what would move; change nothing.")
def rq_migrate(
    spec: StoreSpec,
    rq_redis: str,
    queue_class: Optional[str],
    job_class: Optional[str],
    serializer: Optional[str],
    dry_run: bool,
) -> None:
    """Move jobs waiting in RQ's rq:scheduled:* registries and rq-scheduler's set into the store.

    Stop `rq worker --with-scheduler` and `rqscheduler` first. Safe to run again: nothing is
    lost or duplicated.
    """
    from rq.utils import import_attribute

    from .rq import migrate

    store = spec.open(writes=True)
    client = connect(rq_redis)
    click.get_current_context().call_on_close(client.close)
    classes: dict[str, Any] = {
        name: import_attribute(path)
        for name, path in (("queue_class", queue_class), ("job_class", job_class), ("serializer", serializer))
        if path
    }
    report = migrate(cast(redis.Redis, client), store, dry_run=dry_run, **classes)
    verb = "would move" if dry_run else "moved"
    for key in sorted(set(report.moved) | set(report.missing)):
        click.echo(
            f"{key}: {verb} {report.moved.get(key, 0)}, already in the store {report.already.get(key, 0)}, "
            f"job gone {report.missing.get(key, 0)}"
        )
    click.echo(f"{verb} {report.total_moved} job(s) into {redact_url(spec.url)} prefix {spec.prefix!r}")


@main.command("rq-upgrade")
@store_options
@click.option("--rq-redis", metavar="URL", default=None, help="Redis of the RQ jobs. [default: --url]")
@click.option("--serializer", default=None, help="The jobs' serializer, as given to `rq worker --serializer`.")
@click.option(
    "--rq-allow-class",
    multiple=True,
    metavar="PREFIX",
    help="Let envelopes name job classes/serializers under this module prefix, as for `delayq forward`.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be upgraded; change nothing.")
def rq_upgrade(
    spec: StoreSpec, rq_redis: Optional[str], serializer: Optional[str], rq_allow_class: tuple[str, ...], dry_run: bool
) -> None:
    """Put the schedule of Scheduler jobs stored by delayq_backends 0.1 into their envelopes.

    Reads each such job's meta with its serializer (a pickle by default) in this process, so run
    it where you would run `rq worker`. Scheduled items and dead letters are rewritten in place;
    safe to run again. Then `delayq dlq requeue` the upgraded dead letters.
    Exit code 1 if some could not be upgraded.
    """
    from .rq import ClassAllowlist, upgrade

    store = spec.open(writes=True)
    client = connect(rq_redis or spec.url)
    click.get_current_context().call_on_close(client.close)
    report = upgrade(
        cast(redis.Redis, client), store, serializer=serializer,
        allow_classes=ClassAllowlist.configured(rq_allow_class), dry_run=dry_run,
    )  # fmt: skip
    verb = "would upgrade" if dry_run else "upgraded"
    for what, done in (("scheduled", report.upgraded), ("dead letter", report.upgraded_dead)):
        for item_id, schedule in done.items():
            click.echo(f"{verb} {what} {item_id}: schedule {json.dumps(schedule, sort_keys=True)}")
    for item_id in report.gone:
        click.echo(f"left {item_id}: its job hash is gone (the forwarder skips it)")
    for item_id in report.changed:
        click.echo(f"left {item_id}: it changed while being read (forwarded or scheduled again); run again")
    for item_id, why in report.failed:
        click.echo(f"FAILED {item_id}: {why}", err=True)
    requeue = f"; requeue these with `delayq dlq requeue {' '.join(report.upgraded_dead)}`"
    click.echo(
        f"{verb} {len(report.upgraded)} scheduled item(s) and {len(report.upgraded_dead)} dead letter(s) in "
        f"{redact_url(spec.url)} prefix {spec.prefix!r}" + (requeue if report.upgraded_dead else "")
    )
    if report.failed:
        raise click.exceptions.Exit(1)


# -- security ---------------------------------------------------------------------------------


@main.command()
@click.argument("role", type=click.Choice(sorted(ROLES)))
@click.option("--prefix", envvar="DELAYQ_PREFIX", show_envvar=True, default="delayq", show_default=True)
@click.option("--user", default=None, help="User name. [default: delayq-ROLE]")
@click.option(
    "--functions/--eval",
    default=True,
    show_default=True,
    help="Let the role run the scripts only as the installed Function library (FCALL; run `delayq functions "
    "install` first), or (--eval, for Redis < 7) as EVAL scripts, which also lets it run any Lua of its own.",
)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="PATH",
    help="The user's password, read from this file. [default: a <password> placeholder; --apply asks for it]",
)
@click.option(
    "--apply",
    is_flag=True,
    help="Run ACL SETUSER over --url/--url-file (an admin's; every node of a cluster) instead of printing it.",
)
@url_option
def acl(
    role: str, prefix: str, user: Optional[str], functions: bool, password_file: Optional[Path], apply: bool, url: str
) -> None:
    """Print (or --apply) the least-privilege ACL SETUSER command for a ROLE on a prefix.

    producer: schedule, reschedule, cancel. forwarder: claim, ack, release, fail, wake-ups.
    reader: stats, list, dead-letter list. The printed arguments are quoted for a POSIX shell:
    put `redis-cli -h HOST -p PORT` (and the admin's credentials) in front. Keys of the targets
    (RQ queues, lists) are not included: grant those separately.
    """
    name = user or f"delayq-{role}"
    password = _read_secret(password_file, "--password-file") if password_file else None
    if apply and password is None:
        password = click.prompt(f"password of {name}", hide_input=True, confirmation_prompt=True)
    command = acl_setuser(name, prefix, role, password=password, functions=functions)
    if not apply:
        if functions and role != "reader":
            click.echo("# FCALL only: run `delayq functions install --url <admin URL>` on this server first", err=True)
        click.echo(" ".join(shlex.quote(arg) for arg in command))
        return
    client = connect(url)
    click.get_current_context().call_on_close(client.close)
    if isinstance(client, RedisCluster):  # users live in each node, replicas included
        client.execute_command(*command, target_nodes=RedisCluster.ALL_NODES)
    else:
        client.execute_command(*command)
    click.echo(f"user {name!r} ({role} on prefix {prefix!r}) set on {redact_url(url)}")
    if functions and role != "reader" and not all(node.current for node in functions_status(client)):
        click.echo(f"warning: {LIBRARY} is not installed everywhere: run `delayq functions install`", err=True)


@main.group("functions")
def functions_group() -> None:
    """The scripts as a Redis/Valkey 7+ Function library, so roles need FCALL only (no EVAL).

    Until the library is installed, stores run the scripts with EVALSHA/EVAL, which FCALL-only
    users may not send.
    """


@functions_group.command("install")
@url_option
def functions_install(url: str) -> None:
    """Load this version's library on the server (on every primary of a cluster); needs an admin URL.

    Libraries of other delayq versions stay, for clients still running them: a rolling upgrade
    installs the new one first.
    """
    client = connect(url)
    click.get_current_context().call_on_close(client.close)
    _print_functions(install_functions(client), "installed")


@functions_group.command("status")
@url_option
def functions_status_command(url: str) -> None:
    """Show the delayq libraries on each server. Exit code 1 if this version's is missing anywhere."""
    client = connect(url)
    click.get_current_context().call_on_close(client.close)
    nodes = functions_status(client)
    _print_functions(nodes, "found")
    if not all(node.current for node in nodes):
        raise click.exceptions.Exit(1)


def _print_functions(nodes: Sequence[NodeFunctions], verb: str) -> None:
    for node in nodes:
        others = [lib for lib in node.libraries if lib != LIBRARY]
        state = f"{LIBRARY} {verb}" if node.current else f"{LIBRARY} MISSING (run `delayq functions install`)"
        click.echo(f"{node.node}: {state}" + (f"; other versions: {', '.join(others)}" if others else ""))


# -- demo -------------------------------------------------------------------------------------


@main.command()
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
def demo(url: Optional[str], items: int, spread: float, shards: int) -> None:
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


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def spark(args: Sequence[str]) -> None:
    """Bulk scheduling and audits with Apache Spark: `delayq spark --help` (needs delayq_backends[spark])."""
    # loaded here, so `delayq` starts without importing pyspark
    _extra("spark.command").spark.main(args=list(args), prog_name="delayq spark")


main.command("exporter")(store_options(exporter_command))
main.add_command(importlib.import_module("delayq_backends.web.command").dashboard_command())

if __name__ == "__main__":
    main()
