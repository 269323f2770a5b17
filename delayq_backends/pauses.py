"""Targets paused by a configuration error: a refused login or permission, an unknown vhost, a
missing module (see :func:`~delayq_backends.outages.config_error`).

Such an error is neither an item's fault nor gone in a second, so it must not burn attempts
(ten of them dead-letter a task, and a periodic entry with its run history) nor log a traceback
per retry. The forwarder pauses the target instead: the items it claims for it are given back
to wait in the store until the pause ends (no attempt counted), then one call probes the
target again, the pause doubling up to a cap while the error lasts. Other targets keep flowing.
The error is logged once when it starts (and again if it changes), counted in the metrics, and
named in the summary line while it lasts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .outages import config_fix

__all__ = ["TargetPauses"]

log = logging.getLogger("delayq.forwarder")

#: First pause after a configuration error; it doubles up to the forwarder's cap.
FIRST_PAUSE_MS = 1000


@dataclass
class _Pause:
    until_ms: int
    pause_ms: int
    fix: str


class TargetPauses:
    """The targets paused now, by kind.

    Args:
        max_pause_ms: the longest pause between two probes of a paused target.
        observe: called with (kind, paused) on each pause and on each recovery (the metrics).
    """

    def __init__(self, max_pause_ms: int, observe: Callable[[str, bool], None] | None = None) -> None:
        self.max_pause_ms = max(FIRST_PAUSE_MS, max_pause_ms)
        self._observe = observe
        self._paused: dict[str, _Pause] = {}

    def until(self, kind: str, now_ms: int) -> int | None:
        """When the pause of ``kind`` ends, while it lasts; None when it may be called now."""
        pause = self._paused.get(kind)
        return pause.until_ms if pause is not None and pause.until_ms > now_ms else None

    def pause(self, kind: str, error: BaseException, now_ms: int) -> int:
        """Pause ``kind`` after the configuration error ``error``; returns when the pause ends.

        Logged when the target was working (or the error changed), so a pause that lasts an
        hour is one line, not one per probe; not again for a second target paused by the same
        error (Celery's periodic entries share the Celery target's broker)."""
        fix = config_fix(error)
        previous = self._paused.get(kind)
        pause_ms = FIRST_PAUSE_MS if previous is None else min(self.max_pause_ms, previous.pause_ms * 2)
        if (previous is None or previous.fix != fix) and all(p.fix != fix for p in self._paused.values()):
            log.error(
                "target %r paused by a configuration error: %s; its items wait in the store (no attempt counted) "
                "and it is tried again every %.0f s at most",
                kind,
                fix,
                self.max_pause_ms / 1000,
            )
        self._paused[kind] = _Pause(now_ms + pause_ms, pause_ms, fix)
        if self._observe is not None:
            self._observe(kind, True)
        return now_ms + pause_ms

    def worked(self, kind: str) -> None:
        """A call to ``kind`` went through: end its pause, if any."""
        if self._paused.pop(kind, None) is not None:
            log.warning("target %r works again: its waiting items flow", kind)
            if self._observe is not None:
                self._observe(kind, False)

    def describe(self) -> str:
        """The paused targets and why, for the summary line ("" when none is)."""
        by_fix: dict[str, list[str]] = {}
        for kind, pause in sorted(self._paused.items()):
            by_fix.setdefault(pause.fix, []).append(repr(kind))
        return "; ".join(f"still paused: target {', '.join(kinds)}: {fix}" for fix, kinds in by_fix.items())
