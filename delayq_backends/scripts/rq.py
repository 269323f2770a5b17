"""The RQ target's scripts as typed calls (see :mod:`delayq_backends.scripts.store`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .library import ScriptCall

__all__ = ["RqEnqueue", "RqFields"]

#: Per job hash: its values (None when absent), or the key's type when it is no hash.
JobValues = list[bytes | None] | bytes


class RqFields:
    """rq_fields.lua: the same fields of many RQ job hashes, read in one call."""

    name = "rq_fields"

    @classmethod
    def call(cls, job_keys: Sequence[str], fields: Sequence[str]) -> ScriptCall[list[JobValues]]:
        return ScriptCall(cls.name, tuple(job_keys), tuple(fields), _job_values)


class RqEnqueue:
    """rq_enqueue.lua: the job hash writes of RQ's enqueue for a batch of due jobs of one queue."""

    name = "rq_enqueue"

    @classmethod
    def call(
        cls, job_keys: Sequence[str], *, status: str, origin: str, enqueued_at: str, timeout: str, mask: str
    ) -> ScriptCall[int]:
        """``mask`` has one character per key: "1" writes the queue's ``timeout`` too."""
        return ScriptCall(cls.name, tuple(job_keys), (status, origin, enqueued_at, timeout, mask), int)


def _job_values(reply: Any) -> list[JobValues]:
    return list(reply)
