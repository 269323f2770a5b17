"""The forwarder's composition root: from typed settings to a running forwarder.

``delayq forward``, ``celery -A proj delayq forward`` and any application that runs a
forwarder in its own process build it here, so the store, the targets, flow control, metrics
and the audit log are wired the same way everywhere. Interfaces parse their options into a
:class:`ProcessSettings`; nothing here knows a command-line flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, cast

import redis

from .audit import open_audit
from .config import Config, check_settings, setting
from .connection import connect, redact_url
from .forwarder import Forwarder, ForwarderSettings, ForwarderStats
from .kinds import KINDS
from .metrics import DEFAULT_METRICS_HOST, ForwarderMetrics, LabelBounds, serve_metrics
from .store import DelayStore
from .storespec import open_store
from .targets import RedisListTarget, Target

__all__ = ["AssembledForwarder", "DescribedTarget", "ProcessSettings", "build_forwarder", "list_targets"]


@dataclass(frozen=True)
class ProcessSettings:
    """Everything a forwarder process is configured with: the store's :class:`Config` (with the
    lease and attempt limits the forwarder claims under), the forwarder's own
    :class:`ForwarderSettings`, and what the process adds around them (logs, audit, metrics,
    targets); each field's :class:`~delayq_backends.config.Setting` says what it is."""

    # fmt: off
    # (a table: one setting per entry)
    store: Config
    forwarder: ForwarderSettings = ForwarderSettings()
    log_level: str = setting("info", "debug logs one line per batch.", choices=("debug", "info", "warning", "error"),
        flag="--log-level", envvar="DELAYQ_LOG_LEVEL")
    log_every: float = setting(10.0, "Interval of the summary line (forwarded, retried, dead, lateness).", low=0.1,
        flag="--log-every", metavar="SECONDS")
    audit_dir: str | None = setting(None,
        "Log one JSON line per forwarded item to rotating files in DIR (for `delayq spark audit`).", kind=str,
        flag="--audit-dir", envvar="DELAYQ_AUDIT_DIR", metavar="DIR")
    audit_stream: str | None = setting(None,
        "Log one entry per forwarded item to this Redis stream of the store's server (about 1M kept).", kind=str,
        flag="--audit-stream", envvar="DELAYQ_AUDIT_STREAM", metavar="KEY")
    metrics_port: int | None = setting(None,
        "Serve Prometheus metrics (this forwarder's counters, the store's gauges) on PORT.", kind=int, low=1,
        high=65535, flag="--metrics-port", envvar="DELAYQ_METRICS_PORT", metavar="PORT", shown="off")
    metrics_host: str = setting(DEFAULT_METRICS_HOST,
        "Address the metrics listen on; 0.0.0.0 to be scraped from other hosts (e.g. in a container).",
        flag="--metrics-host", envvar="DELAYQ_METRICS_HOST", metavar="ADDR")
    metrics_queues: tuple[str, ...] = setting((),
        "Label metrics with this queue's name (queues of --rate/--key-rate/--max-queue-depth are too); every "
        "other queue counts as 'other', so item data cannot grow the series. Repeatable (env: space-separated).",
        flag="--metrics-queue", envvar="DELAYQ_METRICS_QUEUE", metavar="QUEUE", specs=tuple)
    list_target: bool = setting(True, "Deliver `list` envelopes (RPUSH onto the list each names).")
    list_redis: str | None = setting(None, "Redis of the list target (RPUSH onto the list each envelope names).",
        kind=str, flag="--list-redis", envvar="DELAYQ_LIST_REDIS", shown="`--url`")
    celery_broker: str | None = setting(None,
        "Celery's broker_url (amqp://, redis://, ...): forward delayed Celery tasks (and fire periodic entries) there.",
        kind=str, flag="--celery-broker", envvar="DELAYQ_CELERY_BROKER")
    rq_redis: str | None = setting(None,
        "Redis of the RQ queues: adds the rq target (may equal --url) and fires RQ periodic entries there.", kind=str,
        flag="--rq-redis", envvar="DELAYQ_RQ_REDIS", shown="no rq target")
    rq_allow_classes: tuple[str, ...] = setting((),
        "Let RQ envelopes name queue/job classes under this dotted module prefix (whole components; rq and "
        "delayq_backends always allowed). Repeatable; env DELAYQ_RQ_ALLOW_CLASS adds more (space-separated).",
        flag="--rq-allow-class", metavar="PREFIX", specs=tuple)
    rq_class_retry: float | None = setting(None,
        "How long RQ jobs naming a queue/job class off the allowlist wait before this forwarder looks again.",
        kind=float, low=0.1, flag="--rq-class-retry", envvar="DELAYQ_RQ_CLASS_RETRY", metavar="SECONDS", shown="`30`")
    rq_adopt: bool = setting(True, "Every second, move jobs that a plain rq.Queue scheduled into RQ's "
        "rq:scheduled:<queue> into the store (with a warning), so they do not stall without an RQ scheduler.",
        flag="--rq-adopt", envvar="DELAYQ_RQ_ADOPT")
    # fmt: on

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class DescribedTarget:
    """A target with the line the banner shows for it (where it delivers, password hidden)."""

    target: Target
    description: str


