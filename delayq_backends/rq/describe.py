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
from .target import JOB_KEY, KIND

__all__ = ["JobView", "describe_jobs"]

#: The job hash fields shown: plain text RQ writes, never ``data`` or ``meta``.
_FIELDS = ("description", "status")


@dataclass(frozen=True)
class JobView:
    """One waiting RQ job as ``delayq list`` shows it; description and status are None when its
    hash is gone."""

    id: str
    description: str | None
    status: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _job_id(item: ScheduledItem) -> str | None:
    """The RQ job of ``item`` (a debounced item's is in its envelope), None if it is no RQ item."""
    try:
        envelope = Envelope.decode(item.envelope)
    except EnvelopeError:
        return None
    if envelope.target != KIND:
        return None
    job_id = envelope.meta.get(JOB_KEY, item.id)
    return job_id if isinstance(job_id, str) else None


def describe_jobs(client: Any, items: Sequence[ScheduledItem]) -> dict[str, JobView]:
    """The RQ jobs among ``items``, by item id, their hashes read in one round trip from
    ``client`` (RQ's Redis). A job class with its own key prefix is not imported: RQ's is read."""
    jobs = {item.id: job_id for item in items if (job_id := _job_id(item)) is not None}
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
        views[item_id] = JobView(job_id, description, status)
    return views
