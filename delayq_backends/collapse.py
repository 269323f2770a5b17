"""Debounce and throttle options as the adapters receive them: a Celery header, an RQ
``enqueue_in`` argument. One parser, so both read the same forms and refuse the same mistakes.

The forms: a key (text), meaning debounce and keep the last call's arguments, or a dict
``{"key": K, "mode": "debounce" | "throttle", "keep": "first" | "last"}`` with ``mode`` and
``keep`` optional (``"debounce"``, ``"last"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .envelope import Envelope, GroupSpec
from .errors import InvalidDebounceError
from .keys import COLLAPSE_MODES
from .models import Collapsed
from .store import DelayStore
from .store.producer import KEEP
from .timeutil import When

__all__ = ["Collapse"]

_FIELDS = frozenset({"key", "mode", "keep"})


@dataclass(frozen=True)
class Collapse:
    """How schedules of one key collapse: see :meth:`DelayStore.debounce` and :meth:`DelayStore.throttle`."""

    key: str
    mode: str = "debounce"
    keep: str = "last"

    @classmethod
    def parse(cls, value: Any, where: str) -> Collapse:
        """From a key or a ``{"key", "mode", "keep"}`` dict; ``where`` names the option in errors.

        Raises:
            InvalidDebounceError: anything else, saying what to pass; nothing was stored.
        """
        spec: Mapping[str, Any] = {"key": value} if isinstance(value, str) else value
        if not isinstance(spec, Mapping) or not set(spec) <= _FIELDS:
            raise InvalidDebounceError(
                f"{where}={_shown(value)}: pass a key (text), or a dict with 'key' and optionally "
                f"'mode' ({' or '.join(COLLAPSE_MODES)}) and 'keep' (first or last), "
                "e.g. {'key': 'user-42', 'mode': 'throttle', 'keep': 'first'}"
            )
        key, mode, keep = spec.get("key"), spec.get("mode", "debounce"), spec.get("keep", "last")
        if not isinstance(key, str) or not key:
            raise InvalidDebounceError(f"{where}: key {_shown(key)} is no text: pass the id calls collapse by")
        if mode not in COLLAPSE_MODES:
            raise InvalidDebounceError(f"{where}: mode {_shown(mode)}: use 'debounce' or 'throttle'")
        if keep not in KEEP:
            raise InvalidDebounceError(f"{where}: keep {_shown(keep)}: use 'first' or 'last'")
        return cls(key, mode, keep)

    def apply(
        self,
        store: DelayStore,
        when: When,
        envelope: Envelope,
        *,
        rank: int = 0,
        rate_key: str | None = None,
        group: GroupSpec | None = None,
    ) -> Collapsed:
        """Schedule ``envelope`` at ``when`` under this key, collapsing with its pending run."""
        call = store.debounce if self.mode == "debounce" else store.throttle
        return call(self.key, when, envelope, keep=self.keep, rank=rank, rate_key=rate_key, group=group)


def _shown(value: Any) -> str:
    return repr(value)[:80]
