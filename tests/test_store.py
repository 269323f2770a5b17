"""The store's public API: refused input says what to pass and stores nothing."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from redis.crc import key_slot

from delayq_backends import (
    Config,
    ConfigError,
    DelayStore,
    Envelope,
    EnvelopeError,
    InvalidIdError,
    InvalidTimeError,
    PayloadTooLargeError,
    ShardMismatchError,
)
from delayq_backends.errors import NewerFormatError
from delayq_backends.keys import shard_tags
from delayq_backends.store import base
from delayq_backends.targets import RedisListTarget
from delayq_backends.timeutil import to_ms
from tests.harness import make_store

ENV = RedisListTarget.envelope("out", b"x")


@pytest.fixture
def vstore(valkey_url: str, prefix: str) -> DelayStore:
    return make_store(valkey_url, prefix, shards=4, max_payload_bytes=1024)


@pytest.mark.parametrize(
    "when, message",
    [
        (datetime(2030, 1, 1), "naive datetime"),
        (math.nan, "not a finite time"),
        (math.inf, "not a finite time"),
        (-1, "before 1970"),
        (timedelta(seconds=-5), "negative delay"),
        (1_800_000_000_000, "epoch milliseconds passed as seconds"),
        (1e30, "after year 9999"),
        (True, "cannot schedule at True"),
        ("2030-01-01", "cannot schedule at '2030-01-01'"),
        (None, "cannot schedule at None"),
    ],
)
def test_bad_ready_times_are_refused_and_nothing_stored(vstore: DelayStore, when: object, message: str) -> None:
    with pytest.raises(InvalidTimeError, match=message):
        vstore.schedule("a", when, ENV)  # type: ignore[arg-type]
    assert not vstore.exists("a")


def test_naive_datetime_message_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match=r"pass an aware datetime"):
        to_ms(datetime(2030, 1, 1))


@pytest.mark.parametrize(
    "when, expected",
    [
        (datetime(2030, 1, 1, tzinfo=timezone.utc), 1_893_456_000_000),
        (datetime(2030, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))), 1_893_456_000_000),
        (1_893_456_000.0015, 1_893_456_000_002),
        (timedelta(seconds=5), 1_000_005_000),
    ],
)
def test_accepted_ready_times(when: object, expected: int) -> None:
    assert to_ms(when, clock=lambda: 1_000_000_000) == expected  # type: ignore[arg-type]


def test_epoch_seconds_round_to_the_microsecond_then_up_to_the_ms() -> None:
    """to_ms decides most float times by their fraction; it must agree with ceil(round(ms, 3))
    everywhere, near the half microsecond and at float noise on either side of a whole ms."""
    rng = random.Random(7)
    seconds = [rng.uniform(0, 4e9) for _ in range(20_000)] + [rng.randint(0, 2**41) / 1000 for _ in range(20_000)]
    for whole in (0, 1, 300, 1_893_456_000_000):
        for fraction in (0.0, 1e-9, 0.0004, 0.000499999, 0.0005, 0.000500001, 0.0006, 0.5, 0.9995, 0.999999):
            seconds.append((whole + fraction) / 1000)
    seconds += [0.3, 1_893_456_000.0015, 1_893_456_000.0005, 1.0000004999]
    for when in seconds:
        assert to_ms(when) == math.ceil(round(when * 1000, 3)), when


@pytest.mark.parametrize(
    "item_id, message",
    [
        ("", "empty"),
        ("x" * 513, "over 512 bytes"),
        (42, "must be a str"),
        (b"\xff", "not UTF-8"),
        ("\ud800", "surrogates"),
    ],
)
def test_bad_ids_are_refused(vstore: DelayStore, item_id: object, message: str) -> None:
    with pytest.raises(InvalidIdError, match=message):
        vstore.schedule(item_id, 0, ENV)  # type: ignore[arg-type]


def test_payload_over_limit_is_refused_with_size(vstore: DelayStore) -> None:
    with pytest.raises(PayloadTooLargeError, match=r"over max_payload_bytes=1024"):
        vstore.schedule("big", 0, RedisListTarget.envelope("out", b"x" * 2000))
    assert not vstore.exists("big")


@pytest.mark.parametrize("payload", [b"not an envelope", "text", 5])
def test_non_envelope_payload_is_refused(vstore: DelayStore, payload: object) -> None:
    with pytest.raises(EnvelopeError, match="Envelope"):
        vstore.schedule("a", 0, payload)  # type: ignore[arg-type]


def test_unserializable_meta_is_refused(vstore: DelayStore) -> None:
    with pytest.raises(EnvelopeError, match="not JSON-serializable"):
        vstore.schedule("a", 0, Envelope("list", "out", b"", meta={"when": datetime.now()}))


def test_one_bad_entry_in_bulk_stores_nothing(vstore: DelayStore) -> None:
    with pytest.raises(InvalidTimeError):
        vstore.schedule_many([("a", 0, ENV), ("b", math.nan, ENV)])
    assert not vstore.exists("a")


def test_bad_mode_is_refused(vstore: DelayStore) -> None:
    with pytest.raises(ValueError, match="'replace' or 'keep'"):
        vstore.schedule("a", 0, ENV, mode="upsert")


def test_shard_count_mismatch_is_a_clear_error(valkey_url: str, prefix: str) -> None:
    make_store(valkey_url, prefix, shards=4).schedule("a", 0, ENV)
    other = make_store(valkey_url, prefix, shards=8)
    with pytest.raises(ShardMismatchError, match=r"holds 4 shards in Redis .* configured with 8"):
        other.schedule("b", 0, ENV)
    with pytest.raises(ShardMismatchError):
        other.claim(0)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"shards": 0}, "shards=0"),
        ({"prefix": "a{b}"}, "braces"),
        ({"lease_seconds": -1}, "lease_seconds"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"colour": "red"}, "unknown delayq setting"),
    ],
)
def test_bad_config_is_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_mapping(settings)


def test_unreachable_server_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"cannot use Redis at redis://u:\*\*\*@127.0.0.1:1/0"):
        DelayStore.from_url("redis://u:secret@127.0.0.1:1/0")


def test_envelope_round_trip_and_corruption_messages() -> None:
    env = Envelope("celery", "q", b"\x00\xffbody", meta={"headers": {"ü": 1}})
    assert Envelope.decode(env.encode()) == env
    data = env.encode()
    with pytest.raises(EnvelopeError, match="truncated"):
        Envelope.decode(data[:10])
    with pytest.raises(NewerFormatError, match="version 9 is newer than this delayq reads"):
        Envelope.decode(data[:2] + b"\x09" + data[3:])
    with pytest.raises(EnvelopeError, match="not a delayq envelope"):
        Envelope.decode(b"XX" + data[2:])
    meta_at = data.index(b'{"headers"')
    with pytest.raises(EnvelopeError, match="header is corrupt"):
        Envelope.decode(data[:meta_at] + b"[" + data[meta_at + 1 :])
    with pytest.raises(EnvelopeError, match="header is corrupt"):
        Envelope.decode(Envelope("list", "q", meta={"a": 1}).encode().replace(b'{"a":1}', b"[1,2,3]"))


def test_list_and_stats_follow_time_order(store: DelayStore) -> None:
    base = 4_000_000_000  # 2096: none due by the real clock (2027-01-15 was, from that day)
    store.schedule_many([(f"i{n}", base + n, ENV) for n in range(30)])
    page = store.scheduled(offset=5, count=10)
    assert [i.id for i in page] == [f"i{n}" for n in range(5, 15)]
    window = store.scheduled(start=base + 10, end=base + 12)
    assert [i.id for i in window] == ["i10", "i11", "i12"]
    stats = store.stats()
    assert sum(s.scheduled for s in stats) == 30 and sum(s.due for s in stats) == 0
    assert min(s.next_ready_ms for s in stats if s.next_ready_ms) == base * 1000


def test_due_count_and_overdue_age(store: DelayStore) -> None:
    now = store.server_time_ms()
    store.schedule_many([("old", (now - 5000) / 1000, ENV), ("new", (now + 60_000) / 1000, ENV)])
    stats = store.stats()
    assert sum(s.due for s in stats) == 1
    assert 5000 <= max(s.oldest_overdue_ms for s in stats) < 15_000


@pytest.mark.parametrize("shards", [1, 3, 16, 64, 256])
def test_layout_2_spreads_shards_evenly_over_any_equal_split_of_the_slots(shards: int) -> None:
    for prefix in ("delayq", "myapp", "t0"):
        tags = shard_tags(prefix, shards)
        for k, tag in enumerate(tags):
            assert k * 16384 // shards <= key_slot(tag.encode()) < (k + 1) * 16384 // shards
            assert tag == f"{prefix}:{k}" or tag.startswith(f"{prefix}:{k}:")
        for masters in range(2, 13):  # masters owning equal contiguous ranges, as cluster create makes
            owner = Counter(min(masters - 1, key_slot(t.encode()) * masters // 16384) for t in tags)
            shares = [owner.get(m, 0) for m in range(masters)]
            assert max(shares) - min(shares) <= 1, (prefix, shards, masters, shares)


def test_a_new_prefix_records_layout_2_and_an_old_one_keeps_its_keys(valkey_url: str, prefix: str) -> None:
    new = make_store(valkey_url, prefix, shards=4)
    new.schedule("a", 1, Envelope("list", "out", b"x"))
    assert new.client.hget(f"{prefix}:meta", "layout") == b"2"
    assert [new.keys(k).tag for k in range(4)] == [f"{{{t}}}" for t in shard_tags(prefix, 4)]

    old = f"{prefix}old"  # a prefix made before layouts were recorded: shards and format, no layout
    new.client.hset(f"{old}:meta", mapping={"shards": 4, "format": 1})
    before = make_store(valkey_url, old, shards=4)
    before.schedule("b", 1, Envelope("list", "out", b"x"))
    shard = before.shard_of("b")
    assert new.client.zscore(f"{old}:{{{old}:{shard}}}:due", "b") is not None, "layout 1 keys, as before"
    assert new.client.hget(f"{old}:meta", "layout") is None


def test_a_bulk_schedule_that_loses_its_connection_mid_stream_runs_the_rest_again(
    valkey_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """schedule_many sends every call before reading a reply; a connection lost among the
    replies leaves unknown which calls ran, so those run again (scheduling is idempotent)."""
    store = make_store(valkey_url, prefix, shards=4)
    read = base._read
    seen: list[int] = []

    def losing(call: Any, connection: Any) -> Any:
        seen.append(1)
        if len(seen) == 3:
            connection.disconnect()  # as a server restart or a network cut would
        return read(call, connection)

    monkeypatch.setattr(base, "_read", losing)
    counts = store.schedule_many((f"i{n}", 1, ENV) for n in range(4000))  # 8+ calls of 500
    assert len(seen) == 3  # the third read failed: the calls from there on ran again, not read
    assert counts.total == 4000 and counts.added >= 1000  # the first two calls' replies were read
    assert sum(s.scheduled for s in store.stats()) == 4000
