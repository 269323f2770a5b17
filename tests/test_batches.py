"""Batches on a real server: open, add, close and finish, completion exactly once (the on_complete
item written ready in the same call, the summary published), and garbage in a batch's keys."""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta

import pytest
import redis
from click.testing import CliRunner
from prometheus_client import REGISTRY

from delayq_backends import DelayStore
from delayq_backends.batches import report_close, report_end
from delayq_backends.cli import main
from delayq_backends.errors import BatchClosedError, BatchError, StoreFullError
from delayq_backends.forwarder import Forwarder
from delayq_backends.keys import batch_channel, batch_item_id, shard_of
from delayq_backends.store import MAX_FAILED_IDS
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget, FakeClock, scheduled, testing_store
from tests.harness import make_store
from tests.helpers import wait_for

OUT = "out"


def envelope(tag: str) -> bytes:
    return RedisListTarget.envelope(OUT, tag.encode()).encode()


@pytest.fixture
def store(valkey_url: str, prefix: str) -> DelayStore:
    return make_store(valkey_url, prefix, shards=4)


class Notices:
    """The messages published on one batch's channel, read in a thread."""

    def __init__(self, store: DelayStore, key: str) -> None:
        self.pubsub = store.client.pubsub()
        self.pubsub.subscribe(batch_channel(store.config.prefix, key))
        self.pubsub.get_message(timeout=2)  # the subscribe confirmation
        self.got: list[dict[str, object]] = []

    def read(self, timeout: float = 0.5) -> list[dict[str, object]]:
        while (message := self.pubsub.get_message(timeout=timeout)) is not None:
            if message["type"] == "message":
                self.got.append(json.loads(message["data"]))
        return self.got


def on_complete_item(store: DelayStore, key: str) -> bytes | None:
    item_id = batch_item_id(key)
    return store.client.hget(store.keys(store.shard_of(item_id)).items, item_id)


def test_a_batch_completes_once_when_closed_and_every_sub_job_finished(store: DelayStore) -> None:
    notices = Notices(store, "order-1")
    assert store.open_batch("order-1", on_complete=envelope("done"))
    assert not store.open_batch("order-1")  # there already: left as it is
    for i in range(5):
        store.schedule(f"job-{i}", timedelta(hours=1), envelope(f"job-{i}"), batch="order-1")
    assert not store.finish_in_batch("order-1", "job-0", True)  # finishes before close count
    assert not store.finish_in_batch("order-1", "job-1", False)
    assert not store.finish_in_batch("order-1", "job-1", True)  # a redelivery counts once, as first told
    assert not store.close_batch("order-1")
    status = store.batch_status("order-1")
    assert status is not None
    assert (status.total, status.done, status.failed, status.closed, status.completed) == (5, 2, 1, True, False)
    assert on_complete_item(store, "order-1") is None
    assert not store.finish_in_batch("order-1", "job-2", True)
    assert not store.finish_in_batch("order-1", "job-3", False)
    assert store.finish_in_batch("order-1", "job-4", True)  # the last: completes
    assert not store.finish_in_batch("order-1", "job-4", True)  # and never again
    assert not store.close_batch("order-1")
    assert on_complete_item(store, "order-1") == envelope("done")
    status = store.batch_status("order-1")
    assert status is not None and status.completed and status.completed_ms is not None
    assert (status.total, status.succeeded, status.failed, sorted(status.failed_ids)) == (5, 3, 2, ["job-1", "job-3"])
    assert notices.read() == [
        {"batch": "order-1", "total": 5, "succeeded": 3, "failed": 2, "failed_ids": ["job-1", "job-3"]}
    ]
    ttl = store.client.pttl(store.keys(store.shard_of(batch_item_id("order-1"))).batch("order-1"))
    assert 6 * 86_400_000 < ttl <= 7 * 86_400_000


def test_an_empty_batch_completes_at_close(store: DelayStore) -> None:
    notices = Notices(store, "empty")
    store.open_batch("empty", on_complete=envelope("done"))
    assert store.close_batch("empty")
    assert on_complete_item(store, "empty") == envelope("done")
    assert notices.read() == [{"batch": "empty", "total": 0, "succeeded": 0, "failed": 0, "failed_ids": []}]


