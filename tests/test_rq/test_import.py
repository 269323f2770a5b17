"""RQ stays optional: the package root and the CLI never import it, and the adapter says which extra
to install when it is missing."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_root_and_cli_do_not_import_rq() -> None:
    result = run(
        "import sys, delayq_backends, delayq_backends.cli; print(sorted({'rq', 'croniter'} & set(sys.modules)))"
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_a_missing_rq_names_the_extra() -> None:
    result = run("import sys; sys.modules['rq'] = None; import delayq_backends.rq")
    assert result.returncode == 1
    assert 'install delayq_backends with its rq extra (in a checkout: pip install ".[rq]")' in result.stderr
