"""``delayq forward``: run a forwarder, built by :func:`~delayq_backends.assemble.build_forwarder`
from the options; ``celery -A proj delayq forward`` shares the options and the run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import click

from ..assemble import DescribedTarget, ProcessSettings, build_forwarder
from ..config import Config
from ..errors import ConfigError
from ..flow import FlowControl, parse_depth, parse_rate
from ..forwarder.settings import (
    BATCH,
    LOSSLESS_WINDOW,
    META_WATCH,
    OVERLAP_DEFAULT,
    OVERLAP_HELP,
    POLL,
    SLOT_START_WINDOW,
    Setting,
)
from ..group_policies import GROUP_POLICIES_ENV, GroupPolicies
from ..metrics import DEFAULT_METRICS_HOST
from ..store import DelayStore
from ..storespec import StoreSpec, open_store
from .options import (
    celery_broker_option,
    closing,
    configure_logging,
    rq_redis_option,
    secret_option,
    store_options,
)
from .rq import schedule_version_option, sync_rq_cron

#: the store's own defaults (lease, attempts), shown by the options that override them
_STORE_DEFAULTS = {f.name: f.default for f in fields(Config)}

__all__ = ["ForwardOptions", "forward", "forward_options", "run_forwarder"]


def _seconds_option(
    name: str, setting: Setting[float], envvar: str | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A forwarder interval in seconds as an option: its range, default and help from ``setting``."""
    return click.option(
        name,
        type=click.FloatRange(min=setting.low, max=setting.high),
        default=setting.default,
        show_default=True,
        envvar=envvar,
        show_envvar=envvar is not None,
        metavar="SECONDS",
        help=setting.help,
    )


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
        meta_watch: float,
        log_level: str,
        log_every: float,
        audit_dir: str | None,
        audit_stream: str | None,
        metrics_port: int | None,
        metrics_host: str,
        metrics_queue: tuple[str, ...],
        max_queue_depth: dict[str, int],
        rate: dict[str, float],
        key_rate: dict[str, float],
        lossless: bool | None,
        lossless_window: float | None,
        max_payload_bytes: int | None,
        overlap: bool,
        slot_start_window: float,
        group_policy: GroupPolicies,
        **kwargs: Any,
    ) -> None:
        flow = FlowControl(max_queue_depth, rate, key_rate)
        run = ForwardOptions(
            batch, lease, max_attempts, poll, log_level, log_every, audit_dir, audit_stream,
            metrics_port, metrics_host, flow, metrics_queue, lossless, lossless_window, max_payload_bytes, overlap,
            meta_watch, slot_start_window, group_policy,
        )  # fmt: skip
        command(*args, run=run, **kwargs)

    options: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
        click.option(
            "--batch",
            type=click.IntRange(BATCH.low, BATCH.high),
            default=BATCH.default,
            show_default=True,
            help=BATCH.help,
        ),
        click.option(
            "--lease",
            type=float,
            default=_STORE_DEFAULTS["lease_seconds"],
            show_default=True,
            metavar="SECONDS",
            help="How long claimed items stay ours before another forwarder may take them.",
        ),
        click.option(
            "--max-attempts",
            type=int,
            default=_STORE_DEFAULTS["max_attempts"],
            show_default=True,
            help="Claims of one item before it goes to the dead letters.",
        ),
        click.option(
            "--max-payload-bytes",
            type=click.IntRange(64, 512 * 1024 * 1024),
            default=None,
            envvar="DELAYQ_MAX_PAYLOAD_BYTES",
            show_envvar=True,
            help="Bigger envelopes are dead-lettered at claim, never read into the forwarder; set it as on "
            "the producers [default: the app's delayq_max_payload_bytes, else 1048576].",
        ),
        _seconds_option("--poll", POLL),
        _seconds_option("--meta-watch", META_WATCH),
        _seconds_option("--slot-start-window", SLOT_START_WINDOW, "DELAYQ_SLOT_START_WINDOW"),
        click.option("--overlap/--no-overlap", default=OVERLAP_DEFAULT, show_default=True, help=OVERLAP_HELP),
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
            help="Label metrics with this queue's name (queues of --rate/--key-rate/--max-queue-depth are too); "
            "every other "
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
        click.option(
            "--key-rate",
            envvar="DELAYQ_KEY_RATE",
            show_envvar=True,
            multiple=True,
            metavar="QUEUE=N/s",
            callback=_specs(parse_rate),
            help="Forward at most N items per second (or N/m, N/h) of each rate key (a tenant: Celery header "
            "delayq_rate_key, RQ meta delayq_rate_key) to QUEUE, all forwarders together; items without a key "
            "are not held. Repeatable (env: space-separated).",
        ),
        click.option(
            "--group-policy",
            multiple=True,
            metavar="PATTERN=JSON",
            callback=_group_policies,
            help='Policy of the groups whose key matches PATTERN (a glob), e.g. \'tenant-*={"limit": 2, "rate": '
            '"10/s", "weight": 1}\': below the items\' own values and the runtime policy (delayq groups set). '
            f"Repeatable; the first matching pattern that sets a value wins; env {GROUP_POLICIES_ENV} (a JSON "
            "object of pattern -> policy) adds more after these.",
        ),
        click.option(
            "--lossless/--no-lossless",
            envvar="DELAYQ_LOSSLESS",
            show_envvar=True,
            default=None,
            help="Keep each published Celery task in the store until a worker records its start, and publish it "
            "again if none does within --lossless-window: a message the broker lost becomes a late run. Needs "
            "workers with dedupe (delayq_dedupe = True). [default: off; celery: the app's delayq_lossless]",
        ),
        click.option(
            "--lossless-window",
            envvar="DELAYQ_LOSSLESS_WINDOW",
            show_envvar=True,
            type=click.FloatRange(LOSSLESS_WINDOW.low, LOSSLESS_WINDOW.high),
            default=None,
            metavar="SECONDS",
            help=f"{LOSSLESS_WINDOW.help} [default: {LOSSLESS_WINDOW.default:g}; celery: the app's "
            "delayq_lossless_window]",
        ),
    ]
    for option in reversed(options):
        with_run = option(with_run)
    return with_run


