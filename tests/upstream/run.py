"""Run RQ's own scheduling tests against delayq_backends.rq: ``tox -e rq-upstream``.

Downloads the source distribution of the installed RQ from the package index (it ships its
tests), unpacks it into a temporary directory, drops rq_shim.py in as its conftest.py and runs
the scheduling tests there. ``--original`` runs them against RQ as it ships (the reference
count), still on an embedded Valkey. rq-scheduler's source distribution ships no tests.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: RQ's tests of scheduling, as (files, -k expression): the scheduler, registry, retry and repeat
#: suites whole, and the scheduling tests of the others (enqueue_at/in, unique and rate-limited
#: scheduled jobs, scheduled dependencies and callbacks).
RQ_TESTS = [
    (["tests/test_scheduler.py", "tests/test_retry.py", "tests/test_repeat.py"], None),
    (
        ["tests/test_queue_unique.py", "tests/test_rate_limit.py", "tests/test_queue.py", "tests/test_registry.py",
         "tests/test_job.py", "tests/test_dependencies.py", "tests/test_callbacks.py"],
        "schedul or enqueue_at or enqueue_in or unique or rate_limit",
    ),
]  # fmt: skip


def fetch_sdist(dist: str, into: Path) -> Path:
    """The unpacked source distribution of the installed version of ``dist``."""
    version = importlib.metadata.version(dist)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", f"{dist}=={version}",
         "-d", str(into), "-q"],
        check=True,
    )  # fmt: skip
    (archive,) = into.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data") if sys.version_info >= (3, 12) else tar.extractall(into)  # noqa: S202
    return next(p for p in into.iterdir() if p.is_dir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--original", action="store_true", help="run against RQ as it ships (no import swap)")
    args, pytest_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="delayq-upstream-") as tmp:
        source = fetch_sdist("rq", Path(tmp) / "sdist")
        shutil.copy(HERE / "rq_shim.py", source / "conftest.py")
        # delayq_backends importable without this repo's own `tests` package shadowing RQ's
        packages = Path(tmp) / "packages"
        packages.mkdir()
        (packages / "delayq_backends").symlink_to(ROOT / "delayq_backends")
        env = {**os.environ, "PYTHONPATH": str(packages), "DELAYQ_UPSTREAM_SWAP": "0" if args.original else "1"}
        failed = 0
        for files, selection in RQ_TESTS:
            chosen = ["-k", selection] if selection else []
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-rs",
                       "--rootdir", str(source), *files, *chosen, *pytest_args]  # fmt: skip
            failed |= subprocess.run(command, cwd=source, env=env).returncode
        return failed


if __name__ == "__main__":
    sys.exit(main())
