"""What waiting RQ jobs will run, for ``delayq list``: each job's function and arguments as its
hash describes them, read without deserializing anything.

RQ writes a job's ``description`` as the call, ``module.func('arg', n=1)`` (or the text given as
``job_description``), in plain text beside the pickled ``data``: reading it costs one HMGET per
job and runs no code, where ``Job.fetch`` would unpickle ``data`` planted by anyone who can write
RQ's Redis. The store's envelope names only the queue and the classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rq.job import Job

from ..envelope import Envelope
from ..errors import EnvelopeError
from ..models import ScheduledItem
from .jobs import JOB_KEY, KIND, OVERLAP_FIELD, SCHEDULE_KEY, SKIPPED_FIELD

__all__ = ["JobView", "describe_jobs"]

#: The job hash fields shown: plain text RQ writes, never ``data`` or ``meta``.
_FIELDS = ("description", "status")


@dataclass(frozen=True)
class JobView:
    """One waiting RQ job as ``delayq list`` shows it; description and status are None when its
    hash is gone. A periodic job with an overlap policy has it in ``overlap``, and the periods
    it skipped so far in ``skipped``."""

    id: str
    description: str | None
    status: str | None
    overlap: str | None = None
    skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        view = asdict(self)
        if self.overlap is None:  # the usual job: no policy, nothing skipped
            del view["overlap"], view["skipped"]
        return view


def _rq_envelope(item: ScheduledItem) -> Envelope | None:
    """``item``'s envelope if it is an RQ item."""
    try:
        envelope = Envelope.decode(item.envelope)
    except EnvelopeError:
        return None
    return envelope if envelope.target == KIND else None


def _job_id(envelope: Envelope, item: ScheduledItem) -> str | None:
    """The RQ job of ``item`` (a debounced item's is in its envelope)."""
    job_id = envelope.meta.get(JOB_KEY, item.id)
    return job_id if isinstance(job_id, str) else None


def _overlap(envelope: Envelope) -> tuple[str | None, int]:
    """A periodic job's overlap policy and skipped periods, as its envelope's schedule holds them."""
    schedule = envelope.meta.get(SCHEDULE_KEY)
    if not isinstance(schedule, dict) or not isinstance(schedule.get(OVERLAP_FIELD), str):
        return None, 0
    skipped = schedule.get(SKIPPED_FIELD)
    return schedule[OVERLAP_FIELD], skipped if type(skipped) is int else 0


def describe_jobs(client: Any, items: Sequence[ScheduledItem]) -> dict[str, JobView]:
    """The RQ jobs among ``items``, by item id, their hashes read in one round trip from
    ``client`` (RQ's Redis). A job class with its own key prefix is not imported: RQ's is read."""
    envelopes = {item.id: envelope for item in items if (envelope := _rq_envelope(item)) is not None}
    by_id = {item.id: item for item in items}
    jobs = {i: job_id for i, e in envelopes.items() if (job_id := _job_id(e, by_id[i])) is not None}
    if not jobs:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for job_id in jobs.values():
            pipe.hmget(Job.key_for(job_id), _FIELDS)
        replies = pipe.execute(raise_on_error=False)
    views = {}
    for (item_id, job_id), reply in zip(jobs.items(), replies):
        if isinstance(reply, Exception):  # not a hash, or not readable by this user: not shown
            continue
        description, status = (v.decode("utf-8", "replace") if isinstance(v, bytes) else None for v in reply)
        views[item_id] = JobView(job_id, description, status, *_overlap(envelopes[item_id]))
    return views
