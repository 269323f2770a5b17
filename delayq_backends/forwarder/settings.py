"""The forwarder's settings, each defined, defaulted, bounded and explained once.

The CLI options (``delayq forward``), the Celery settings and the composition root read the
defaults, ranges and help from the :class:`Setting` records here, so a default changes in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..errors import ConfigError
from ..flow import FlowControl
from ..store import START_HOLD_MS

__all__ = [
    "BATCH",
    "LOSSLESS_WINDOW",
    "MAX_BATCH",
    "META_WATCH",
    "OVERLAP_DEFAULT",
    "OVERLAP_HELP",
    "POLL",
    "SLOT_START_WINDOW",
    "ForwarderSettings",
    "Setting",
]

N = TypeVar("N", int, float)

#: Most items one claim takes; claim.lua cuts a bigger limit to it (MAX_CLAIM), since a claim blocks
#: its Redis while it runs.
MAX_BATCH = 10_000


@dataclass(frozen=True)
class Setting(Generic[N]):
    """One numeric setting: its default, its range (``high`` None: unbounded) and what to say
    when a value is out of it."""

    default: N
    low: N
    high: N | None
    #: the option's help, also the hint of the error
    help: str

    def check(self, name: str, value: N) -> N:
        """``value``, or a :class:`ConfigError` naming ``name`` and the range to use."""
        if value < self.low or (self.high is not None and value > self.high):
            upper = "" if self.high is None else f" to {self.high:g}"
            raise ConfigError(f"{name}={value!r}: use {self.low:g}{upper or ' or more'} ({self.help})")
        return value


BATCH = Setting(200, 1, MAX_BATCH, "Items per claim; a claim blocks Redis while it runs, so keep it modest (100-500).")
POLL = Setting(1.0, 0.01, None, "Longest sleep in seconds, so a lost wake-up never strands an item.")
RETRY_DELAY = Setting(1.0, 0.0, None, "First delay in seconds before a failed item is retried; doubles per attempt.")
MAX_RETRY_DELAY = Setting(300.0, 0.0, None, "Longest delay in seconds before a failed item is retried.")
MAX_OUTAGE_BACKOFF = Setting(10.0, 0.0, None, "Longest pause in seconds while a broker or the store is unreachable.")
META_WATCH = Setting(5.0, 0.1, None, "Seconds between two checks that the store's metadata did not change under it.")
LOSSLESS_WINDOW = Setting(
    60.0,
    1.0,
    86400.0,
    "Lossless mode: seconds a published task may wait for its start before it is published again; above the "
    "broker queue's wait, below the workers' dedupe TTL.",
)
SLOT_START_WINDOW = Setting(
    START_HOLD_MS / 1000,
    1.0,
    3600.0,
    "Seconds a concurrency slot taken at release waits for its task's start: above the longest a slotted message "
    "waits in the broker (a later start may run over the limit), and what a message nobody reads costs its key.",
)

#: claims overlap publishes: off by default (see :attr:`ForwarderSettings.overlap`)
OVERLAP_DEFAULT = False
OVERLAP_HELP = (
    "Claim the next pass while this one is published. It helps when the broker waits on its own (RabbitMQ's "
    "confirms); with the store and the target on one server it measured 0.8-0.9x."
)


@dataclass(frozen=True)
class ForwarderSettings:
    """How a :class:`~delayq_backends.forwarder.Forwarder` forwards (not what it forwards to).

    Attributes:
        batch: items per claim (:data:`BATCH`).
        poll_interval: longest sleep (:data:`POLL`).
        retry_delay, max_retry_delay: back-off of a failed item, doubling per attempt, capped.
        max_outage_backoff: longest pause while a broker or the store is unreachable.
        meta_watch: seconds between two checks that the store's metadata is as checked at start.
        name: this forwarder's name in logs and audit records (default: host:pid).
        flow: back-pressure and rate caps per target queue (off by default).
        lossless_window: lossless mode (None: off; needs workers with dedupe on): seconds a
            published item is kept awaiting its start (see :mod:`.hooks`).
        slot_start_window: seconds a concurrency slot taken at release is held until its worker
            reports the task started (:data:`SLOT_START_WINDOW`; docs/slots.md weighs it).
        overlap: claim the next pass while the current one is published (:mod:`.overlap`), so
            one forwarder's throughput approaches the slower of client and server, not their
            sum. Off by default: with the store and a list target on one server, both stages
            wait on that server and the client's GIL, and the overlapped forwarder measured
            0.8-0.9x the serial one (``bench/core.py --quick --only forwarding``).
    """

    batch: int = BATCH.default
    poll_interval: float = POLL.default
    retry_delay: float = RETRY_DELAY.default
    max_retry_delay: float = MAX_RETRY_DELAY.default
    max_outage_backoff: float = MAX_OUTAGE_BACKOFF.default
    meta_watch: float = META_WATCH.default
    name: str | None = None
    flow: FlowControl = field(default_factory=FlowControl)
    lossless_window: float | None = None
    slot_start_window: float = SLOT_START_WINDOW.default
    overlap: bool = OVERLAP_DEFAULT

    def __post_init__(self) -> None:
        BATCH.check("batch", self.batch)
        POLL.check("poll_interval", self.poll_interval)
        RETRY_DELAY.check("retry_delay", self.retry_delay)
        MAX_RETRY_DELAY.check("max_retry_delay", self.max_retry_delay)
        MAX_OUTAGE_BACKOFF.check("max_outage_backoff", self.max_outage_backoff)
        META_WATCH.check("meta_watch", self.meta_watch)
        SLOT_START_WINDOW.check("slot_start_window", self.slot_start_window)
        if self.lossless_window is not None:
            LOSSLESS_WINDOW.check("lossless_window", self.lossless_window)

    @property
    def keep_ms(self) -> int:
        """Lossless mode's window in ms (0: off)."""
        return 0 if self.lossless_window is None else int(self.lossless_window * 1000)
