"""docs/groups.md's snippets run as written, as the README's do (``tests/test_readme.py``): each
Python or bash block of the page has a test here that runs it against the embedded Valkey (for
the snippets' ``redis://127.0.0.1:6379/0``) and checks what it did; a block with no entry in
:data:`RUNS` fails, so a snippet added to the page without a test cannot pass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from delayq_backends import DelayStore, Envelope
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from tests.harness.servers import delete_prefix
from tests.helpers import wait_for
from tests.readme import CHECKS, snippet, snippets

PAGE = Path(__file__).resolve().parent.parent / "docs" / "groups.md"

#: marker (a substring of exactly one block of the page) -> the test of this module that runs it
RUNS = {
    'store.schedule("report-1"': "test_using_groups_runs",
    'rate_key="tenant-7")': "test_aliases_run",
}


def test_every_block_has_a_test() -> None:
    """Each block of the page has a test here, but for the ones ``tests/readme.py`` says why no test
    runs (the "In short" fragment that came from the README)."""
    unchecked = []
    for block in snippets(path=PAGE):
        matched = [marker for marker in RUNS if marker in block.text]
        skipped = [marker for marker, check in CHECKS.items() if marker in block.text and check.skip]
        if skipped and not matched:
            continue
        if len(matched) != 1 or RUNS[matched[0]] not in globals():
            unchecked.append(f"docs/groups.md:{block.line} ({block.lang}) matches {matched or 'no entry'}")
    assert not unchecked, "give each block a test and a line in RUNS: " + "; ".join(unchecked)
    for marker in RUNS:
        assert len([b for b in snippets(path=PAGE) if marker in b.text]) == 1, f"{marker!r} names no block, or several"


@pytest.fixture
def page_store(valkey_url: str) -> Iterator[str]:
    """The embedded Valkey for the snippets' URL (never the system Redis's db 0); the snippets'
    default prefix ``delayq`` is deleted afterwards."""
    yield valkey_url
    with redis.Redis.from_url(valkey_url) as client:
        delete_prefix(client, "delayq:")


def run_block(marker: str, url: str) -> dict[str, object]:
    """Run the page's block holding ``marker`` on ``url``; its names afterwards."""
    scope: dict[str, object] = {}
    exec(compile(snippet(marker, PAGE).replace("redis://127.0.0.1:6379/0", url), "docs/groups.md", "exec"), scope)
    return scope


def groups(store: DelayStore, item_id: str) -> tuple[object, ...]:
    from delayq_backends.envelope import groups_of

    item = store.get(item_id)
    assert item is not None, f"{item_id} is not stored"
    return groups_of(Envelope.decode(item.envelope))


def test_using_groups_runs(page_store: str) -> None:
    """The items are stored with their groups, the runtime policy is set and the pause undone, and
    a forwarder releases the two items due now (one of two groups, one of one) into the list."""
    from delayq_backends.envelope import Group

    scope = run_block('store.schedule("report-1"', page_store)
    store = scope["store"]
    assert isinstance(store, DelayStore)
    assert groups(store, "report-1") == (Group("tenant-7"),)
    assert groups(store, "report-2") == (Group("tenant-7", limit=2),)
    assert groups(store, "sync-1") == (Group("tenant-7"), Group("crm-api", rate="100/m", cost=5))
    policy = store.group_policy("tenant-7")  # type: ignore[attr-defined]
    assert (policy.limit, policy.weight) == (3, 2.0)
    assert not store.group_policy("crm-api").paused  # type: ignore[attr-defined]
    client = redis.Redis.from_url(page_store)
    forwarder = Forwarder(store, [RedisListTarget(client)])

    def released() -> bool:
        forwarder.run_once()
        return int(client.llen("reports")) == 2

    wait_for(released, 10, lambda: f"the two items due now released: {client.lrange('reports', 0, -1)}")
    assert store.get("report-2") is not None  # due in a minute: still waiting


def test_aliases_run(page_store: str) -> None:
    """The block's own asserts (a slot and a rate key read back as groups), and the slot limit set
    through the alias is the group's runtime limit."""
    scope = run_block('rate_key="tenant-7")', page_store)
    store = scope["store"]
    assert isinstance(store, DelayStore)
    assert store.group_policy("customer-42").limit == 5  # type: ignore[attr-defined]
