"""The forwarder's loop: passes while items are due, sleeps until the next is, wakes on a schedule."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from ..errors import ConfigError
from ..outages import CONNECTION_ERRORS, config_error, config_fix
from ..pauses import TargetPauses
from ..targets import CheckedTarget, Target
from .backoff import OutageBackoff, ShardBackoff
from .context import Context
from .groups import ReleaseStep
from .parking import RECHECK_EVERY_S, ParkedRecheck

__all__ = ["Loop"]

log = logging.getLogger("delayq.forwarder")

#: Errors that mean the store is unreachable or failing as a whole: the loop backs off.
STORE_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, redis.RedisError)
#: Shortest gap between two log lines about garbage on the wake channel (anyone allowed to
#: PUBLISH there could otherwise flood the log).
_BAD_WAKE_LOG_EVERY_S = 10.0


class Loop:
    """Forwards until stopped: sweeps what is due (``sweep``, given the heads), then sleeps until
    the earliest head of all shards (capped by ``poll_interval``), woken at once when a schedule
    makes some shard's head earlier; looks at the parked items every
    :data:`~.parking.RECHECK_EVERY_S` (``recheck``). Nothing read from Redis or the wake channel
    stops it: an outage backs off, an unforeseen error is logged and waited out."""

    def __init__(
        self,
        ctx: Context,
        sweep: Callable[[list[int | None]], int],
        backoffs: tuple[ShardBackoff, OutageBackoff],
        pauses: TargetPauses,
        poll_interval: float,
        stop: threading.Event,
        *,
        meta_watch: float,
        recheck: ParkedRecheck,
        lines: ReleaseStep,
    ) -> None:
        self.ctx = ctx
        self.recheck = recheck
        self.lines = lines
        self.store = ctx.store
        self.sweep = sweep
        self.shards, self.outages = backoffs
        self.pauses = pauses
        self.poll_interval = poll_interval
        self.stop = stop
        #: how often the store's metadata is re-read, to see it was not changed under this forwarder
        self.meta_watch = meta_watch
        self._bad_wakes = 0
        self._bad_wake_logged = 0.0

    def heads(self) -> list[int | None]:
        """The store's heads; if they cannot be read as numbers (a score written straight into
        Redis), every shard reads as due, so each is tried and a bad one is set aside alone."""
        try:
            lines: list[int | None] = []
            heads = self.store.heads(lines=lines)
            self.lines.saw(lines)
            return heads
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:
            log.error("cannot read the shards' heads (%s: %s); trying every shard", type(exc).__name__, exc)
            return [0] * self.store.shards

    def run(self, *, install_signals: bool, log_every: float, summary: Callable[[], None]) -> None:
        """Forward until the stop event (set by SIGTERM/SIGINT too); ``summary`` logs the totals."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop.set())
        pubsub = self.subscribe()
        last_log = last_watch = time.monotonic()
        next_recheck = 0.0  # at once: an upgraded forwarder releases what waited for it
        try:
            while not self.stop.is_set():
                try:
                    if time.monotonic() >= next_recheck:
                        again = self.recheck.run()
                        next_recheck = time.monotonic() + (0 if again else RECHECK_EVERY_S)
                    self.lines.apply_wakes()
                    heads = self.heads()
                    if self.sweep(heads) == 0:  # nothing was claimed, so these heads still hold
                        pubsub = self.sleep(pubsub, heads)
                except STORE_ERRORS as exc:  # never die of the store: back off, retry
                    self.ctx.stats.outages += 1
                    self.outages.pause(f"delay store unreachable or failing ({type(exc).__name__}: {exc})")
                    pubsub = self.subscribe(pubsub)
                except Exception:  # a bug or a value no check foresaw: say so once, pause, go on
                    self.ctx.stats.errors += 1
                    log.exception("forwarder loop failed; going on in %.1f s", self.poll_interval)
                    self.stop.wait(self.poll_interval)
                if time.monotonic() - last_watch >= self.meta_watch:
                    last_watch = time.monotonic()
                    self.watch_meta()
                if time.monotonic() - last_log >= log_every:
                    last_log = time.monotonic()
                    summary()
        finally:
            if pubsub is not None:
                pubsub.close()

    def watch_meta(self) -> None:
        """Say loudly (an error line, a metric) when the store's metadata changed under this
        forwarder; it goes on with the layout it checked at start against the shard keys."""
        try:
            drift = self.store.meta_drift()
        except STORE_ERRORS:
            return  # an outage: the loop reports it
        if drift is not None:
            self.ctx.stats.meta_alarms += 1
            if self.ctx.metrics is not None:
                self.ctx.metrics.meta_alarms.inc()
            log.error("store metadata changed: %s", drift)

    def subscribe(self, old: Any = None) -> Any:
        if old is not None:
            old.close()
        try:
            pubsub = self.store.subscribe_wake()
            pubsub.subscribe(self.store.group_wake_channel)  # a worker's end names its group there
            return pubsub
        except CONNECTION_ERRORS as exc:
            log.warning(
                "cannot subscribe to %s (%s); polling every %.1f s", self.store.wake_channel, exc, self.poll_interval
            )
            return None

    def sleep(self, pubsub: Any, heads: list[int | None]) -> Any:
        """Wait until the earliest head is due, a wake-up says an earlier one is, or the poll.

        A schedule after ``heads`` were read is not missed: its wake-up waits in ``pubsub``.
        """
        now = self.ctx.clock()
        waiting = (h for s, h in enumerate(heads) if h is not None and not self.shards.aside(s, now))
        wake_at = min([now + int(self.poll_interval * 1000), *waiting, *self.shards.ends_after(now)])
        while not self.stop.is_set():
            remaining = (wake_at - self.ctx.clock()) / 1000
            if remaining <= 0:
                break
            if pubsub is None:
                self.stop.wait(remaining)
                break
            try:
                # short slices, so stop() (a signal) is seen within 0.1 s, not after the poll
                message = pubsub.get_message(timeout=min(remaining, 0.1))
            except CONNECTION_ERRORS:
                return self.subscribe(pubsub)
            if message and message.get("type") == "message":
                if _text(message.get("channel")) == self.store.group_wake_channel:  # a slot given back
                    self.lines.woken(message.get("data"))
                    break
                wake_at = min(wake_at, self.wake_time(message.get("data"), wake_at))
        return pubsub

    def wake_time(self, data: Any, default: int) -> int:
        """The ready time a wake-up announces, or ``default`` if it is not one.

        Anyone who may PUBLISH on the channel can send anything; what is not a plain integer
        of ms (text, a float, bytes, 5,000 digits) is ignored and logged at debug, at most once
        every few seconds.
        """
        text = data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)
        if 0 < len(text) <= 20 and text.lstrip("-").isdigit():
            return int(text)
        self._bad_wakes += 1
        if time.monotonic() - self._bad_wake_logged >= _BAD_WAKE_LOG_EVERY_S:
            self._bad_wake_logged = time.monotonic()
            log.debug("ignored %d wake-ups that are not ms times (last: %.40r)", self._bad_wakes, data)
            self._bad_wakes = 0
        return default

    def log_summary(self, lossless: bool) -> None:
        s = self.ctx.stats
        log.info(
            "forwarded %d, released %d, deferred %d, parked %d%s, retried %d, dead %d, outages %d, errors %d%s; "
            "lateness p50 %s ms p99 %s ms",
            s.forwarded,
            s.released,
            s.deferred,
            s.parked,
            f" (newer envelope format {s.newer_format}, no target {s.no_target}, released again {s.unparked})"
            if s.parked or s.unparked
            else "",
            s.retried,
            s.dead,
            s.outages,
            s.errors,
            f"; lossless: kept {s.kept}, found started {s.confirmed}" if lossless else "",
            s.percentile(0.5),
            s.percentile(0.99),
        )
        if paused := self.pauses.describe():  # a pause is logged once; this says it still holds
            log.warning("%s", paused)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def check_targets(targets: Mapping[str, Target]) -> None:
    """Connect and authenticate to every target that can (:class:`CheckedTarget`) before
    claiming anything.

    Raises:
        ConfigError: a target's configuration is wrong (a refused login or permission, an
            unknown vhost, a missing module): one line saying what to fix. A broker that is
            only unreachable is logged; its items wait in the store until it answers.
    """
    for kind, target in targets.items():
        if not isinstance(target, CheckedTarget):
            continue
        try:
            target.check()
        except Exception as exc:
            cause = config_error(exc)
            if cause is not None:
                raise ConfigError(f"cannot forward to target {kind!r}: {config_fix(cause)}") from exc
            log.warning("target %r cannot be reached yet (%s: %s); forwarding starts", kind, type(exc).__name__,
                        exc)  # fmt: skip
