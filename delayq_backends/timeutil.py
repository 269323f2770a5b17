"""Time as integer UTC milliseconds since the epoch: the one unit the store uses.

Integers below 2**53 are exact in a double, so a score in a sorted set is the ready time to
the millisecond, with no float rounding.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from numbers import Real

from .errors import InvalidTimeError

__all__ = [
    "CLOCK_RESAMPLE_S",
    "MAX_MS",
    "Clock",
    "ServerClock",
    "When",
    "from_ms",
    "now_ms",
    "parse_iso",
    "score_ms",
    "to_ms",
]

#: 9999-12-31T23:59:59Z: past this a value is a unit mistake, not a schedule.
MAX_MS = 253_402_300_799_000

#: How often a :class:`ServerClock` re-reads the server's time.
CLOCK_RESAMPLE_S = 60.0
#: Readings of the server's time a sample may take, keeping the one with the shortest round trip:
#: the clock leads ``TIME`` by that round trip, and a lead makes a forwarder wake before its items
#: are due and claim nothing (one reading that waited for a busy CPU would set a lead for a minute).
CLOCK_TRIES = 3
#: A round trip this short ends a sample at once (s).
CLOCK_GOOD_RTT_S = 0.002

When = datetime | timedelta | int | float
#: Where "now" comes from, in integer ms: a store's :class:`ServerClock`, or a test's
#: ``FakeClock``. Everything that reads the time is given the store's one instance.
Clock = Callable[[], int]
_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def now_ms() -> int:
    """Current wall-clock time in integer milliseconds."""
    return time.time_ns() // 1_000_000


class ServerClock:
    """The store's clock: its server's ``TIME`` in integer ms, re-read every
    :data:`CLOCK_RESAMPLE_S` and advanced in between with ``time.monotonic()``.

    One per store (``store.clock``), read by everything that asks "now": ``timedelta`` ready
    times, the forwarder's pass, loop, heartbeat and back-offs, the periodic firing and the
    targets (through their lease). The scripts' own ``TIME`` is the same server's, so a producer
    or forwarder whose wall clock is off schedules and claims neither early nor late; and a step
    of the local wall clock (NTP, an operator) changes nothing, as the monotonic clock does not
    step. Re-reading bounds the drift of the monotonic clock against the server's.

    Never behind the server: a reading counts from the moment it was asked for, so the clock leads
    ``TIME`` by at most one round trip of that reading; an item due "now" on the server is due on
    this clock, and a ``timedelta`` ready time is never early. Whole ms, rounded down as ``TIME``.

    Args:
        read: the server's time in ms now, to the µs if it can (a round trip: ``TIME``).
    """

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        #: server time at the last reading and time.monotonic() then, as one tuple: several
        #: threads read the clock
        self._reading: tuple[float, float] | None = None

    def __call__(self) -> int:
        mono = time.monotonic()
        reading = self._reading
        if reading is None or mono - reading[1] > CLOCK_RESAMPLE_S:
            reading = self._reading = self._sample()
            mono = time.monotonic()
        return int(reading[0] + (mono - reading[1]) * 1000)

    def _sample(self) -> tuple[float, float]:
        """The server's time and the monotonic time it was asked at, from the shortest of up to
        :data:`CLOCK_TRIES` round trips."""
        best: tuple[float, float, float] | None = None
        for _ in range(CLOCK_TRIES):
            asked = time.monotonic()
            server = self._read()
            took = time.monotonic() - asked
            if best is None or took < best[2]:
                best = (server, asked, took)
            if took < CLOCK_GOOD_RTT_S:
                break
        assert best is not None
        return best[0], best[1]


def score_ms(score: float | int | bytes | str | None) -> int:
    """A sorted-set score or stored time as integer ms, for *reading* what may be hand-written.

    Never raises: a value that is no number or not finite reads as 0 (``-inf``, NaN, garbage)
    or :data:`MAX_MS` (``+inf`` and past year 9999), so one bad value cannot stop a reader.
    """
    try:
        value = float(score)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0
    if math.isnan(value) or value < 0:
        return 0
    return MAX_MS if value > MAX_MS else int(value)


def from_ms(ms: int) -> datetime:
    """An aware UTC datetime for ``ms``."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def parse_iso(text: str, *, zone_required: bool = True) -> datetime:
    """An ISO-8601 time; a trailing ``Z`` means UTC (Python < 3.11 does not read it).

    Raises:
        InvalidTimeError: ``text`` is no ISO-8601 time, or (with ``zone_required``) has no zone,
            which makes it ambiguous: the message shows the fix.
    """
    text = text.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        raise InvalidTimeError(
            f"cannot parse {text!r} as an ISO-8601 time: use e.g. 2030-01-31T12:00:00Z or 2030-01-31T13:00:00+01:00"
        ) from None
    if zone_required and parsed.tzinfo is None:
        raise InvalidTimeError(
            f"{text!r} has no time zone, so it is ambiguous: add one, e.g. {text}Z for UTC or {text}+02:00"
        )
    return parsed


