"""Issue 30, findings 3, 6 and 8: a batch holds against what the producer and worker roles
(the ACL users ``delayq acl`` makes) can write into its keys by hand, a cancelled or purged
sub-job is reported to its batch as failed, and a key in use is refused at open. Real servers."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from delayq_backends import BatchClosedError, BatchError, DelayStore
from delayq_backends.cli import main
from delayq_backends.envelope import Envelope
from delayq_backends.models import CancelOutcome, FailedDelivery
from delayq_backends.scripts import function_name
from delayq_backends.store.batches import MAX_MEMBERS
from delayq_backends.targets import RedisListTarget
from tests import test_security
from tests.test_security import Admin, open_store, user_url

admin = test_security.admin  # the fixture: the embedded Valkey and the system Redis 7, users removed after

LATER = 4_000_000_000


def on_complete() -> Envelope:
    """An on_complete whose body is the summary (the mark replaced)."""
    return Envelope("list", "out", b'"MARK"')


def roles(admin: Admin, prefix: str) -> tuple[DelayStore, DelayStore, DelayStore]:
    """The operator's (admin) store, a producer's and a worker's."""
    admin.install_functions()
    operator = open_store(admin.url, prefix)
    operator.check_meta()
    return (
        operator,
        open_store(user_url(admin, prefix, "producer"), prefix),
        open_store(user_url(admin, prefix, "worker"), prefix),
    )


def filled(producer: DelayStore, key: str, n: int) -> list[str]:
    """Batch ``key`` opened with n sub-jobs (due later) and closed."""
    assert producer.open_batch(key, on_complete=on_complete(), mark="MARK")
    ids = [f"{key}-s{i}" for i in range(n)]
    for item_id in ids:
        producer.schedule(item_id, LATER, RedisListTarget.envelope("out", b"x"), batch=key)
    assert not producer.close_batch(key)
    return ids


def summary(store: DelayStore, key: str) -> dict[str, object] | None:
    """The summary written into batch ``key``'s on_complete item, None if it is not there."""
    found = store.get(f"batch-{key}")
    return None if found is None else json.loads(Envelope.decode(found.envelope).body)  # type: ignore[no-any-return]


def test_junk_in_the_done_set_completes_nothing(admin: Admin, prefix: str) -> None:
    """Finding 3: ids written into the done set by hand are no finished members: 9 of 10 pending
    stay pending, and the batch completes at the last real end."""
    operator, producer, worker = roles(admin, prefix)
    ids = filled(producer, "b", 10)
    keys = producer.keys(producer.shard_of("batch-b"))
    assert worker.finish_in_batch("b", ids[0], True) is False
    producer.client.sadd(keys.batch_done("b"), *(f"junk{i}" for i in range(20)))
    assert worker.finish_in_batch("b", ids[1], True) is False and not producer.close_batch("b")
    status = producer.batch_status("b")
    assert status is not None and (status.done, status.completed) == (2, False) and summary(operator, "b") is None
    with pytest.raises(BatchError, match="no sub-job"):
        worker.finish_in_batch("b", "junk0", True)
    assert [worker.finish_in_batch("b", i, True) for i in ids[2:]] == [False] * 7 + [True]
    assert summary(operator, "b") == {"batch": "b", "total": 10, "succeeded": 10, "failed": 0, "failed_ids": []}


