"""The forwarder's composition root: from typed settings to a running forwarder.

``delayq forward``, ``celery -A proj delayq forward`` and any application that runs a
forwarder in its own process build it here, so the store, the targets, flow control, metrics
and the audit log are wired the same way everywhere. Interfaces parse their options into a
:class:`ProcessSettings`; nothing here knows a command-line flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from .audit import open_audit
from .config import Config
from .connection import connect, redact_url
from .flow import FlowControl
from .forwarder import Forwarder, ForwarderStats
from .forwarder import settings as forwarding
from .kinds import KINDS
from .metrics import DEFAULT_METRICS_HOST, ForwarderMetrics, LabelBounds, serve_metrics
from .store import DelayStore
from .storespec import open_store
from .targets import RedisListTarget, Target

__all__ = [
    "AssembledForwarder",
    "DescribedTarget",
    "ForwarderSettings",
    "ProcessSettings",
    "build_forwarder",
    "list_targets",
]


@dataclass(frozen=True)
class ProcessSettings:
    """Everything a forwarder process is configured with.

    Attributes:
        store: the store, with the lease and attempt limits the forwarder claims under.
        batch: items per claim.
        poll: longest sleep in seconds, so a lost wake-up never strands an item.
        meta_watch: seconds between two checks that the store's metadata did not change.
        log_every: seconds between two summary log lines.
        flow: back-pressure and rate caps per queue.
        audit_dir, audit_stream: where to log one record per forwarded item (one or neither).
        metrics_port: serve Prometheus metrics on this port (None: off), on ``metrics_host``.
        metrics_queues: queues labelled by name in the metrics (flow-controlled ones are too).
        list_target: deliver ``list`` envelopes, to ``list_redis`` (None: the store's server).
        celery_broker: deliver ``celery`` envelopes (and periodic entries) to this broker.
        rq_redis: deliver ``rq`` envelopes to the RQ queues of this Redis, and fire RQ periodic
            entries (``rq-periodic``) there.
        rq_allow_classes: module prefixes RQ envelopes may name classes under.
        rq_class_retry: seconds RQ jobs naming a class off that allowlist wait before the
            forwarder looks again (None: the target's default, 30 s).
        rq_adopt: move jobs a plain ``rq.Queue`` put in ``rq:scheduled:*`` into the store.
        overlap: claim the next pass while this one is published (see
            :class:`~delayq_backends.forwarder.ForwarderSettings`).
        lossless_window: lossless mode (None: off): seconds a published Celery task is kept
            until a worker with dedupe reports its start, then published again (see
            :class:`~delayq_backends.forwarder.Forwarder`).
        slot_start_window: seconds a concurrency slot taken at release waits for its task's
            start (see :class:`~delayq_backends.forwarder.ForwarderSettings`).
    """

    store: Config
    batch: int = forwarding.BATCH.default
    poll: float = forwarding.POLL.default
    meta_watch: float = forwarding.META_WATCH.default
    log_every: float = 10.0
    flow: FlowControl = field(default_factory=FlowControl)
    audit_dir: str | None = None
    audit_stream: str | None = None
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST
    metrics_queues: tuple[str, ...] = ()
    list_target: bool = True
    list_redis: str | None = None
    celery_broker: str | None = None
    rq_redis: str | None = None
    rq_allow_classes: tuple[str, ...] = ()
    rq_class_retry: float | None = None
    rq_adopt: bool = True
    lossless_window: float | None = None
    overlap: bool = forwarding.OVERLAP_DEFAULT
    slot_start_window: float = forwarding.SLOT_START_WINDOW.default

    def forwarding(self) -> forwarding.ForwarderSettings:
        """The settings of the :class:`Forwarder` itself (checked there)."""
        return forwarding.ForwarderSettings(
            batch=self.batch,
            poll_interval=self.poll,
            meta_watch=self.meta_watch,
            flow=self.flow,
            lossless_window=self.lossless_window,
            overlap=self.overlap,
            slot_start_window=self.slot_start_window,
        )


#: The name :class:`ProcessSettings` had before the forwarder got settings of its own
#: (:class:`~delayq_backends.forwarder.ForwarderSettings`); kept so code written for 0.1 runs.
ForwarderSettings = ProcessSettings


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
            f"targets: {targets}; flow control: {s.flow.describe()}"
            + (f"; audit: {self.audit!r}" if self.audit else "")
            + (f"; metrics: http://{s.metrics_host}:{s.metrics_port}/metrics" if s.metrics_port is not None else "")
            + (f"; lossless: republished if not started within {s.lossless_window:g} s" if s.lossless_window else "")
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
            flow = settings.flow
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
            settings.forwarding(),
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
