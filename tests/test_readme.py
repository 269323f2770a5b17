"""The README's testing examples (core and Celery) run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_testing_helper_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    examples = [b for b in blocks if "delayq_backends.testing" in b]
    assert len(examples) == 2, "the core and the Celery testing examples"
    for example in examples:
        exec(compile(example, str(README), "exec"), {})