def test_a_completed_batch_never_fires_again_whatever_its_hash_says(admin: Admin, prefix: str) -> None:
    """Finding 3: resetting ``completed``, or deleting and rebuilding the hash, fires nothing
    again: the fired mark is RENAMENX's target only, which the roles cannot delete, change,
    expire or move away; a hand-made call with keys that are not the batch's is refused."""
    operator, producer, worker = roles(admin, prefix)
    (only,) = filled(producer, "b", 1)
    assert worker.finish_in_batch("b", only, True) and summary(operator, "b") is not None
    operator.cancel("batch-b")  # delivered: the forwarder acked it
    keys = producer.keys(producer.shard_of("batch-b"))
    fired = keys.batch_fired("b")
    for client in (producer.client, worker.client):
        for command in (
            ("DEL", fired), ("UNLINK", fired), ("PEXPIRE", fired, 1), ("PERSIST", fired), ("HDEL", fired, "at"),
            ("HSET", fired, "at", "1"), ("RENAMENX", fired, keys.batch_firing("b")), ("RENAME", fired, keys.batch("x")),
            ("SET", fired, "x"), ("COPY", keys.batch("b"), fired, "REPLACE"),
        ):  # fmt: skip
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    assert producer.client.renamenx(keys.batch_members("b"), fired) is False  # the one write: onto nothing only
    producer.client.hset(keys.batch("b"), "completed", "0")
    assert not producer.close_batch("b") and not worker.finish_in_batch("b", only, True)
    fields = producer.client.hgetall(keys.batch("b"))
    producer.client.hdel(keys.batch("b"), *fields)  # gone, then rebuilt as never completed
    producer.client.hset(keys.batch("b"), mapping={**fields, b"completed": b"0"})
    assert not producer.close_batch("b") and summary(operator, "b") is None
    status = producer.batch_status("b")
    assert status is not None and status.completed and status.completed_ms is not None
    with pytest.raises(BatchClosedError, match="in use"):
        producer.open_batch("b")
    assert producer.open_batch("b-2")  # what the message says to do
    other = producer.keys(producer.shard_of("batch-b-2"))
    shard = [keys.due, keys.items, keys.tries, keys.leased, keys.ranked]
    batch = [keys.batch("b"), other.batch_members("b-2"), keys.batch_done("b"), keys.batch_failed("b")]
    args = ["close", 1, "w", f"{prefix}:batch:b", "batch-b", "b", 1000, "", "1"]
    hand = [*shard, *batch, fired, keys.batch_firing("b")]  # the members of an empty batch: refused
    assert producer.client.execute_command("FCALL", function_name("batch_end"), len(hand), *hand, *args) == [-6, 0]
    assert summary(operator, "b") is None


def test_impossible_counts_are_refused_and_forged_failed_ids_left_out(admin: Admin, prefix: str) -> None:
    """Finding 3: ``failed -5`` never reaches a summary (the batch reads as garbage, says so and
    waits); failed ids that are no finished members are left out of it."""
    operator, producer, worker = roles(admin, prefix)
    ids = filled(producer, "neg", 2)
    keys = producer.keys(producer.shard_of("batch-neg"))
    producer.client.hset(keys.batch("neg"), "failed", "-5")
    worker.finish_in_batch("neg", ids[0], True)
    with pytest.raises(BatchError, match="did not write"):
        worker.finish_in_batch("neg", ids[1], False)
    with pytest.raises(BatchError, match="did not write"):
        producer.batch_status("neg")
    assert summary(operator, "neg") is None
    producer.client.hset(keys.batch("neg"), "failed", "1")  # the fix: then the next report or close completes it
    assert producer.close_batch("neg")
    assert summary(operator, "neg") == {"batch": "neg", "total": 2, "succeeded": 1, "failed": 1, "failed_ids": [ids[1]]}

    ids = filled(producer, "forged", 3)
    keys = producer.keys(producer.shard_of("batch-forged"))
    producer.client.rpush(keys.batch_failed("forged"), "someone-else", ids[1])  # no member; listed twice
    worker.finish_in_batch("forged", ids[0], True)
    worker.finish_in_batch("forged", ids[1], False)
    assert worker.finish_in_batch("forged", ids[2], True)
    assert summary(operator, "forged") == {
        "batch": "forged", "total": 3, "succeeded": 2, "failed": 1, "failed_ids": [ids[1]]
    }  # fmt: skip

    ids = filled(producer, "lied", 2)  # a success listed as failed: more listed than failed, refused
    keys = producer.keys(producer.shard_of("batch-lied"))
    producer.client.rpush(keys.batch_failed("lied"), ids[0])
    worker.finish_in_batch("lied", ids[0], True)
    with pytest.raises(BatchError, match="did not write"):
        worker.finish_in_batch("lied", ids[1], True)
    assert summary(operator, "lied") is None


