"""The README and docs/ link only to what exists: each relative link names a file of the
repository and, with ``#anchor``, a heading of that page (GitHub's anchors). The README is the
front door and its depth lives in docs/ (issue 32): a page renamed or a heading reworded must not
leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``: lower case, punctuation dropped, spaces to
    ``-``, a repeated heading numbered ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#+ (.+)$", _FENCE.sub("", page.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no {path})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