def to_ms(when: When, *, clock: Clock = now_ms) -> int:
    """Convert a ready time to integer UTC milliseconds, rounded *up*: an item is never due
    before its time, not even by a fraction of a millisecond.

    Args:
        when: an aware ``datetime``; a ``timedelta`` from now (>= 0); or epoch *seconds*
            as int/float.
        clock: where "now" comes from for a ``timedelta``.

    Raises:
        InvalidTimeError: for naive datetimes, NaN/inf, negative values, bools, and values
            past year 9999 (often epoch milliseconds passed as seconds).
    """
    if isinstance(when, (int, float)) and not isinstance(when, bool):  # the bulk path, first
        return _checked_ms(when * 1000, "epoch seconds", when)
    if isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise InvalidTimeError(
                f"naive datetime {when.isoformat()} is ambiguous: pass an aware datetime, "
                "e.g. datetime.now(timezone.utc) + timedelta(minutes=5), "
                "or when.replace(tzinfo=ZoneInfo('Europe/Paris'))"
            )
        micros = (when - _EPOCH) // _MICROSECOND  # exact: no float on this path
        if not 0 <= micros <= MAX_MS * 1000:
            _checked_ms(when.timestamp() * 1000, "datetime", when)  # raises, naming the time
        ms = -(-micros // 1000)
    elif isinstance(when, timedelta):
        if when < timedelta(0):
            raise InvalidTimeError(
                f"negative delay {when}: pass a timedelta >= 0, or an aware datetime in the past "
                "for an item that is due at once"
            )
        now = clock()
        _checked_ms(now + when / timedelta(milliseconds=1), "delay", when)
        ms = now + -(-(when // timedelta(microseconds=1)) // 1000)
    elif isinstance(when, Real) and not isinstance(when, bool):
        ms = _checked_ms(float(when) * 1000, "epoch seconds", when)
    else:
        raise InvalidTimeError(
            f"cannot schedule at {when!r} ({type(when).__name__}): pass an aware datetime, "
            "a timedelta from now, or epoch seconds as int/float"
        )
    return ms


def _checked_ms(value: float, kind: str, given: object) -> int:
    """``value`` ms as an int, rounded up; ``kind`` and ``given`` name the input in an error (its
    message is built only then: this runs once per scheduled item)."""
    if 0 <= value <= MAX_MS:  # the usual case: finite and in range
        # round to the microsecond first, so float noise (0.3 s * 1000 = 300.00000000000006)
        # does not make an exact time a millisecond late: the same as ceil(round(value, 3)),
        # which costs twice as much per item, decided by the fraction (exact: value - whole
        # loses no bits) unless it lies near the half microsecond, where round() decides
        whole = int(value)
        fraction = value - whole
        if 0.0004 < fraction < 0.0006:
            return math.ceil(round(value, 3))
        return whole if fraction < 0.0005 else whole + 1
    what = _what(kind, given)
    if math.isnan(value) or math.isinf(value):
        raise InvalidTimeError(f"{what} is not a finite time: pass a real date or delay")
    if value < 0:
        raise InvalidTimeError(f"{what} is before 1970: pass a time after the Unix epoch")
    hint = " (epoch milliseconds passed as seconds? divide by 1000)" if value < MAX_MS * 1000 * 10 else ""
    raise InvalidTimeError(f"{what} lies after year 9999{hint}: pass epoch seconds")


def _what(kind: str, given: object) -> str:
    """How an error names the time it refuses, as the caller wrote it."""
    if isinstance(given, datetime):
        return f"{kind} {given.isoformat()}"
    if isinstance(given, timedelta):
        return f"{kind} {given}"
    return f"{kind} {given!r}"
