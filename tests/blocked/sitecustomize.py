"""Make the modules named in ``DELAYQ_TEST_BLOCK`` (comma-separated top-level names) fail to import,
as they would where the extra that brings them is not installed. On PYTHONPATH of a subprocess
(``tests/test_first_contact.py``), so the CLI's "install the extra" paths run without a second venv."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

BLOCKED = frozenset(filter(None, os.environ.get("DELAYQ_TEST_BLOCK", "").split(",")))


class _Blocker:
    """A meta-path finder ahead of the real ones: a blocked name is 'not installed'."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocker())
