"""The code blocks of the README and of the docs pages its depth lives in, and how each Python or
bash block is checked.

Every ```python and ```bash block of the :data:`PAGES` must match exactly one entry of
:data:`CHECKS`, a marker no other block of those pages holds (``tests/test_readme.py`` fails
otherwise): either the test that runs it, or why no test does. To add a snippet, add a line here: a
substring only that block contains, and its check. The README's depth lives in docs/, so a
snippet moved out of the README is still run from its page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHECKS", "PAGES", "README", "Check", "Snippet", "snippet", "snippets"]

IMPORT = "tests/test_periodic_import.py::"
README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = README.parent / "docs"

#: the README and every page of docs/ (each block checked here)
PAGES: tuple[Path, ...] = (README, *sorted(DOCS.glob("*.md")))

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Snippet:
    """One fenced block: its language, its text, its page and the line it starts on."""

    lang: str
    text: str
    line: int
    page: Path = README

    @property
    def where(self) -> str:
        """``README.md:12`` or ``docs/celery.md:40``: where a failure message points."""
        return f"{self.page.relative_to(README.parent)}:{self.line}"


@dataclass(frozen=True)
class Check:
    """How a block is checked: ``by`` names the test that runs it; ``skip`` says why none does."""

    by: str = ""
    skip: str = ""


def snippets(lang: tuple[str, ...] = ("python", "bash"), path: Path | None = None) -> list[Snippet]:
    """The ``lang`` blocks of ``path``, or of every page of :data:`PAGES` (in that order)."""
    found = []
    for page in PAGES if path is None else (path,):
        text = page.read_text(encoding="utf-8")
        found += [
            Snippet(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, page)
            for m in _BLOCK.finditer(text)
            if m.group(1) in lang
        ]
    return found


def snippet(marker: str, path: Path | None = None) -> str:
    """The text of the one block that contains ``marker``: of ``path``, or of all :data:`PAGES`."""
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
    # docs/celery.md
    "# no broker and no Redis in tests": Check(by="tests/test_readme.py::test_testing_examples_run"),
    "def test_checkout_charges_at_nine_tomorrow": Check(skip=FRAGMENT + "; tests/test_celery/test_testing_helper.py"),
    # 30 seconds with RQ
    'queue = Queue("default", connection=Redis())': Check(by=f"{CLEAN}::test_rq"),
    "# app/tasks.py": Check(by=f"{CLEAN}::test_rq"),
    "# retries with intervals go to the store too": Check(by=f"{CLEAN}::test_rq (each command)"),
    # the core API
    '# prefix "delayq", 16 shards': Check(by="tests/test_readme.py::test_core_api_runs"),
    "# SIGTERM: finish the batch, exit 0": Check(skip=FOREVER + "each command: tests/test_cli.py"),
    # docs/core.md
    "with build_forwarder(settings) as forwarder:": Check(skip=FOREVER + "build_forwarder: tests/test_assemble.py"),
    # docs/debounce.md
    "# 1,000 saves of document 7 in a burst": Check(by="tests/test_readme.py::test_debounce_example_runs"),
    'headers={"delayq_debounce": "doc-7"})\ndigest': Check(skip=FRAGMENT + "; tests/test_celery/test_debounce.py"),
    '"app.tasks.reindex", 7, delayq_debounce="doc-7")\nqueue': Check(
        skip=FRAGMENT + "; tests/test_rq/test_debounce.py"
    ),
    # docs/slots.md
    'store.set_slot_limit("customer-42", 5)   # at runtime': Check(
        skip=FRAGMENT + "; tests/test_slots.py runs each call"
    ),
    # docs/groups.md (tests/test_docs_groups.py runs the page's own blocks)
    'store.schedule("report-1"': Check(by="tests/test_docs_groups.py::test_using_groups_runs"),
    'rate_key="tenant-7")': Check(by="tests/test_docs_groups.py::test_aliases_run"),
    # docs/celery-periodic.md
    '"options": {"queue": "reports", "expires": 3600': Check(skip=FRAGMENT + "; tests/test_celery/test_periodic.py"),
    '"kwargs": {"asked_at": BeatLazyFunc(time.time)}': Check(
        skip=FRAGMENT + "; tests/test_celery/test_periodic_lazy.py"
    ),
    'store.set_group("tenant-7", limit=2, weight=3)': Check(
        skip=FRAGMENT + "; tests/test_docs_groups.py, test_group_api.py, test_celery/test_groups.py and "
        "test_rq/test_groups.py run each form"
    ),
    'store.open_batch("order-7"': Check(by="tests/test_readme.py::test_batch_example_runs"),
    "delayq periodic add sweep": Check(by="tests/test_readme.py::test_schedules_as_data_commands_run"),
    "batch.add(process.s(1))": Check(skip=FRAGMENT + "; tests/test_celery/test_batches.py runs each call"),
    "batch.add(process, 1)": Check(skip=FRAGMENT + "; tests/test_rq/test_batches.py runs each call"),
    '"options": {"delayq_overlap": "skip"}': Check(by="tests/test_readme.py::test_overlap_policies_snippet_runs"),
    # docs/spark.md
    "spark = local_session()": Check(skip="reads reminders.parquet, which the page does not make"),
    "result.rejects.show()  # … and why": Check(skip=FRAGMENT + "; tests/test_spark/test_bulk.py"),
    "delayq spark schedule reminders.parquet": Check(
        skip="reads reminders.parquet on a server the page does not start; the command: tests/test_spark/test_bulk.py"
    ),
    "delayq spark export --url redis://store:6379/0 --out scheduled.jsonl": Check(
        skip="names a server the page does not start; each command: tests/test_spark/test_audit.py"
    ),
    "delayq spark export --out scheduled.jsonl": Check(
        by=f"{CLEAN}::test_spark_export (slow: its export line from a clean venv; in the default run "
        f"tests/test_spark/test_audit.py::test_cli_exports_a_snapshot_and_audits_files)"
    ),
    # docs/core.md
    "def sign_up(store, user_id):": Check(by="tests/test_readme.py::test_testing_examples_run"),
    # In production
    # docs/flow.md
    'DELAYQ_MAX_QUEUE_DEPTH="default=5000 high=500"': Check(skip=FOREVER + "tests/test_flow.py"),
    'app.conf.delayq_max_queue_depth = {"celery": 10_000}\napp': Check(
        skip=FRAGMENT + "; tests/test_flow.py (the Celery settings)"
    ),
    # docs/debounce.md, per-key rate caps
    "--key-rate celery=20/s": Check(skip=FOREVER + "tests/test_key_rate.py"),
    'headers={"delayq_rate_key": f"tenant-{tenant}"}': Check(skip=FRAGMENT),
    "--metrics-port 9477": Check(skip=FOREVER + "tests/test_metrics.py"),
    # docs/dedupe.md
    "app.conf.delayq_dedupe_ttl = 86400": Check(skip=FRAGMENT + "; tests/test_celery/test_dedupe.py"),
    "app.conf.delayq_lossless_window = 60": Check(skip=FRAGMENT + "; tests/test_celery/test_lossless.py"),
    # docs/priority.md
    'store.schedule("report-42", timedelta(minutes=5), envelope, rank=5)': Check(
        skip=FRAGMENT + "; tests/test_priority.py"
    ),
    # docs/rq.md
    'pip install ".[rq]"': Check(by=f"{CLEAN}::test_rq (the rq extra into a fresh venv)"),
    'queue.enqueue_at(datetime(2030, 1, 1, 9, tzinfo=timezone.utc), "app.tasks.new_year")': Check(
        by="tests/test_readme.py::test_rq_page_example_runs"
    ),
    "# no --with-scheduler": Check(skip=FOREVER + f"the README's RQ commands, run by {CLEAN}::test_rq"),
    "--rq-cron myapp/cron_config.py": Check(skip=FOREVER + "tests/test_rq/test_cron_processes.py"),
    "delayq_cron.register(report": Check(
        skip="imports myapp.jobs, your app's module; tests/test_rq/test_cron_entries.py runs each call"
    ),
    "delayq periodic update nightly --kind rq": Check(
        skip="names servers the page does not start; each command: tests/test_rq/test_periodic_cli.py"
    ),
    "delayq rq-migrate --url redis://localhost:6379/0 --rq-redis redis://localhost:6379/0\n": Check(
        skip="a one-off on your RQ Redis (the README's RQ block runs it); tests/test_rq/test_migrate_and_cli.py"
    ),
    "delayq rq-upgrade --url": Check(skip="needs 0.1.0's jobs to upgrade; tests/test_rq/test_upgrade.py"),
    "--url redis://cluster-node-1:7000/0": Check(skip=FOREVER + "a store on a cluster: tests/test_durable_writes.py"),
    # docs/dashboard.md
    'pip install ".[web,celery]"': Check(by=f"{CLEAN}::test_web (each command)"),
    '"queue": "billing"}\'': Check(by=f"{CLEAN}::test_web"),
    'pip install ".[web]"      #': Check(skip=FOREVER + "the same commands: the block above, run by " + CLEAN),
    '"id": "charge-42"}\'': Check(skip="needs a dashboard running with a token; each call: tests/test_web/test_api.py"),
    "curl -X POST http://127.0.0.1:8765/api/v1/periodic": Check(
        skip="needs a dashboard running with a token; each call: tests/test_web/test_periodic.py"
    ),
    # docs/migrating.md
    "--from redbeat --redbeat-redis": Check(by=IMPORT + "test_docs_redbeat_import_and_rollback"),
    "RedBeatSchedulerEntry.from_key": Check(by=IMPORT + "test_docs_redbeat_import_and_rollback"),
    "--from django-celery-beat --database": Check(by=IMPORT + "test_docs_django_celery_beat_import_and_rollback"),
    "PeriodicTasks.update_changed": Check(by=IMPORT + "test_docs_django_celery_beat_import_and_rollback"),
    "--from rq-scheduler --rq-redis": Check(by=IMPORT + "test_docs_rq_scheduler_import_and_rollback"),
    '"rq:scheduler:scheduled_jobs", {item.id': Check(by=IMPORT + "test_docs_rq_scheduler_import_and_rollback"),
    "--from rq-cron --config": Check(by=IMPORT + "test_docs_rq_cron_import"),
}