@dataclass
class AssembledForwarder:
    """A built forwarder and what it opened; :meth:`close` (or ``with``) releases all of it."""

    forwarder: Forwarder
    settings: ProcessSettings
    targets: list[DescribedTarget]
    audit: Any
    resources: ExitStack

    def __enter__(self) -> AssembledForwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.resources.close()

    def describe(self) -> str:
        """One banner line: the store, the targets, flow control, audit and metrics."""
        config, s = self.forwarder.store.config, self.settings
        targets = "; ".join(t.description for t in self.targets if t.description)
        return (
            f"store {redact_url(config.url)} prefix {config.prefix!r}, {config.shards} shards; "
            f"targets: {targets}; flow control: {s.forwarder.flow.describe()}"
            + (f"; audit: {self.audit!r}" if self.audit else "")
            + (f"; metrics: http://{s.metrics_host}:{s.metrics_port}/metrics" if s.metrics_port is not None else "")
            + (f"; lossless: republished if not started within {w:g} s" if (w := s.forwarder.lossless_window) else "")
        )

    def run(self) -> ForwarderStats:
        """Forward until SIGTERM/SIGINT (then finish the batch); returns the totals."""
        return self.forwarder.run(log_every=self.settings.log_every)

    def run_until_idle(self) -> ForwarderStats:
        """Forward what is due now, then return (:meth:`Forwarder.run_until_idle`)."""
        return self.forwarder.run_until_idle()


def build_forwarder(
    settings: ProcessSettings,
    *,
    store: DelayStore | None = None,
    targets: Sequence[DescribedTarget] = (),
) -> AssembledForwarder:
    """Open the store (unless given), build the targets the settings name plus ``targets``,
    then metrics, audit and the :class:`Forwarder`.

    A ``store`` passed in stays the caller's to close; everything opened here is closed by
    :meth:`AssembledForwarder.close`, also when building fails half-way.

    Raises:
        ConfigError: an unusable URL, a missing extra, a metrics port in use, a bad audit setting.
        ShardMismatchError: the shard count differs from the one recorded for the prefix.
    """
    resources = ExitStack()
    try:
        if store is None:
            store = open_store(settings.store, writes=True)
            resources.callback(store.close)
        built = _targets(settings, store, resources) + list(targets)
        metrics = None
        if settings.metrics_port is not None:
            flow = settings.forwarder.flow
            queues = {*settings.metrics_queues, *flow.max_depth, *flow.rates, *flow.key_rates}
            bounds = LabelBounds(queues, [t.target.kind for t in built])
            metrics = ForwarderMetrics(store=store, bounds=bounds)
            serve_metrics(metrics.registry, settings.metrics_host, settings.metrics_port)
        audit = open_audit(
            directory=settings.audit_dir, stream=settings.audit_stream, url=store.config.url, stem="forwarded"
        )
        if audit is not None:
            resources.callback(audit.close)
        forwarder = Forwarder(
            store,
            [t.target for t in built],
            settings.forwarder,
            audit=audit,
            metrics=metrics,
        )
    except BaseException:
        resources.close()
        raise
    return AssembledForwarder(forwarder, settings, built, audit, resources)


def _targets(settings: ProcessSettings, store: DelayStore, resources: ExitStack) -> list[DescribedTarget]:
    """The targets of every kind whose setting is on, built by its row's factory (:mod:`.kinds`;
    an adapter is imported only when asked for); clients they open go on ``resources``."""
    factories = (k.targets for k in KINDS.values() if k.targets is not None and getattr(settings, k.setting))
    return [built for factory in factories for built in factory.load()(settings, store, resources)]


def list_targets(settings: ProcessSettings, store: DelayStore, resources: ExitStack) -> list[DescribedTarget]:
    """The list target (the ``targets`` of kind ``list``), delivering to ``settings.list_redis``."""
    url = settings.list_redis or store.config.url
    # the list target shares the store's connections when the lists live on the same server
    client = store.client if url == store.config.url else connect(url)
    if client is not store.client:
        resources.callback(client.close)
    # RPUSH in a non-transactional pipeline works the same on a RedisCluster
    return [DescribedTarget(RedisListTarget(cast(redis.Redis, client)), f"list -> {redact_url(url)}")]
