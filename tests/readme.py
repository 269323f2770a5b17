"""The README's code blocks, and how each Python or bash block is checked.

Every ```python and ```bash block of README.md must match exactly one entry of :data:`CHECKS`
(``tests/test_readme.py`` fails otherwise): either the test that runs it, or why no test does. To
add a snippet, add a line here: a substring only that block contains, and its check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHECKS", "README", "Check", "Snippet", "snippet", "snippets"]

README = Path(__file__).resolve().parent.parent / "README.md"

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Snippet:
    """One fenced block: its language, its text and the README line it starts on."""

    lang: str
    text: str
    line: int


@dataclass(frozen=True)
class Check:
    """How a block is checked: ``by`` names the test that runs it; ``skip`` says why none does."""

    by: str = ""
    skip: str = ""


def snippets(lang: tuple[str, ...] = ("python", "bash"), path: Path = README) -> list[Snippet]:
    """The ``lang`` blocks of ``path`` (the README, or a page of docs/ whose blocks a test runs)."""
    text = path.read_text(encoding="utf-8")
    return [
        Snippet(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in _BLOCK.finditer(text)
        if m.group(1) in lang
    ]


def snippet(marker: str, path: Path = README) -> str:
    """The text of the one block of ``path`` that contains ``marker``."""
    [found] = [s.text for s in snippets(path=path) if marker in s.text]
    return found


CLEAN = "tests/test_clean_install.py"
FRAGMENT = "a fragment: uses names (tasks, a queue, an envelope) from the snippets above"
FOREVER = "runs until SIGTERM; "

#: marker (a substring of exactly one block) -> its check
CHECKS: dict[str, Check] = {
    # Two commands
    ".venv/bin/delayq demo": Check(by=f"{CLEAN}::test_core (pip install -c constraints.txt . && delayq demo)"),
    '-e ".[dev]"': Check(by="tests/test_reproducible.py (the test command itself: .ci/run runs it)"),
    # 30 seconds with Celery
    "# proj/celery.py": Check(by=f"{CLEAN}::test_celery"),
    "# proj/tasks.py": Check(by=f"{CLEAN}::test_celery"),
    "celery -A proj delayq periodic list": Check(by=f"{CLEAN}::test_celery (each command)"),
    "add.apply_async((2, 2), countdown=10)": Check(by=f"{CLEAN}::test_celery"),
    "with delayed_tasks(app, clock=": Check(by="tests/test_readme.py::test_testing_examples_run"),
    # 30 seconds with RQ
    'queue = Queue("default", connection=Redis())': Check(by=f"{CLEAN}::test_rq"),
    "# app/tasks.py": Check(by=f"{CLEAN}::test_rq"),
    "rq worker --queue-class delayq_backends.rq.Queue default": Check(by=f"{CLEAN}::test_rq (each command)"),
    # the core API
    'store = DelayStore.from_url("redis://127.0.0.1:6379/0")': Check(by="tests/test_readme.py::test_core_api_runs"),
    "delayq forward --url redis://127.0.0.1:6379/0 ": Check(skip=FOREVER + "each command: tests/test_cli.py"),
    "with build_forwarder(settings) as forwarder:": Check(skip=FOREVER + "build_forwarder: tests/test_assemble.py"),
    'store.debounce("doc-7"': Check(skip=FRAGMENT),
    'store.set_slot_limit("customer-42", 5)': Check(skip=FRAGMENT + "; tests/test_slots.py runs each call"),
    'store.set_group("tenant-7", limit=2, weight=3)': Check(
        skip=FRAGMENT + "; tests/test_docs_groups.py, test_group_api.py, test_celery/test_groups.py and "
        "test_rq/test_groups.py run each form"
    ),
    'store.open_batch("order-7"': Check(by="tests/test_readme.py::test_batch_example_runs"),
    "delayq periodic add nightly": Check(by="tests/test_readme.py::test_schedules_as_data_commands_run"),
    "batch.add(process.s(1))": Check(skip=FRAGMENT + "; tests/test_celery/test_batches.py runs each call"),
    "batch.add(process, 1)": Check(skip=FRAGMENT + "; tests/test_rq/test_batches.py runs each call"),
    '"options": {"delayq_overlap": "skip"}': Check(by="tests/test_readme.py::test_overlap_policies_snippet_runs"),
    # Spark
    "result = schedule_dataframe(": Check(skip="reads reminders.parquet, which the README does not make"),
    "delayq spark export --out scheduled.jsonl": Check(
        by=f"{CLEAN}::test_spark_export (slow: its export line from a clean venv; in the default run "
        f"tests/test_spark/test_audit.py::test_cli_exports_a_snapshot_and_audits_files)"
    ),
    # Testing without Redis
    "def sign_up(store, user_id):": Check(by="tests/test_readme.py::test_testing_examples_run"),
    # In production
    "--max-queue-depth celery=10000 --rate celery=500/s": Check(skip=FOREVER + "tests/test_flow.py"),
    "app.conf.delayq_max_queue_depth =": Check(skip=FRAGMENT),
    "--key-rate celery=20/s": Check(skip=FOREVER + "tests/test_key_rate.py"),
    'headers={"delayq_rate_key": f"tenant-{tenant}"}': Check(skip=FRAGMENT),
    "--metrics-port 9477": Check(skip=FOREVER + "tests/test_metrics.py"),
    'pip install ".[web,celery]"': Check(by=f"{CLEAN}::test_web (each command)"),
    "curl -X POST http://127.0.0.1:8765/api/v1/celery": Check(by=f"{CLEAN}::test_web"),
}