def test_a_phantom_member_is_named_and_ended_by_the_cli(admin: Admin, prefix: str) -> None:
    """Finding 3: a member written by hand keeps a finished batch waiting: ``delayq batches
    pending`` names it, ``delayq batches fail`` ends it and completes the batch. A batch takes
    at most MAX_MEMBERS sub-jobs through batch_add."""
    operator, producer, worker = roles(admin, prefix)
    ids = filled(producer, "ph", 3)
    keys = producer.keys(producer.shard_of("batch-ph"))
    producer.client.sadd(keys.batch_members("ph"), "phantom")
    assert [worker.finish_in_batch("ph", i, True) for i in ids] == [False] * 3
    args = ["--url", admin.url, "--prefix", prefix, "--shards", "4"]
    pending = CliRunner().invoke(main, ["batches", "pending", "ph", *args])
    assert pending.exit_code == 0 and pending.output.splitlines() == ["batch 'ph' waits for 1 sub-job(s)", "phantom"]
    failed = CliRunner().invoke(main, ["batches", "fail", "ph", "phantom", *args])
    assert failed.exit_code == 0 and "batch 'ph' completed" in failed.output, failed.output
    assert summary(operator, "ph") == {
        "batch": "ph",
        "total": 4,
        "succeeded": 3,
        "failed": 1,
        "failed_ids": ["phantom"],
    }

    assert producer.open_batch("big")
    assert producer.add_to_batch("big", [f"i{n}" for n in range(MAX_MEMBERS)]) == MAX_MEMBERS
    with pytest.raises(BatchError, match="split the work"):
        producer.add_to_batch("big", ["one-more"])


def test_a_fake_notice_completes_nothing(admin: Admin, prefix: str) -> None:
    """Finding 3: anyone with the role may PUBLISH on a batch's channel (advisory); completion
    never reads it."""
    operator, producer, worker = roles(admin, prefix)
    ids = filled(producer, "n", 2)
    fake = json.dumps({"batch": "n", "total": 2, "succeeded": 2, "failed": 0, "failed_ids": []})
    producer.client.publish(f"{prefix}:batch:n", fake)
    worker.client.publish(f"{prefix}:batch:n", fake)
    status = producer.batch_status("n")
    assert status is not None and not status.completed and summary(operator, "n") is None
    assert not worker.finish_in_batch("n", ids[0], True) and worker.finish_in_batch("n", ids[1], True)


def test_a_cancelled_or_purged_sub_job_is_reported_to_its_batch_as_failed(admin: Admin, prefix: str) -> None:
    """Finding 6: a sub-job cancelled (store.cancel, `delayq cancel`) or purged from the dead
    letters (`delayq dlq purge`) will never run: its batch hears it failed, and cancel says so."""
    operator, producer, worker = roles(admin, prefix)
    ids = filled(producer, "c", 4)
    assert producer.cancel(ids[0]) is CancelOutcome.CANCELLED
    assert producer.cancel_item(ids[1]).batch == "c"
    args = ["--url", admin.url, "--prefix", prefix, "--shards", "4"]
    said = CliRunner().invoke(main, ["cancel", ids[2], *args])
    assert said.exit_code == 0 and "a sub-job of batch 'c': reported to it as failed" in said.output, said.output
    operator.reschedule(ids[3], 1)
    claim = operator.claim(operator.shard_of(ids[3]))
    operator.fail(claim, [FailedDelivery(ids[3], None, "boom")])  # dead-lettered
    assert [d.id for d in operator.dead_letters()] == [ids[3]]
    forwarder = ["--url", user_url(admin, prefix, "forwarder"), "--prefix", prefix, "--shards", "4"]
    purged = CliRunner().invoke(main, ["dlq", "purge", "--all", "--yes", *forwarder])  # the role that runs it
    assert purged.exit_code == 0, purged.output
    assert summary(operator, "c") == {"batch": "c", "total": 4, "succeeded": 0, "failed": 4, "failed_ids": ids}
