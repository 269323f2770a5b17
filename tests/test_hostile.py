"""Hostile writes: garbage written straight into a shard's keys (what the producer ACL role
may do) while two real `delayq forward` processes run, to a Redis list.

Hypothesis draws batches of garbage: scores that are not finite or are huge, ids that are not
UTF-8, corrupt envelopes, garbage in ``leased``, ``tries`` and the dead-letter info, keys of
the wrong type, garbage wake-ups. Good items are scheduled in the same shards. Invariants,
each with a deadline:

* the forwarders stay alive;
* every good item is delivered (to the list), and exactly once (no forwarder crashed);
* every bad item is delivered or dead-lettered with a reason;
* no shard is stuck: a good item in the same shard as garbage still goes (for a key of the
  wrong type: once the key is repaired);
* ``delayq stats``, ``delayq list`` and ``delayq dlq list`` exit 0.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from delayq_backends import DelayqError, DelayStore
from delayq_backends.cli import main
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, Proc, make_store
from tests.helpers import wait_for

SHARDS = 2
OUT = "out"
#: a bad item must be resolved within this: lease 1 s, 3 attempts, shard back-off up to 10 s
RESOLVE_S = 40.0

Raw = str | bytes | float | int


@dataclass(frozen=True)
class Garbage:
    """One hostile write: ``kind`` says where, ``value`` what."""

    kind: str
    value: Raw


@dataclass
class Planted:
    """What the garbage of one example left to check."""

    bad: dict[bytes, str] = field(default_factory=dict)  # item id -> tag in its body
    ids: list[tuple[int, bytes]] = field(default_factory=list)  # (shard, id) of every planted item
    broken_keys: dict[int, list[str]] = field(default_factory=dict)  # shard -> keys of the wrong type


SCORES = st.sampled_from([-math.inf, -1e300, -(2**63), -1.0, 0.5, 1e-300])
FAR_SCORES = st.sampled_from([math.inf, 1e300, float(2**63)])
JUNK = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"abc", b"1e400", b"-5", b"9" * 30, b"nan", b":::", b"1:2", b"\xff\xfe", b"inf"]),
)
WRONG_TYPE_KEYS = st.sampled_from(["tries", "leased", "ranked", "dead", "dead_items", "dead_info"])
GARBAGE = st.one_of(
    st.builds(Garbage, st.just("score"), SCORES),
    st.builds(Garbage, st.just("far_score"), FAR_SCORES),
    st.builds(Garbage, st.just("non_utf8_id"), st.binary(min_size=1, max_size=8).map(lambda b: b"\xff" + b)),
    st.builds(Garbage, st.just("envelope"), JUNK),
    st.builds(Garbage, st.just("lease"), JUNK),
    st.builds(Garbage, st.just("tries"), JUNK),
    st.builds(Garbage, st.just("dead_info"), JUNK),
    st.builds(Garbage, st.just("wrong_type"), WRONG_TYPE_KEYS),
    st.builds(Garbage, st.just("wake"), JUNK),
)


@pytest.fixture
def fleet(valkey_url: str, prefix: str, tmp_path: Path, procs: Launcher) -> Iterator[list[Proc]]:
    make_store(valkey_url, prefix, shards=SHARDS, lease_seconds=1, max_attempts=3)  # records the meta
    args = ["forward", "--url", valkey_url, "--prefix", prefix, "--shards", str(SHARDS)]
    args += ["--lease", "1", "--max-attempts", "3", "--poll", "0.2", "--log-level", "warning"]
    yield [procs.delayq(*args, log=tmp_path / f"forwarder{n}.log") for n in range(2)]
    procs.stop_all(grace=10)


class Hostile:
    """Plants garbage and good items in one store, and checks the invariants."""

    def __init__(self, store: DelayStore, client: redis.Redis, key: str) -> None:
        self.store = store
        self.client = client
        self.key = key
        self.numbers = itertools.count()
        self.good: dict[str, int] = {}  # tag -> shard

    def body(self, tag: str) -> bytes:
        return RedisListTarget.envelope(self.key, json.dumps({"tag": tag}).encode()).encode()

    def plant(self, garbage: Garbage, planted: Planted) -> None:
        """Write ``garbage``; a write refused because an earlier garbage broke a key is skipped."""
        try:
            self._plant(garbage, planted)
        except (redis.ResponseError, DelayqError) as exc:
            if "WRONGTYPE" not in str(exc):
                raise

    def _plant(self, garbage: Garbage, planted: Planted) -> None:
        n = next(self.numbers)
        item_id = f"bad-{n}".encode()
        shard = self.store.shard_of(item_id)
        keys = self.store.keys(shard)
        tag = f"bad-{n}"
        value = garbage.value
        planted.ids.append((shard, item_id))
        if garbage.kind == "score":
            self.client.hset(keys.items, item_id, self.body(tag))
            self.client.zadd(keys.due, {item_id: float(value)})
            planted.bad[item_id] = tag
        elif garbage.kind == "far_score":  # never due: it must only not block the others
            self.client.hset(keys.items, item_id, self.body(tag))
            self.client.zadd(keys.due, {item_id: float(value)})
        elif garbage.kind == "non_utf8_id":
            assert isinstance(value, bytes)
            item_id = value + str(n).encode()
            keys = self.store.keys(raw_shard(item_id))
            planted.ids.append((raw_shard(item_id), item_id))
            self.client.hset(keys.items, item_id, self.body(tag))
            self.client.zadd(keys.due, {item_id: 0})
            planted.bad[item_id] = tag
        elif garbage.kind == "envelope":
            self.client.hset(keys.items, item_id, value)
            self.client.zadd(keys.due, {item_id: 0})
            planted.bad[item_id] = tag
        elif garbage.kind in ("lease", "tries"):
            self.store.schedule(item_id.decode(), 0, self.body(tag))
            self.client.hset(keys.leased if garbage.kind == "lease" else keys.tries, item_id, value)
            planted.bad[item_id] = tag
        elif garbage.kind == "dead_info":
            self.client.zadd(keys.dead, {item_id: 0})
            self.client.hset(keys.dead_items, item_id, value)
            self.client.hset(keys.dead_info, item_id, value)
        elif garbage.kind == "wrong_type":
            self.store.schedule(item_id.decode(), 4_000_000_000, self.body(tag))  # so the readers meet the key
            key = getattr(keys, str(value))
            self.client.delete(key)
            self.client.set(key, b"not a hash or zset")
            planted.broken_keys.setdefault(shard, []).append(key)
        elif garbage.kind == "wake":
            self.client.publish(self.store.wake_channel, value)

    def schedule_good(self, shards: Iterable[int], per_shard: int = 2) -> list[str]:
        """Good items: ``per_shard`` in each of ``shards``, due now."""
        tags: list[str] = []
        wanted = {s: per_shard for s in shards}
        while any(wanted.values()):
            tag = f"good-{next(self.numbers)}"
            shard = self.store.shard_of(tag)
            if wanted.get(shard):
                wanted[shard] -= 1
                self.store.schedule(tag, 0, self.body(tag))
                self.good[tag] = shard
                tags.append(tag)
        return tags

    def delivered(self) -> Counter[str]:
        return Counter(json.loads(b)["tag"] for b in self.client.lrange(self.key, 0, -1))

    def dead_reason(self, item_id: bytes) -> str | None:
        raw = self.client.hget(self.store.keys(raw_shard(item_id)).dead_info, item_id)
        if raw is None:
            return None
        try:
            error = json.loads(raw.decode("utf-8", "replace")).get("error")  # the reason may quote raw bytes
        except (ValueError, AttributeError):
            return None
        return str(error) if error else None

    def state(self, planted: Planted) -> str:
        """Where each unresolved bad item stands in the store, for a failure message."""
        out = []
        for item_id, tag in planted.bad.items():
            k = self.store.keys(raw_shard(item_id))
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zscore(k.due, item_id)
                pipe.hget(k.leased, item_id)
                pipe.hget(k.tries, item_id)
                pipe.zscore(k.dead, item_id)
                pipe.hget(k.dead_info, item_id)
                due, leased, tries, dead, info = pipe.execute(raise_on_error=False)
            out.append(
                f"{tag} shard {raw_shard(item_id)}: due {due} leased {leased!r} tries {tries!r} dead {dead} {info!r}"
            )
        return "; ".join(out)

    def resolved(self, planted: Planted) -> list[str]:
        """Bad items neither delivered nor dead-lettered with a reason (yet)."""
        delivered = self.delivered()
        return [tag for i, tag in planted.bad.items() if not delivered[tag] and self.dead_reason(i) is None]


def raw_shard(item_id: bytes) -> int:
    """keys.shard_of on bytes, for ids that are not text (normalize_id refuses them)."""
    return zlib.crc32(item_id) % SHARDS


def cli_answers(url: str, prefix: str) -> None:
    runner = CliRunner()
    common = ["--url", url, "--prefix", prefix, "--shards", str(SHARDS)]
    for command in (["stats", *common], ["list", *common], ["dlq", "list", *common]):
        result = runner.invoke(main, command)
        assert result.exit_code == 0, (
            f"delayq {' '.join(command[:2])} failed: {result.output[-500:]} {result.exception!r}"
        )
        assert result.output.strip(), f"delayq {' '.join(command[:2])} said nothing"


EXPLICIT = [
    Garbage("score", -math.inf),
    Garbage("far_score", math.inf),
    Garbage("non_utf8_id", b"\xff\xfe"),
    Garbage("envelope", b"DQ\x01garbage"),
    Garbage("lease", b"not-a-lease"),
    Garbage("tries", b"abc"),
    Garbage("dead_info", b"{not json"),
    Garbage("wrong_type", "ranked"),
    Garbage("wrong_type", "tries"),
    Garbage("wake", b"hello"),
]


def test_garbage_never_stops_the_line(valkey_url: str, prefix: str, fleet: list[Proc], tmp_path: Path) -> None:
    store = make_store(valkey_url, prefix, shards=SHARDS, lease_seconds=1, max_attempts=3)
    client = redis.Redis.from_url(valkey_url)
    hostile = Hostile(store, client, f"{prefix}:{OUT}")

    def logs() -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(tmp_path.glob("forwarder*.log")))

    @settings(
        max_examples=int(os.environ.get("DELAYQ_HOSTILE_EXAMPLES", "20")),
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each example costs seconds
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(GARBAGE, min_size=1, max_size=4))
    def run(batch: list[Garbage]) -> None:
        planted = Planted()
        try:
            check(batch, planted)
        finally:  # repair and remove the garbage, so one failing example does not fail the next ones
            for keys in planted.broken_keys.values():
                client.delete(*keys)
            for shard, item_id in planted.ids:
                k = store.keys(shard)
                client.zrem(k.due, item_id)
                for hash_key in (k.items, k.tries, k.leased):
                    client.hdel(hash_key, item_id)

    def check(batch: list[Garbage], planted: Planted) -> None:
        # wrong types first: turning a key that already holds this example's dead letters into a
        # string would destroy their reasons (the test's doing, not the forwarders')
        for garbage in sorted(batch, key=lambda g: g.kind != "wrong_type"):
            hostile.plant(garbage, planted)
        # a shard with a key of the wrong type cannot take a schedule: its good items come after the repair
        good = hostile.schedule_good(s for s in range(SHARDS) if s not in planted.broken_keys)
        wait_for(
            lambda: all(hostile.delivered()[t] for t in good),
            RESOLVE_S,
            lambda: (
                f"good items delivered next to {batch}: missing "
                f"{[t for t in good if not hostile.delivered()[t]]}; logs:\n{logs()}"
            ),
        )
        assert all(p.poll() is None for p in fleet), f"a forwarder died of {batch}:\n{logs()}"
        cli_answers(valkey_url, prefix)
        for keys in planted.broken_keys.values():  # repaired: the shard must flow again
            client.delete(*keys)
        good += hostile.schedule_good(planted.broken_keys)
        wait_for(
            lambda: all(hostile.delivered()[t] for t in good) and not hostile.resolved(planted),
            RESOLVE_S,
            lambda: (
                f"after {batch}: good missing {[t for t in good if not hostile.delivered()[t]]}, "
                f"bad neither delivered nor dead-lettered {hostile.resolved(planted)} "
                f"({hostile.state(planted)}); logs:\n{logs()}"
            ),
        )
        twice = [t for t, c in hostile.delivered().items() if c > 1 and t.startswith("good")]
        assert not twice, f"good items delivered twice: {twice}"
        assert all(p.poll() is None for p in fleet), f"a forwarder died of {batch}:\n{logs()}"

    for garbage in EXPLICIT:
        run = example([garbage])(run)
    try:
        run()
    finally:
        client.close()
