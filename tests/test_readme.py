"""The README's snippets, and those of the docs pages its depth moved to (``tests/readme.py``
PAGES), run as written: each Python or bash block has a test that runs it, or an entry in
``tests/readme.py`` that says why none does; a new block with neither fails here."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator

import pytest
import redis

from delayq_backends import DelayStore
from tests.harness.servers import delete_prefix
from tests.readme import CHECKS, FRAGMENT, snippet, snippets


def test_every_snippet_has_a_check() -> None:
    unchecked = []
    for block in snippets():
        matched = [marker for marker in CHECKS if marker in block.text]
        if len(matched) != 1:
            unchecked.append(f"{block.where} ({block.lang}) matches {matched or 'no entry'}")
    assert not unchecked, "give each block one entry in tests/readme.py CHECKS: " + "; ".join(unchecked)


#: the modules whose public names a fragment may use: each must be imported in the fragment
LIBRARY = ("delayq_backends", "delayq_backends.celery", "delayq_backends.rq", "delayq_backends.targets")


def test_fragments_import_the_library_names_they_use() -> None:
    """A fragment leaves out your app, tasks and store, never where the library's names come
    from: each public name of the library it uses (``Batch``, ``RedisListTarget``, ...) is
    imported in it or in a block above on its page, and its imports run. (The Batches fragment
    used ``Batch`` with no import anywhere.)"""
    public = {name for module in LIBRARY for name in importlib.import_module(module).__all__}
    above: set[str] = set()
    page = None
    for block in snippets(("python",)):
        if block.page != page:
            page, above = block.page, set()
        tree = ast.parse(block.text)
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        bound = {alias.asname or alias.name.split(".")[0] for node in imports for alias in node.names}
        [marker] = [m for m in CHECKS if m in block.text]
        if CHECKS[marker].skip.startswith(FRAGMENT):
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            missing = sorted((used & public) - bound - above)
            assert not missing, f"{block.where}: import {missing}"
            exec(compile(ast.Module(body=list(imports), type_ignores=[]), block.where, "exec"), {})
        above |= bound


def test_every_check_names_a_block_and_says_how() -> None:
    for marker, check in CHECKS.items():
        assert len([b for b in snippets() if marker in b.text]) == 1, f"{marker!r} matches no block, or several"
        assert bool(check.by) != bool(check.skip), f"{marker!r}: a test that runs it, or a reason, not both"


def test_testing_examples_run() -> None:
    for marker in ("# no broker and no Redis in tests", "def sign_up(store, user_id):"):
        exec(compile(snippet(marker), "docs", "exec"), {})


@pytest.fixture
def readme_store(valkey_url: str) -> Iterator[str]:
    """The embedded Valkey for the snippet's ``redis://127.0.0.1:6379/0`` (never the system Redis's
    db 0); the snippet's default prefix ``delayq`` is deleted afterwards."""
    yield valkey_url
    with redis.Redis.from_url(valkey_url) as client:
        delete_prefix(client, "delayq:")


def test_batch_example_runs(readme_store: str) -> None:
    code = snippet('store.open_batch("order-7"')
    scope: dict[str, object] = {}
    exec(compile(code.replace("redis://127.0.0.1:6379/0", readme_store), "README.md", "exec"), scope)
    store = scope["store"]
    assert isinstance(store, DelayStore)
    status = store.batch_status("order-7")
    assert status is not None and (status.total, status.succeeded, status.failed, status.completed) == (3, 2, 1, True)
    assert store.get("batch-order-7") is not None  # the on_complete item, ready for a forwarder


def test_core_api_runs(readme_store: str) -> None:
    code = snippet('# prefix "delayq", 16 shards')
    scope: dict[str, object] = {}
    exec(compile(code.replace("redis://127.0.0.1:6379/0", readme_store), "README.md", "exec"), scope)
    store = scope["store"]
    assert isinstance(store, DelayStore)
    assert store.get("reminder-42") is None and store.get("r99999") is not None


