"""A store written by the code at tag ``s3-start`` (tests/data/compat_store_s3.json, made by
tests/data/make_compat_store.py) is read, claimed, acked, failed and requeued by today's code,
on a fresh embedded Valkey: the key layout and the stored values did not change."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.models import Claim, FailedDelivery

DATA = json.loads((Path(__file__).parent / "data" / "compat_store_s3.json").read_text(encoding="utf-8"))
BASE: int = DATA["base_ms"]


def restore(client: redis.Redis, keys: dict[str, Any]) -> None:
    """Write each dumped key back as it was (bytes were dumped as hex)."""
    for key, dumped in keys.items():
        if dumped["type"] == "zset":
            client.zadd(key, {bytes.fromhex(member): score for member, score in dumped["value"]})
        else:
            client.hset(key, mapping={bytes.fromhex(f): bytes.fromhex(v) for f, v in dumped["value"].items()})


@pytest.fixture(scope="module")
def old_store() -> Iterator[DelayStore]:
    with EmbeddedServer() as server:
        client = connect(server.url)
        restore(client, DATA["keys"])  # type: ignore[arg-type]
        yield DelayStore(client, Config(url=server.url, prefix=DATA["prefix"], shards=DATA["shards"]))
        client.close()


def old_claim(row: dict[str, Any]) -> Claim:
    return Claim(row["shard"], row["deadline_ms"], row["token"])


def test_every_item_reads_as_the_old_code_wrote_it(old_store: DelayStore) -> None:
    counts = old_store.stats()
    assert sum(s.scheduled for s in counts) == 19 - 3 and sum(s.dead for s in counts) == 3
    ranked = old_store.get("ranked-3")
    assert ranked is not None and ranked.rank == 40 and ranked.leased_until_ms == BASE + 70_000
    celery = old_store.get("later")
    assert celery is not None and Envelope.decode(celery.envelope).body == b"later"
    rq = old_store.get("rq-job")
    assert rq is not None and Envelope.decode(rq.envelope).target == "rq"
    dead = {d.id: d for d in old_store.dead_letters()}
    assert set(dead) == {row["dead"][0] for row in DATA["claims"] if row["dead"]}
    assert dead["celery-task"].error == "boom: permanent" and dead["celery-task"].envelope is not None


def test_old_leases_ack_and_fail_under_the_new_scripts(old_store: DelayStore) -> None:
    shard0, shard2 = DATA["claims"][0], DATA["claims"][2]
    (leased,) = shard0["leased"]
    assert old_store.ack(old_claim(shard0), [leased]) == 1 and old_store.get(leased) is None
    (other,) = shard2["leased"]
    counts = old_store.fail(old_claim(shard2), [FailedDelivery(other, BASE + 90_000, "retry")], now=BASE + 20_000)
    assert (counts.retried, counts.buried) == (1, 0)
    item = old_store.get(other)
    assert item is not None and item.ready_ms == BASE + 90_000 and item.leased_until_ms is None


def test_deferred_and_due_items_are_claimed_ranked_first(old_store: DelayStore) -> None:
    row = DATA["claims"][3]  # shard 3: ranked-3 (rank 40) leased until BASE + 70 s, ranked-1 (rank 20)
    assert (row["leased"], row["deferred"]) == (["ranked-3"], ["ranked-1"])  # deferred to BASE + 120 s
    assert old_store.claim(row["shard"], now=BASE + 119_000).items[0].id == "ranked-3"  # its lease ran out
    claim = old_store.claim(row["shard"], now=BASE + 121_000)
    ranked = [(i.id, i.attempts, i.ready_ms) for i in claim.items][:1]
    assert ranked == [("ranked-1", 1, BASE + 1000)]  # the deferral counted no attempt, kept its ready time
    assert old_store.ack(claim) == len(claim.items)


def test_dead_letters_requeue_with_their_rank(old_store: DelayStore) -> None:
    assert old_store.requeue_dead(["celery-task"], when=BASE / 1000) == 1
    item = old_store.get("celery-task")
    assert item is not None and item.rank == 3
    assert old_store.purge_dead() == 2 and old_store.dead_letters() == []
