"""The architecture, checked on every test run: the layer rules (import-linter, configured in
pyproject.toml), ruff's rules (pyupgrade included) and mypy strict on the package. A change that
makes the store import the forwarder, or a library module import the CLI, fails here, not in a
review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_imports_run_one_way_down_the_layers() -> None:
    done = run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.alone  # the probe is in the package that mypy, ruff and lint-imports read beside it
def test_a_layer_violation_is_caught() -> None:
    """The contract can fail: a store module importing the forwarder is reported."""
    probe = ROOT / "delayq_backends" / "store" / "_layer_probe.py"
    probe.write_text("from ..forwarder import Forwarder  # noqa: F401\n")
    try:
        done = run(str(BIN / "lint-imports"), "--no-cache")
    finally:
        probe.unlink()
    assert done.returncode != 0
    assert "delayq_backends.store._layer_probe" in done.stdout


def test_ruff_passes() -> None:
    done = run(str(BIN / "ruff"), "check", "delayq_backends", "tests", "bench", "examples")
    assert done.returncode == 0, done.stdout[-4000:]


@pytest.mark.timeout(600)
def test_mypy_strict_passes(tmp_path: Path) -> None:
    done = run(str(BIN / "mypy"), "--cache-dir", str(tmp_path / "mypy"))
    assert done.returncode == 0, done.stdout[-4000:]