def test_debounce_example_runs(readme_store: str) -> None:
    """docs/debounce.md's first block: a thousand debounces of one key are one item that counts
    them, and the throttle is one item of its own."""
    code = snippet("# 1,000 saves of document 7 in a burst")
    scope: dict[str, object] = {}
    exec(compile(code.replace("redis://127.0.0.1:6379/0", readme_store), "docs/debounce.md", "exec"), scope)
    store = scope["store"]
    assert isinstance(store, DelayStore)
    debounced, throttled = store.get("debounce:doc-7"), store.get("throttle:feed-3")
    assert debounced is not None and debounced.calls == 1000
    assert throttled is not None and throttled.calls == 1


def test_rq_page_example_runs(readme_store: str) -> None:
    """docs/rq.md's first snippet, on the embedded Valkey for ``Redis()``: the delayed jobs and the
    periodic and cron jobs are the scheduler's four jobs, each in the store under its RQ job id."""
    code = snippet('queue.enqueue_at(datetime(2030, 1, 1, 9, tzinfo=timezone.utc), "app.tasks.new_year")')
    scope: dict[str, object] = {}
    with redis.Redis.from_url(readme_store) as client:
        try:
            exec(compile(code.replace("Redis()", f"Redis.from_url({readme_store!r})"), "docs/rq.md", "exec"), scope)
            store = DelayStore.from_url(readme_store)
            jobs = list(scope["scheduler"].get_jobs())  # type: ignore[attr-defined]
            assert {job.func_name for job in jobs} == {
                f"app.tasks.{name}" for name in ("send_reminder", "new_year", "poll", "digest")
            }
            assert scope["job"].id in {job.id for job in jobs}  # type: ignore[attr-defined]
            assert all(store.get(job.id) is not None for job in jobs) and len(store.scheduled(count=10)) == 4
        finally:
            delete_prefix(client, "rq:")


def test_overlap_policies_snippet_runs(readme_store: str) -> None:
    """The Celery entry syncs with its policy; the RQ jobs are stored with theirs and their slot."""
    from datetime import datetime, timezone

    from celery import Celery

    from delayq_backends.celery.periodic import sync
    from delayq_backends.envelope import Envelope
    from delayq_backends.periodic.ops import statuses
    from delayq_backends.rq import Scheduler

    app = Celery("proj", broker="memory://", set_as_current=False)
    scope: dict[str, object] = {
        "app": app,
        "Scheduler": Scheduler,
        "Redis": lambda: redis.Redis.from_url(readme_store),
        "datetime": datetime,
        "timezone": timezone,
    }
    exec(compile(snippet('"options": {"delayq_overlap": "skip"}'), "README.md", "exec"), scope)
    store = DelayStore.from_url(readme_store)
    assert sync(app, store).added == ["nightly-report"]
    assert [(s.name, s.overlap, s.skipped) for s in statuses(store)] == [("nightly-report", "skip", 0)]
    policies = []
    for job in scope["scheduler"].get_jobs():  # type: ignore[attr-defined]
        item = store.get(job.id)
        assert item is not None and job.meta["delayq_slot"] == {"key": f"periodic:{job.id}", "limit": 1}
        policies.append(Envelope.decode(item.envelope).meta["schedule"]["overlap"])
    assert sorted(policies) == ["buffer_one", "skip"]


def test_schedules_as_data_commands_run(readme_store: str) -> None:
    """Each command of the block, as written, against the embedded Valkey: the Celery entry ends
    paused-then-resumed with one run asked for and one backfill pending, the RQ entry is listed
    with its function, and history and list answer (exit 0)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from delayq_backends.periodic import ops

    code = snippet("delayq periodic add sweep").replace("redis://localhost:6379/0", readme_store)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DELAYQ_PREFIX": "delayq"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "app.jobs.sweep" in done.stdout and "nightly" in done.stdout  # the listing
    store = DelayStore.from_url(readme_store, prefix="delayq")
    nightly, sweep = ops.get(store, "nightly"), ops.get(store, "sweep")
    assert nightly is not None and sweep is not None
    assert (nightly.kind, nightly.source, nightly.enabled, nightly.tz) == ("celery", "runtime", True, "Europe/Berlin")
    assert nightly.run_now == 1 and len(nightly.backfill) == 1 and nightly.jitter_ms == 30_000
    assert (sweep.kind, sweep.task) == ("rq", "app.jobs.sweep")
