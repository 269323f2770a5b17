"""The forwarder's settings: each field's :class:`~delayq_backends.config.Setting` holds its
default, range, help and names, which ``delayq forward``'s options, the Celery settings and
docs/configuration.md read, so a default changes in one place."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Setting, check_settings, setting
from ..flow import FlowControl
from ..store import START_HOLD_MS

__all__ = ["LOSSLESS", "LOSSLESS_WINDOW", "MAX_BATCH", "ForwarderSettings"]

#: Most items one claim takes; claim.lua cuts a bigger limit to it (MAX_CLAIM), since a claim blocks
#: its Redis while it runs.
MAX_BATCH = 10_000

#: lossless mode's window when it is turned on with none given
LOSSLESS_WINDOW = 60.0

#: ``--lossless``/``delayq_lossless``: turns on :attr:`ForwarderSettings.lossless_window` (at its default
#: unless given); a field of no record, since the window's None already says "off"
LOSSLESS = Setting(
    "Keep each published Celery task in the store until a worker records its start, and publish it again if "
    "none does within the lossless window: a message the broker lost becomes a late run. Needs workers with "
    "dedupe (delayq_dedupe = True).", False, flag="--lossless", envvar="DELAYQ_LOSSLESS", celery="delayq_lossless",
    name="lossless",
)  # fmt: skip


@dataclass(frozen=True)
class ForwarderSettings:
    """How a :class:`~delayq_backends.forwarder.Forwarder` forwards (not what it forwards to).

    ``overlap`` (``--claim-ahead``) lets one forwarder's throughput approach the slower of client
    and server, not their sum (:mod:`.overlap`). Off by default: with the store and a list target
    on one server, both stages wait on that server and the client's GIL, and the overlapped
    forwarder measured 0.8-0.9x the serial one (``bench/core.py --quick --only forwarding``).
    """

    # fmt: off
    # (a table: one setting per entry)
    batch: int = setting(200, "Items per claim; a claim blocks Redis while it runs, so keep it modest (100-500).",
        low=1, high=MAX_BATCH, flag="--claim-size", aliases=("--batch",), metavar="N")
    poll_interval: float = setting(1.0, "Longest sleep in seconds, so a lost wake-up never strands an item.", low=0.01,
        flag="--poll", metavar="SECONDS")
    retry_delay: float = setting(
        1.0, "First delay in seconds before a failed item is retried; doubles per attempt.", low=0.0)
    max_retry_delay: float = setting(300.0, "Longest delay in seconds before a failed item is retried.", low=0.0)
    max_outage_backoff: float = setting(
        10.0, "Longest pause in seconds while a broker or the store is unreachable.", low=0.0)
    meta_watch: float = setting(5.0, "Seconds between two checks that the store's metadata did not change under it.",
        low=0.1, flag="--meta-watch", metavar="SECONDS")
    name: str | None = setting(None, "This forwarder's name in logs and audit records.", kind=str, shown="host:pid")
    flow: FlowControl = FlowControl()
    lossless_window: float | None = setting(None,
        "Lossless mode (None: off; on with --lossless at 60): seconds a published task may wait for its "
        "start before it is published again; above the broker queue's wait, below the workers' dedupe TTL.", low=1.0,
        high=86400.0, kind=float, flag="--lossless-window", envvar="DELAYQ_LOSSLESS_WINDOW",
        celery="delayq_lossless_window", metavar="SECONDS", shown="off (60 with --lossless)")
    slot_start_window: float = setting(START_HOLD_MS / 1000,
        "Seconds a concurrency slot taken at release waits for its task's start: above the "
        "longest a slotted message waits in the broker (a later start may run over the limit), and what a message "
        "nobody reads costs its key.", low=1.0, high=3600.0, flag="--slot-start-window",
        envvar="DELAYQ_SLOT_START_WINDOW", metavar="SECONDS")
    overlap: bool = setting(False, "Claim the next pass while this one is published. It helps when the broker "
        "waits on its own (RabbitMQ's confirms); with the store and the target on one server it measured 0.8-0.9x.",
        flag="--claim-ahead", aliases=("--overlap",))
    # fmt: on

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def keep_ms(self) -> int:
        """Lossless mode's window in ms (0: off)."""
        return 0 if self.lossless_window is None else int(self.lossless_window * 1000)
