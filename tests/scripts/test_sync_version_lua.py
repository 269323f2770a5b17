"""sync_version.lua: a sync from code goes ahead only with a code schedule at least as new as
the one synced last, checked and recorded in one step."""

from __future__ import annotations

import pytest

from delayq_backends import DelayStore
from delayq_backends.keys import periodic_code_key
from delayq_backends.periodic.registry import (
    PeriodicError,
    StaleScheduleError,
    code_record,
    record_code_sync,
)

KIND = "celery-periodic"


def test_a_newer_version_is_recorded_an_older_one_changes_nothing(store: DelayStore) -> None:
    assert record_code_sync(store, 5, "fp5", host="a", kind=KIND) is None  # the first sync
    before = record_code_sync(store, 7, "fp7", host="b", kind=KIND)
    assert before is not None and (before.version, before.fingerprint, before.host) == (5, "fp5", "a")
    with pytest.raises(StaleScheduleError, match="older than the one synced last, version 7"):
        record_code_sync(store, 6, "fp6", host="c", kind=KIND)
    now = code_record(store, KIND)
    assert now is not None and (now.version, now.fingerprint, now.host) == (7, "fp7", "b")
    assert now.synced_ms is not None and now.synced_ms > 1_700_000_000_000  # the server's clock


def test_the_same_version_passes_with_its_set_and_is_refused_with_another(store: DelayStore) -> None:
    record_code_sync(store, 3, "set-a", kind=KIND)
    assert record_code_sync(store, 3, "set-a", kind=KIND) is not None  # a second forwarder of the same deploy
    with pytest.raises(StaleScheduleError, match="bump the version"):
        record_code_sync(store, 3, "set-b", kind=KIND)
    assert code_record(store, KIND).fingerprint == "set-a"  # type: ignore[union-attr]


def test_unversioned_syncs_win_in_turn_until_a_versioned_one_ran(store: DelayStore) -> None:
    record_code_sync(store, None, "x", kind=KIND)
    record_code_sync(store, None, "y", kind=KIND)  # today's last-sync-wins
    record_code_sync(store, 1, "z", kind=KIND)
    with pytest.raises(StaleScheduleError, match="no schedule version.*set this deploy.s schedule version"):
        record_code_sync(store, None, "y", kind=KIND)
    assert code_record(store, KIND).version == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "garbage",
    [
        lambda c, k: c.set(k, "junk"),
        lambda c, k: c.hset(k, mapping={f"{KIND}:version": "1e400", f"{KIND}:fp": "x"}),
        lambda c, k: c.hset(k, mapping={f"{KIND}:version": b"\xff\x00", f"{KIND}:synced_at": "-inf"}),
    ],
    ids=["wrong type", "extreme number", "garbage bytes"],
)
def test_a_damaged_record_is_refused_naming_the_key_and_the_fix(store: DelayStore, garbage) -> None:  # type: ignore[no-untyped-def]
    key = periodic_code_key(store.config.prefix)
    garbage(store.client, key)
    with pytest.raises(PeriodicError, match=f"redis-cli DEL {key}"):
        record_code_sync(store, 9, "fp", kind=KIND)
    assert code_record(store, KIND) is None or code_record(store, KIND).version is None  # type: ignore[union-attr]
    store.client.delete(key)
    assert record_code_sync(store, 9, "fp", kind=KIND) is None


def test_each_kind_of_entry_has_its_own_code_schedule(store: DelayStore) -> None:
    """A Celery app's beat_schedule and an RQ cron config are two code schedules: an RQ sync at
    version 5 neither blocks nor rolls back a Celery sync at version 5 with another set."""
    record_code_sync(store, 5, "celery-set", kind=KIND)
    record_code_sync(store, 5, "rq-set", kind="rq-periodic")
    assert record_code_sync(store, 5, "celery-set", kind=KIND) is not None  # still current
    with pytest.raises(StaleScheduleError, match="older"):
        record_code_sync(store, 4, "rq-old", kind="rq-periodic")
    assert code_record(store, KIND).fingerprint == "celery-set"  # type: ignore[union-attr]
    assert code_record(store, "rq-periodic").fingerprint == "rq-set"  # type: ignore[union-attr]