def _group_policies(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> GroupPolicies:
    """``--group-policy`` options, ahead of ``DELAYQ_GROUP_POLICIES``."""
    try:
        return GroupPolicies.from_env().merged(GroupPolicies.from_specs(values))
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from exc


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
    """How a forwarder runs, from :func:`forward_options`: its settings but the store and targets."""

    batch: int
    lease: float
    max_attempts: int
    poll: float
    log_level: str
    log_every: float
    audit_dir: str | None = None
    audit_stream: str | None = None
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST
    flow: FlowControl = field(default_factory=FlowControl)
    metrics_queues: tuple[str, ...] = ()
    #: None: not given (the Celery command then takes the app's setting)
    lossless: bool | None = None
    lossless_window: float | None = None
    #: None: not given (the store's, the Celery app's setting for its command)
    max_payload_bytes: int | None = None
    overlap: bool = OVERLAP_DEFAULT
    meta_watch: float = META_WATCH.default
    slot_start_window: float = SLOT_START_WINDOW.default
    #: --group-policy and DELAYQ_GROUP_POLICIES, ahead of the app's (Celery) patterns
    group_policies: GroupPolicies = GroupPolicies()

    def lossless_seconds(self, default: float | None = None) -> float | None:
        """Lossless mode's window in seconds, or None when off; ``default`` is the app's when
        ``--lossless`` was not given."""
        if self.lossless is None:
            return None if default is None else (self.lossless_window or default)
        return (self.lossless_window or LOSSLESS_WINDOW.default) if self.lossless else None

    def settings(self, store: Config, **overrides: Any) -> ProcessSettings:
        """The :class:`ProcessSettings` of these options for ``store``; ``overrides`` set the
        targets (and may replace any other field)."""
        settings = ProcessSettings(
            store=replace(
                store, lease_seconds=self.lease, max_attempts=self.max_attempts,
                max_payload_bytes=self.max_payload_bytes or store.max_payload_bytes,
                group_policies=store.group_policies.merged(self.group_policies),
            ),
            batch=self.batch, poll=self.poll, meta_watch=self.meta_watch, log_every=self.log_every, flow=self.flow,
            audit_dir=self.audit_dir, audit_stream=self.audit_stream, metrics_port=self.metrics_port,
            metrics_host=self.metrics_host, metrics_queues=self.metrics_queues,
            lossless_window=self.lossless_seconds(), overlap=self.overlap, slot_start_window=self.slot_start_window,
        )  # fmt: skip
        return replace(settings, **overrides)


def run_forwarder(
    settings: ProcessSettings,
    *,
    log_level: str,
    store: DelayStore | None = None,
    targets: Sequence[DescribedTarget] = (),
) -> None:
    """Configure logging, build the forwarder, say what it forwards where, and forward until
    SIGTERM/SIGINT (then finish the batch and return)."""
    configure_logging(log_level)
    with build_forwarder(settings, store=store, targets=targets) as assembled:
        click.echo(f"delayq forward: {assembled.describe()}", err=True)
        assembled.run()


@click.command()
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
    "--rq-class-retry",
    envvar="DELAYQ_RQ_CLASS_RETRY",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="SECONDS",
    help="How long RQ jobs naming a queue/job class off the allowlist wait before this forwarder looks "
    "again. [default: 30]",
)
@click.option(
    "--rq-adopt/--no-rq-adopt",
    default=True,
    envvar="DELAYQ_RQ_ADOPT",
    show_default=True,
    help="Every second, move jobs that a plain rq.Queue scheduled into RQ's rq:scheduled:<queue> into the "
    "store (with a warning), so they do not stall without an RQ scheduler.",
)
@click.option(
    "--rq-cron",
    metavar="CONFIG",
    default=None,
    envvar="DELAYQ_RQ_CRON",
    help="An `rq cron` config (module path or .py file): sync its cron.register entries into the store at start "
    "and fire them (with --rq-redis), instead of running `rq cron`.",
)
@schedule_version_option
def forward(
    spec: StoreSpec,
    run: ForwardOptions,
    list_redis: str | None,
    celery_broker: str | None,
    rq_redis: str | None,
    rq_allow_class: tuple[str, ...],
    rq_class_retry: float | None,
    rq_adopt: bool,
    rq_cron: str | None,
    schedule_version: int | None,
) -> None:
    """Forward due items to their targets until SIGTERM/SIGINT, then finish the batch and exit 0.

    Run as many as you like, anywhere: leases make every claim exclusive.
    """
    settings = run.settings(
        spec.config(), list_redis=list_redis, celery_broker=celery_broker, rq_redis=rq_redis,
        rq_allow_classes=rq_allow_class, rq_class_retry=rq_class_retry, rq_adopt=rq_adopt,
    )  # fmt: skip
    store = None
    if rq_cron is not None:
        if not rq_redis:
            raise click.BadParameter("RQ cron entries run on RQ's Redis: add --rq-redis URL", param_hint="--rq-cron")
        store = open_store(settings.store, writes=True)  # with the run's settings (group policies)
        closing(store.client)
        _sync_at_start(store, rq_cron, schedule_version)
    run_forwarder(settings, log_level=run.log_level, store=store)


def _sync_at_start(store: DelayStore, config: str, version: int | None) -> None:
    """Sync the rq cron config; a config that cannot load stops the start (ConfigError), a store
    that cannot sync does not: the entries already stored keep firing as last synced."""
    from ..rq.cron import load_config

    loaded = load_config(config)  # a config that cannot load is the operator's to fix now
    try:
        sync_rq_cron(store, loaded, version, at_start=True)
    except Exception as exc:
        click.echo(
            f"rq cron entries NOT synced ({type(exc).__name__}: {exc}); those already stored keep running as last "
            f"synced: run `delayq rq-cron sync {config}` once the store answers",
            err=True,
        )
