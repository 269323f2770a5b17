"""The typed script layer matches the .lua files: every script has one typed object, each shard
script's keys are those its header lists, and no script reads a key it is not sent."""

from __future__ import annotations

import re

import pytest

from delayq_backends.scripts import SCRIPT_NAMES, RqEnqueue, RqFail, RqFields, RqMove, RqRun, RqSchedule, script
from delayq_backends.scripts.library import ScriptCall
from delayq_backends.scripts.store import (
    SHARD_SCRIPTS,
    BatchAdd,
    BatchEnd,
    BatchOpen,
    PeriodicRegistry,
    PeriodicRun,
    PeriodicTrust,
    SlotEnd,
    SlotTake,
    SyncVersion,
    Take,
)
from tests.harness import make_store

HEADER_KEY = re.compile(r"KEYS\[(\d+)\] ([a-z_]+)")


def test_every_lua_file_has_one_typed_object() -> None:
    typed = {
        *SHARD_SCRIPTS,
        Take.name,
        RqFields.name,
        RqEnqueue.name,
        RqFail.name,
        RqMove.name,
        RqSchedule.name,
        RqRun.name,
    }
    typed |= {SlotTake.name, SlotEnd.name, BatchOpen.name, BatchAdd.name, BatchEnd.name}
    typed |= {PeriodicRun.name, PeriodicRegistry.name, PeriodicTrust.name, SyncVersion.name}
    assert typed == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", sorted(SHARD_SCRIPTS))
def test_a_shard_script_is_sent_the_keys_its_header_lists_in_order(name: str) -> None:
    body = script(name).body
    header = body[: body.index("]]")]  # the script's own opening block comes first
    listed = [key for _, key in sorted((int(n), key) for n, key in HEADER_KEY.findall(header))]
    assert listed == list(SHARD_SCRIPTS[name].key_names)
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", body)}
    assert used == set(range(1, len(listed) + 1))  # reads no key beyond those it is sent


def test_no_include_reads_a_keys_global() -> None:
    from importlib import resources

    includes = resources.files("delayq_backends.scripts") / "includes"
    for path in includes.iterdir():
        assert "KEYS[" not in path.read_text(encoding="utf-8"), path.name


def test_take_includes_no_shard_helper() -> None:
    body = script("take").body
    assert "local function bury" not in body and "local function set_rank" not in body


def test_a_call_queued_on_a_pipeline_reads_like_one_run_now(valkey_url: str, prefix: str) -> None:
    """On one server (redis-py runs no script in a cluster pipeline, so the cluster has no such path)."""
    from delayq_backends.scripts.store import Cancel

    store = make_store(valkey_url, prefix)
    call: ScriptCall[object] = Cancel.call(store.keys(0), "missing")
    with store.client.pipeline(transaction=True) as pipe:
        store.scripts.queue(call, pipe)
        (raw,) = pipe.execute()
    assert call.parse(raw) == store.scripts.run(call)
