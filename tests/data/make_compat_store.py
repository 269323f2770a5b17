"""Write ``compat_store_s3.json``: every key of a small store built by the code at tag ``s3-start``.

Run once, with that version on the path (``git worktree add /tmp/s3 s3-start``, then
``PYTHONPATH=/tmp/s3 python tests/data/make_compat_store.py``), on an embedded Valkey. The file
holds each key's raw contents (not DUMP: that is tied to one server's RDB version), so
``tests/test_compat.py`` can rebuild the store on any server and check that today's code reads,
claims, acks and requeues what the old code wrote.

The store holds plain, ranked, leased, deferred and dead (ranked and not) items, with list, RQ
and Celery style envelopes, at fixed times (clock overrides), so the file is the same every run
except for the claim tokens, which it records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.envelope import Envelope
from delayq_backends.models import Claim

PREFIX = "compat"
SHARDS = 4
#: Every time in the store is BASE + small offsets: 2027-01-15T08:00:00Z.
BASE = 1_800_000_000_000


def _text(value: bytes) -> str:
    return value.hex()


def _dump(client: Any) -> dict[str, Any]:
    """Each key of the prefix as {type, contents}, bytes as hex."""
    out: dict[str, Any] = {}
    for key in sorted(client.scan_iter(match=f"{PREFIX}*")):
        kind = client.type(key).decode()
        if kind == "zset":
            value: Any = [[_text(m), s] for m, s in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "hash":
            value = {_text(f): _text(v) for f, v in sorted(client.hgetall(key).items())}
        else:
            raise SystemExit(f"{key!r} is a {kind}: the generator only writes hashes and sorted sets")
        out[key.decode()] = {"type": kind, "value": value}
    return out


def build(store: DelayStore) -> list[dict[str, Any]]:
    """Fill the store; returns the open claims (leases) so a test can ack under them."""
    rq = Envelope("rq", "default", meta={})
    celery = Envelope("celery", "celery", body=b'{"task": "tasks.add", "args": [2, 3]}', meta={"headers": {"id": "c1"}})
    for n in range(12):
        store.schedule(f"plain-{n}", BASE / 1000 + n, Envelope("list", "out", f"body {n}".encode()))
    for n in range(4):
        store.schedule(f"ranked-{n}", BASE / 1000 + n, Envelope("list", "out", b"ranked"), rank=10 * (n + 1))
    store.schedule("rq-job", BASE / 1000 + 5, rq)
    store.schedule("celery-task", BASE / 1000 + 6, celery, rank=3)
    store.schedule("later", BASE / 1000 + 3600, Envelope("list", "out", b"later"))
    claims = []
    for shard in range(SHARDS):
        claim = store.claim(shard, limit=3, lease_ms=60_000, now=BASE + 10_000)
        claims.append(
            {"shard": shard, "deadline_ms": claim.deadline_ms, "token": claim.token, "ids": [i.id for i in claim.items]}
        )
    # per shard: the first claimed item stays leased, the second is deferred, the third dies
    for claim_row, shard in zip(claims, range(SHARDS)):
        ids = claim_row["ids"]
        claim = Claim(shard, claim_row["deadline_ms"], claim_row["token"])
        if len(ids) > 1:
            store.defer(claim, [(ids[1], BASE + 120_000)])
        if len(ids) > 2:
            store.fail(claim, [(ids[2], None, "boom: permanent")], now=BASE + 11_000)
        claim_row["leased"] = ids[:1]
        claim_row["deferred"] = ids[1:2]
        claim_row["dead"] = ids[2:3]
    return claims


def main(out: Path) -> None:
    with EmbeddedServer() as server:
        client = connect(server.url)
        store = DelayStore(client, Config(url=server.url, prefix=PREFIX, shards=SHARDS))
        claims = build(store)
        data = {"prefix": PREFIX, "shards": SHARDS, "base_ms": BASE, "claims": claims, "keys": _dump(client)}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("compat_store_s3.json"))
