"""Upgrade the Scheduler envelopes of a store written by delayq_backends 0.1 (``delayq rq-upgrade``).

A 0.1 :class:`~delayq_backends.rq.Scheduler` kept a periodic or cron job's schedule only in the
job's ``meta``, pickled by RQ's default serializer, and its envelope said just ``{"scheduler":
true}``. Today's forwarder never deserializes job data, so it cannot read that schedule: it
dead-letters such a job (unless its ``meta`` is JSON, which it reads itself) with a reason
naming this command. This runs on the operator's side, which trusts the job data as an
``rq worker`` does: it loads each legacy job's ``meta`` with the job's own serializer and writes
the schedule into the envelope, in place (:meth:`~delayq_backends.store.DelayStore.replace_envelope`:
ready time, rank, attempts and lease stay), for scheduled items and dead letters alike. An
upgraded envelope is no longer legacy, so a second run changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from typing import Any

import redis
from rq.job import Job
from rq.serializers import resolve_serializer

from ..envelope import Envelope
from ..errors import DelayqError, EnvelopeError
from ..store import DelayStore
from .allowlist import ClassAllowlist
from .jobs import SCHEDULE_KEY, is_legacy_scheduler, schedule_of

__all__ = ["LegacyItem", "UpgradeReport", "upgrade"]

#: Items whose job hashes are read per round trip.
PAGE = 500


@dataclass(frozen=True)
class LegacyItem:
    """A legacy Scheduler envelope found in the store: a scheduled item, or a dead letter."""

    id: str
    data: bytes
    envelope: Envelope
    dead: bool


@dataclass
class UpgradeReport:
    """What :func:`upgrade` did, by item id.

    ``upgraded``/``upgraded_dead``: envelopes rewritten (or, in a dry run, that would be), with
    their schedule. ``gone``: the job hash is gone, so there is nothing to run; left alone (the
    forwarder skips it). ``changed``: forwarded, cancelled or scheduled again while being read;
    left alone (run again). ``failed``: could not be upgraded, with why.
    """

    upgraded: dict[str, dict[str, Any]] = field(default_factory=dict)
    upgraded_dead: dict[str, dict[str, Any]] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def upgrade(
    connection: redis.Redis,
    store: DelayStore,
    *,
    serializer: Any = None,
    allow_classes: ClassAllowlist | None = None,
    dry_run: bool = False,
) -> UpgradeReport:
    """Put the schedule of every legacy Scheduler job of ``store`` (scheduled or dead) into its envelope.

    Args:
        connection: RQ's Redis, where the job hashes are.
        serializer: the jobs' serializer when their envelope names none, as given to
            ``rq worker --serializer`` (RQ's default, pickle, when omitted).
        allow_classes: job classes and serializers an envelope may name (by default as for
            ``delayq forward``: see :meth:`ClassAllowlist.configured`).
        dry_run: report what would change; write nothing.
    """
    allowed = ClassAllowlist.configured() if allow_classes is None else allow_classes
    report = UpgradeReport()
    found = chain(_legacy_scheduled(store), _legacy_dead(store))
    while page := list(islice(found, PAGE)):
        _upgrade_page(connection, store, page, serializer, allowed, report, dry_run)
    return report


def _legacy(item_id: str, data: bytes | None, dead: bool) -> LegacyItem | None:
    if data is None:
        return None
    try:
        envelope = Envelope.decode(data)
    except EnvelopeError:  # not ours to upgrade; `delayq list` shows it
        return None
    return LegacyItem(item_id, data, envelope, dead) if is_legacy_scheduler(envelope) else None


def _legacy_scheduled(store: DelayStore) -> Iterator[LegacyItem]:
    for item in store.scan():
        if found := _legacy(item.id, item.envelope, dead=False):
            yield found


def _legacy_dead(store: DelayStore) -> Iterator[LegacyItem]:
    """Every legacy dead letter, read a page at a time (dead letters are few; paging by offset)."""
    offset = 0
    while letters := store.dead_letters(offset=offset, count=PAGE):
        for letter in letters:
            if found := _legacy(letter.id, letter.envelope, dead=True):
                yield found
        offset += len(letters)


def _upgrade_page(
    connection: redis.Redis,
    store: DelayStore,
    page: list[LegacyItem],
    serializer: Any,
    allowed: ClassAllowlist,
    report: UpgradeReport,
    dry_run: bool,
) -> None:
    ready: list[tuple[LegacyItem, Any]] = []
    for item in page:
        try:
            ready.append((item, allowed.load("job_class", item.envelope.meta.get("job_class"), Job)))
        except DelayqError as exc:
            report.failed.append((item.id, str(exc)))
    with connection.pipeline(transaction=False) as pipe:
        for item, job_class in ready:
            pipe.exists(job_class.key_for(item.id))
            pipe.hget(job_class.key_for(item.id), "meta")
        replies = pipe.execute()
    for (item, _), exists, meta in zip(ready, replies[0::2], replies[1::2]):
        if not exists:
            report.gone.append(item.id)
            continue
        try:
            schedule = _schedule(item, meta, serializer, allowed)
        except Exception as exc:  # whatever the job's serializer raises: one bad job never stops the run
            report.failed.append((item.id, f"cannot read its job.meta ({type(exc).__name__}: {exc})"))
            continue
        upgraded = replace(item.envelope, meta={**item.envelope.meta, SCHEDULE_KEY: schedule})
        if not dry_run and not store.replace_envelope(item.id, item.data, upgraded, dead=item.dead):
            report.changed.append(item.id)
            continue
        (report.upgraded_dead if item.dead else report.upgraded)[item.id] = schedule


def _schedule(item: LegacyItem, meta: bytes | None, serializer: Any, allowed: ClassAllowlist) -> dict[str, Any]:
    """The schedule in a job's ``meta``, loaded as the 0.1 forwarder loaded it: with the serializer
    its envelope names (if allowed), else the one given, else RQ's default."""
    if not meta:
        return {}
    named = item.envelope.meta.get("serializer")
    loads = resolve_serializer(allowed.load("serializer", named) if named is not None else serializer).loads
    loaded = loads(meta)
    if not isinstance(loaded, dict):
        raise ValueError(f"it is a {type(loaded).__name__}, not a dict")
    return schedule_of(loaded)
