"""Time as integer UTC milliseconds since the epoch: the one unit the store uses.

Integers below 2**53 are exact in a double, so a score in a sorted set is the ready time to
the millisecond, with no float rounding.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone
from numbers import Real
from typing import Callable, Union

from .errors import InvalidTimeError

__all__ = ["MAX_MS", "Clock", "When", "from_ms", "now_ms", "to_ms"]

#: 9999-12-31T23:59:59Z: past this a value is a unit mistake, not a schedule.
MAX_MS = 253_402_300_799_000

When = Union[datetime, timedelta, int, float]
Clock = Callable[[], int]


def now_ms() -> int:
    """Current wall-clock time in integer milliseconds."""
    return time.time_ns() // 1_000_000


def from_ms(ms: int) -> datetime:
    """An aware UTC datetime for ``ms``."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def to_ms(when: When, *, clock: Clock = now_ms) -> int:
    """Convert a ready time to integer UTC milliseconds.

    Args:
        when: an aware ``datetime``; a ``timedelta`` from now (>= 0); or epoch *seconds*
            as int/float.
        clock: where "now" comes from for a ``timedelta``.

    Raises:
        InvalidTimeError: for naive datetimes, NaN/inf, negative values, bools, and values
            past year 9999 (often epoch milliseconds passed as seconds).
    """
    if isinstance(when, (int, float)) and not isinstance(when, bool):  # the bulk path, first
        return _checked_ms(when * 1000, what=f"epoch seconds {when!r}")
    if isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise InvalidTimeError(
                f"naive datetime {when.isoformat()} is ambiguous: pass an aware datetime, "
                "e.g. datetime.now(timezone.utc) + timedelta(minutes=5), "
                "or when.replace(tzinfo=ZoneInfo('Europe/Paris'))"
            )
        ms = _checked_ms(when.timestamp() * 1000, what=f"datetime {when.isoformat()}")
    elif isinstance(when, timedelta):
        if when < timedelta(0):
            raise InvalidTimeError(
                f"negative delay {when}: pass a timedelta >= 0, or an aware datetime in the past "
                "for an item that is due at once"
            )
        ms = _checked_ms(clock() + when / timedelta(milliseconds=1), what=f"delay {when}")
    elif isinstance(when, Real) and not isinstance(when, bool):
        ms = _checked_ms(float(when) * 1000, what=f"epoch seconds {when!r}")
    else:
        raise InvalidTimeError(
            f"cannot schedule at {when!r} ({type(when).__name__}): pass an aware datetime, "
            "a timedelta from now, or epoch seconds as int/float"
        )
    return ms


def _checked_ms(value: float, *, what: str) -> int:
    if math.isnan(value) or math.isinf(value):
        raise InvalidTimeError(f"{what} is not a finite time: pass a real date or delay")
    if value < 0:
        raise InvalidTimeError(f"{what} is before 1970: pass a time after the Unix epoch")
    if value > MAX_MS:
        hint = " (epoch milliseconds passed as seconds? divide by 1000)" if value < MAX_MS * 1000 * 10 else ""
        raise InvalidTimeError(f"{what} lies after year 9999{hint}: pass epoch seconds")
    return int(round(value))
