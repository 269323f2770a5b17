"""The store's clock, as a forwarder reads it."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CLOCK_RESAMPLE_S", "Clock"]

#: How often the clock re-reads the server's TIME; in between it advances the last reading with
#: the monotonic clock, so a step of the local wall clock changes nothing.
CLOCK_RESAMPLE_S = 60.0


class Clock:
    """The store's clock: Redis TIME, read every :data:`CLOCK_RESAMPLE_S` and advanced in between
    with ``time.monotonic()``; one per forwarder, read by its pass, its loop and its heartbeat.

    Not the local wall clock plus an offset: a step of the wall clock (NTP, an operator) would
    then make items late by the step, or make the forwarder claim items that are not due on the
    server (empty claims in a loop) until the next reading.
    """

    def __init__(self, server_time_ms: Callable[[], int], *, read_each_time: bool = False) -> None:
        self._server_time_ms = server_time_ms
        #: read ``server_time_ms`` at every call (a test's fake clock, which moves only when told)
        self._read_each_time = read_each_time
        #: server TIME at the last reading and time.monotonic() then, as one tuple: several
        #: threads read the clock
        self._reading: tuple[int, float] | None = None

    def now_ms(self) -> int:
        """The server's time now, in ms."""
        if self._read_each_time:
            return self._server_time_ms()
        mono = time.monotonic()
        reading = self._reading
        if reading is None or mono - reading[1] > CLOCK_RESAMPLE_S:
            server = self._server_time_ms()
            after = time.monotonic()
            reading = self._reading = (server, (mono + after) / 2)
            mono = after
        return reading[0] + int((mono - reading[1]) * 1000)