def test_adding_to_a_closed_batch_is_refused_and_schedules_nothing(store: DelayStore) -> None:
    store.open_batch("b")
    store.schedule("a", timedelta(hours=1), envelope("a"), batch="b")
    store.close_batch("b")
    with pytest.raises(BatchClosedError, match="is closed: sub-job 'late' was NOT added"):
        store.schedule("late", timedelta(hours=1), envelope("late"), batch="b")
    assert store.get("late") is None
    store.schedule("a", timedelta(hours=2), envelope("a"), batch="b")  # a member again (a retry): fine
    with pytest.raises(BatchError, match="no batch 'nope': open it first"):
        store.schedule("x", timedelta(hours=1), envelope("x"), batch="nope")
    assert store.get("x") is None
    with pytest.raises(BatchError, match="'stranger' is no sub-job of batch 'b'"):
        store.finish_in_batch("b", "stranger", True)


def test_a_sub_job_whose_schedule_fails_is_taken_back(store: DelayStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.open_batch("b", on_complete=envelope("done"))
    store.schedule("ok", timedelta(hours=1), envelope("ok"), batch="b")

    def full(*_: object, **__: object) -> None:
        raise StoreFullError("full")

    with monkeypatch.context() as m:
        m.setattr(store, "_schedule_item", full)
        with pytest.raises(StoreFullError):
            store.schedule("lost", timedelta(hours=1), envelope("lost"), batch="b")
    status = store.batch_status("b")
    assert status is not None and status.total == 1  # the batch does not wait for "lost"
    store.close_batch("b")
    assert store.finish_in_batch("b", "ok", True)


def test_a_sub_job_stored_although_its_schedule_raised_stays_counted(
    store: DelayStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply lost on its way back (a timeout after the server stored the item): the item will
    run, so it stays in the batch, which waits for its end."""
    store.open_batch("b")
    real = store._schedule_item

    def stored_then_lost(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        raise redis.TimeoutError("the reply was lost")

    with monkeypatch.context() as m:
        m.setattr(store, "_schedule_item", stored_then_lost)
        with pytest.raises(redis.TimeoutError):
            store.schedule("ran", timedelta(hours=1), envelope("ran"), batch="b")
    status = store.batch_status("b")
    assert status is not None and status.total == 1 and store.get("ran") is not None


def test_the_failed_ids_kept_are_bounded_the_counts_are_not(store: DelayStore) -> None:
    store.open_batch("big")
    ids = [f"j{i}" for i in range(MAX_FAILED_IDS + 5)]
    assert store.add_to_batch("big", ids) == len(ids)
    store.close_batch("big")
    for item_id in ids:
        store.finish_in_batch("big", item_id, False)
    status = store.batch_status("big")
    assert status is not None and status.completed
    assert (status.failed, len(status.failed_ids)) == (len(ids), MAX_FAILED_IDS)


def test_concurrent_finishes_complete_exactly_once(store: DelayStore) -> None:
    """Eight threads report 400 sub-jobs, each twice: one call completes the batch."""
    store.open_batch("race", on_complete=envelope("done"))
    ids = [f"r{i}" for i in range(400)]
    store.add_to_batch("race", ids)
    store.close_batch("race")
    completions: list[str] = []

    def report(part: list[str]) -> None:
        for item_id in part * 2:
            if store.finish_in_batch("race", item_id, True):
                completions.append(item_id)

    threads = [threading.Thread(target=report, args=(ids[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(completions) == 1


def test_on_complete_is_forwarded_like_any_item(store: DelayStore) -> None:
    store.open_batch("fw", on_complete=envelope("done"))
    store.schedule("a", 0, envelope("a"), batch="fw")
    store.close_batch("fw")
    target = CollectingTarget("list")
    forwarder = Forwarder(store, [target])
    forwarder.run_once()
    assert target.ids == ["a"]
    store.finish_in_batch("fw", "a", True)
    wait_for(lambda: forwarder.run_once() is not None and len(target.ids) == 2, 5, lambda: f"{target.ids}")
    assert target.ids == ["a", batch_item_id("fw")]


def test_the_batch_keys_share_the_on_complete_items_shard(store: DelayStore) -> None:
    keys = store.keys(shard_of(batch_item_id("k{x}"), store.shards))
    store.open_batch("k{x}")
    assert store.client.exists(keys.batch("k{x}"))
    assert store.batch_keys_in_use() == ["k{x}"]


@pytest.mark.parametrize(
    "garbage",
    [
        "hash of another type",
        "members of another type",
        "done of another type",
        "failed of another type",
        "closed flag",
        "failed count",
        "ttl",
    ],  # fmt: skip
)
def test_garbage_in_batch_keys_is_reported_never_raised(
    store: DelayStore, garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each garbage write makes the batch's calls raise a BatchError naming the fix (the worker
    hooks log it and go on), and other batches complete."""
    store.open_batch("bad")
    store.schedule("a", timedelta(hours=1), envelope("a"), batch="bad")
    keys = store.keys(shard_of(batch_item_id("bad"), store.shards))
    client: redis.Redis = store.client  # type: ignore[assignment]
    if garbage == "hash of another type":
        client.delete(keys.batch("bad"))
        client.set(keys.batch("bad"), "junk")
    elif garbage == "members of another type":
        client.delete(keys.batch_members("bad"))
        client.set(keys.batch_members("bad"), "junk")
    elif garbage == "done of another type":
        client.set(keys.batch_done("bad"), "junk")
    elif garbage == "failed of another type":
        client.set(keys.batch_failed("bad"), "junk")
    elif garbage == "closed flag":
        client.hset(keys.batch("bad"), "closed", "maybe")
    elif garbage == "failed count":
        client.hset(keys.batch("bad"), "failed", "lots")
    else:
        client.hset(keys.batch("bad"), "ttl", "-5")
    with pytest.raises(BatchError, match="hold data delayq did not write"):
        store.close_batch("bad")
    with pytest.raises(BatchError, match="hold data delayq did not write"):
        store.finish_in_batch("bad", "a", True)
    with caplog.at_level(logging.WARNING, "delayq.batches"):
        assert not report_end(store, "bad", "a", True)  # a worker's report: logged, never raised
    assert "the end of sub-job a (succeeded) was not recorded" in caplog.text
    if garbage not in ("ttl", "done of another type"):
        with pytest.raises(BatchError, match="hold data delayq did not write"):
            store.batch_status("bad")
    store.open_batch("good")
    store.close_batch("good")
    good = store.batch_status("good")
    assert good is not None and good.completed
    args = ["--url", store.config.url or "", "--prefix", store.config.prefix, "--shards", "4"]
    result = CliRunner().invoke(main, ["batches", "list", *args])
    assert result.exit_code == 0, result.output
    assert "good" in result.output and "bad" in result.output


def test_cli_shows_a_batch(store: DelayStore) -> None:
    store.open_batch("shown")
    store.add_to_batch("shown", ["x", "y"])
    store.finish_in_batch("shown", "x", False)
    args = ["--url", store.config.url or "", "--prefix", store.config.prefix, "--shards", "4"]
    result = CliRunner().invoke(main, ["batches", "show", "shown", *args, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert (shown["total"], shown["done"], shown["failed"], shown["failed_ids"]) == (2, 1, 1, ["x"])
    missing = CliRunner().invoke(main, ["batches", "show", "nope", *args])
    assert missing.exit_code == 1 and "no batch 'nope'" in missing.output


def test_the_completion_is_counted_once_by_the_process_that_completed_it(store: DelayStore) -> None:
    def completed() -> float:
        return REGISTRY.get_sample_value("delayq_batch_completed_total") or 0.0

    before = completed()
    store.open_batch("counted")
    store.add_to_batch("counted", ["a"])
    assert not report_close(store, "counted")
    assert completed() == before
    assert report_end(store, "counted", "a", True)
    assert not report_end(store, "counted", "a", True)
    assert completed() == before + 1
    store.open_batch("empty-counted")
    assert report_close(store, "empty-counted")
    assert completed() == before + 2


def test_the_testing_store_runs_batches_on_its_fake_clock() -> None:
    clock = FakeClock()
    fake = testing_store(shards=2, clock=clock)
    fake.open_batch("t", on_complete=envelope("done"))
    fake.schedule("a", timedelta(minutes=1), envelope("a"), batch="t")
    fake.close_batch("t")
    clock.advance(timedelta(minutes=2))
    assert fake.finish_in_batch("t", "a", True)
    status = fake.batch_status("t")
    assert status is not None and status.completed_ms == clock.ms
    assert [e.id for e in scheduled(fake)] == ["a", batch_item_id("t")]


def test_a_completion_refused_midway_is_done_by_the_next_close(store: DelayStore) -> None:
    """The shard's due key of another type refuses the on_complete item: the batch is not marked
    completed, and closing it again once the key is fixed completes it."""
    store.open_batch("stuck", on_complete=envelope("done"))
    store.add_to_batch("stuck", ["a"])
    store.close_batch("stuck")
    due = store.keys(shard_of(batch_item_id("stuck"), store.shards)).due
    store.client.delete(due)
    store.client.set(due, "junk")
    with pytest.raises(redis.ResponseError):
        store.finish_in_batch("stuck", "a", True)
    status = store.batch_status("stuck")
    assert status is not None and status.done == 1 and not status.completed
    assert not report_end(store, "stuck", "a", True)  # a worker's report: logged, not raised
    store.client.delete(due)
    assert store.close_batch("stuck")
    assert on_complete_item(store, "stuck") == envelope("done")
