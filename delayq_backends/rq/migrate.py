"""Move jobs already waiting in RQ's ``rq:scheduled:<queue>`` registries and in rq-scheduler's
``rq:scheduler:scheduled_jobs`` into the delay store, keeping each job's id and time.

Each page is first copied with ``mode="keep"`` (an id already in the store is left as it is),
then removed from its source; a run that stops between the two only copies it again, as a
no-op, the next time. So the move loses nothing, duplicates nothing, and can run twice. Stop
``rq worker --with-scheduler`` and ``rqscheduler`` first; should one still move a job
meanwhile, the forwarder skips it, because the job is no longer in status ``scheduled``.

An rq-scheduler job's repeat or cron schedule lives in its ``job.meta``, which the forwarder
never deserializes; this command reads it (with the serializer given, as rq-scheduler did, in
the operator's process) and copies the schedule into the job's envelope, with rq-scheduler's
cron syntax and the queue class named in ``meta["queue_class_name"]``.

A job from ``rq:scheduled:<queue>`` stays listed there as a mirror entry (see
:mod:`.registry`); mirror entries themselves are already in the store and are not read.
:func:`adopt` is the forwarder's side of the same move: it reads no ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import redis
from rq import Queue as RQQueue
from rq.job import Job
from rq.registry import ScheduledJobRegistry
from rq.serializers import resolve_serializer

from ..envelope import Envelope
from ..errors import InvalidIdError
from ..keys import normalize_id
from ..store import DelayStore, ScheduleEntry
from .jobs import AT_FRONT_RANK, job_envelope, schedule_of
from .periodic import RQ_SCHEDULER, SYNTAX_KEY
from .registry import MIRROR_OFFSET_S, mirror_scheduled

__all__ = ["RQ_SCHEDULER_KEY", "MigrationReport", "adopt", "migrate"]

#: rq-scheduler's sorted set: job id -> epoch seconds.
RQ_SCHEDULER_KEY = "rq:scheduler:scheduled_jobs"
PAGE = 500


@dataclass
class MigrationReport:
    """Per source key: ids moved into the store, ids the store already had, ids whose job is gone
    (or that are no id: removed, see ``garbage``); keys left alone, with why and the fix."""

    moved: dict[str, int] = field(default_factory=dict)
    already: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    #: key -> the members removed from it because they are no job id (not UTF-8, refused by the store)
    garbage: dict[str, list[bytes]] = field(default_factory=dict)
    #: key -> why it was skipped and the fix (a key of another type)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def total_moved(self) -> int:
        return sum(self.moved.values())


def migrate(
    connection: redis.Redis,
    store: DelayStore,
    *,
    queue_class: type | None = None,
    job_class: type[Job] = Job,
    serializer: Any = None,
    dry_run: bool = False,
) -> MigrationReport:
    """Move every scheduled RQ and rq-scheduler job on ``connection`` into ``store``.

    Args:
        queue_class, job_class, serializer: what the forwarder moves the jobs with, as given to
            ``rq worker`` (RQ's defaults when omitted).
        dry_run: count what would move; change nothing.
    """
    report = MigrationReport()
    pattern = ScheduledJobRegistry.key_template.format("*")
    prefix = ScheduledJobRegistry.key_template.format("")
    for raw_key in sorted(connection.scan_iter(match=pattern, count=1000)):
        key = raw_key.decode()
        queue_name = key[len(prefix) :]
        envelope = job_envelope(queue_name, queue_class=queue_class, job_class=job_class, serializer=serializer)

        def registry_envelope(_origin: str, _meta: bytes | None, envelope: Envelope = envelope) -> Envelope:
            return envelope

        _move(connection, store, key, registry_envelope, job_class, report, dry_run, mirror_queue=queue_name)

    loads = resolve_serializer(serializer).loads

    def scheduler_envelope(origin: str, meta: bytes | None) -> Envelope:
        job_meta = loads(meta) if meta else {}
        schedule = schedule_of(job_meta)
        if "cron_string" in schedule:
            schedule[SYNTAX_KEY] = RQ_SCHEDULER  # it keeps reading its cron string as rq-scheduler did
        envelope = job_envelope(
            origin, queue_class=queue_class, job_class=job_class, serializer=serializer, scheduler=True,
            schedule=schedule,
        )  # fmt: skip
        class_name = job_meta.get("queue_class_name")
        if isinstance(class_name, str) and class_name:  # rq-scheduler's Scheduler(queue_class="path")
            named = {**envelope.meta, "queue_class": class_name}
            envelope = Envelope(envelope.target, envelope.destination, meta=named)
        return envelope

    _move(connection, store, RQ_SCHEDULER_KEY, scheduler_envelope, job_class, report, dry_run, read_meta=True)
    return report


def adopt(connection: redis.Redis, store: DelayStore, queue_names: list[str] | None = None) -> MigrationReport:
    """Move jobs that a plain ``rq.Queue`` scheduled into ``rq:scheduled:<queue>`` into the store.

    A worker or ``rq enqueue --schedule-in`` run without ``--queue-class delayq_backends.rq.Queue``
    writes there, and with no RQ scheduler running nobody would move them. Each is stored at
    its registry time with RQ's default classes, and its entry becomes a mirror entry, so an
    RQ scheduler running beside no longer moves it. Unlike :func:`migrate` this reads no
    ``meta`` (nothing is deserialized): it is what ``delayq forward`` runs. ``queue_names``:
    by default every queue in RQ's ``rq:queues``.
    """
    report = MigrationReport()
    if queue_names is None:
        prefix = RQQueue.redis_queue_namespace_prefix
        members = cast(set[bytes], connection.smembers(RQQueue.redis_queues_keys))
        queue_names = sorted(m.decode()[len(prefix) :] for m in members if m.decode().startswith(prefix))
    for name in queue_names:
        envelope = job_envelope(name)

        def registry_envelope(_origin: str, _meta: bytes | None, envelope: Envelope = envelope) -> Envelope:
            return envelope

        key = ScheduledJobRegistry.key_template.format(name)
        try:
            _move(connection, store, key, registry_envelope, Job, report, False, mirror_queue=name)
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            report.skipped[key] = (
                f"{key} is a {connection.type(key)!r} not a sorted set, so no RQ tool can read it and no job "
                f"scheduled there by a plain rq.Queue is adopted: move it away (`RENAME {key} {key}:bad`)"
            )
    return report


def _job_ids(key: str, members: list[bytes], report: MigrationReport) -> list[str | None]:
    """Each member as a job id, or None for one that is none (recorded in ``report.garbage``)."""
    ids: list[str | None] = []
    for member in members:
        try:
            ids.append(normalize_id(member))
        except InvalidIdError:
            ids.append(None)
            report.garbage.setdefault(key, []).append(member)
    return ids


def _move(
    connection: redis.Redis,
    store: DelayStore,
    key: str,
    envelope_for: Callable[[str, bytes | None], Envelope],
    job_class: type[Job],
    report: MigrationReport,
    dry_run: bool,
    *,
    mirror_queue: str | None = None,
    read_meta: bool = False,
) -> None:
    """Move one sorted set, a page at a time, into the store; see the module docstring.

    Mirror entries (already in the store) are not read. With ``mirror_queue`` each moved entry
    becomes a mirror entry of that queue's registry, else it is removed; entries whose job hash
    is gone are removed either way.
    """
    moved = already = missing = offset = 0
    while page := _read_page(connection, key, offset, envelope_for, job_class, report, read_meta):
        missing += len(page.ids) - len(page.entries)
        if dry_run:
            moved += len(page.entries)
            offset += PAGE
            continue
        counts = store.schedule_many(page.entries, mode="keep")
        moved += counts.added
        already += counts.kept
        _clear_page(connection, key, page, mirror_queue)  # after the copy: a crash in between only copies again
    if moved or already or missing:
        report.moved[key], report.already[key], report.missing[key] = moved, already, missing


class _Page(NamedTuple):
    """One page of a sorted set: its job ids (and their members with scores), the members that
    name no job, and the store entries of the jobs whose hash is there."""

    ids: list[str]
    members: list[tuple[bytes, float]]
    garbage: list[bytes]
    entries: list[ScheduleEntry]


def _read_page(
    connection: redis.Redis,
    key: str,
    offset: int,
    envelope_for: Callable[[str, bytes | None], Envelope],
    job_class: type[Job],
    report: MigrationReport,
    read_meta: bool,
) -> _Page | None:
    """The page of ``key`` at ``offset`` (mirror entries not read), None past the last."""
    page = cast(
        list[tuple[bytes, float]],
        connection.zrangebyscore(key, "-inf", f"({MIRROR_OFFSET_S}", start=offset, num=PAGE, withscores=True),
    )
    if not page:
        return None
    named = _job_ids(key, [member for member, _ in page], report)
    garbage = [m for (m, _), i in zip(page, named) if i is None]
    page = [p for p, i in zip(page, named) if i is not None]
    ids = [i for i in named if i is not None]
    wanted = ("origin", "enqueue_at_front", "meta") if read_meta else ("origin", "enqueue_at_front")
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hmget(job_class.key_for(job_id), *wanted)
        fields = [(*f, None)[:3] for f in pipe.execute()]
    # an at_front job keeps its backlog priority, as if scheduled through our Queue
    entries: list[ScheduleEntry] = [
        (job_id, score, envelope_for(origin.decode(), meta), AT_FRONT_RANK if at_front == b"1" else 0)
        for job_id, (_, score), (origin, at_front, meta) in zip(ids, page, fields)
        if origin is not None
    ]
    return _Page(ids, page, garbage, entries)


def _clear_page(connection: redis.Redis, key: str, page: _Page, mirror_queue: str | None) -> None:
    """Remove a copied page from ``key``, or (``mirror_queue``) turn its entries into mirror
    entries; garbage and the entries whose job hash is gone are removed either way."""
    with connection.pipeline() as pipe:
        if page.garbage:  # no job's id: nothing of RQ's can use it either
            pipe.zrem(key, *page.garbage)
        if mirror_queue is None:
            if page.ids:
                pipe.zrem(key, *page.ids)
        else:
            found = {e[0] for e in page.entries}
            gone = [i for i in page.ids if i not in found]
            if gone:
                pipe.zrem(key, *gone)
            mirrors = {i.decode(): s for i, s in page.members if i.decode() in found}
            mirror_scheduled(pipe, mirror_queue, mirrors, only_existing=True)
        pipe.execute()
