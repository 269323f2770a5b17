"""The pinned versions (``constraints.txt``, written by ``.ci/refresh-constraints``) and what an
environment has of them: the README's commands and ``.ci/run`` install with ``-c constraints.txt``,
so a fresh machine runs the tests on the versions CI ran them on, and a drift is named."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.harness.launch import ROOT

__all__ = ["CONSTRAINTS", "OURS", "dev_closure", "frozen", "off_pins", "pins"]

CONSTRAINTS = ROOT / "constraints.txt"
#: the project itself: installed from the checkout, never pinned
OURS = canonicalize_name("delayq_backends")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins() -> dict[str, str]:
    """Each pinned package (canonical name) and its version; a line that is neither a pin nor a
    comment is an error, so a hand-edited range cannot slip in."""
    found: dict[str, str] = {}
    for n, line in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _PIN.match(line.strip())
        assert match, f"constraints.txt:{n}: {line!r} is not name==version (run .ci/refresh-constraints)"
        found[canonicalize_name(match[1])] = match[2]
    return found


def off_pins(installed: Mapping[str, str]) -> list[str]:
    """What in ``installed`` (name -> version) is not at its pin, one line each, saying the fix."""
    pinned = pins()
    wrong = []
    for name, version in sorted(installed.items()):
        name = canonicalize_name(name)
        if name == OURS:
            continue
        if name not in pinned:
            wrong.append(f"{name}=={version} has no pin: run .ci/refresh-constraints (docs/tests.md)")
        elif pinned[name] != version:
            wrong.append(f"{name}=={version} but constraints.txt pins {pinned[name]}")
    return wrong


def frozen(lines: Iterable[str]) -> dict[str, str]:
    """``pip freeze`` output as name -> version (the checkout's own line left out)."""
    return {m[1]: m[2] for m in map(_PIN.match, (line.strip() for line in lines)) if m}


def dev_closure() -> dict[str, str]:
    """Every installed distribution ``delayq_backends[dev]`` needs, directly or not: name -> version."""
    seen: dict[str, str] = {}
    done: set[tuple[str, str]] = set()
    todo = [(OURS, "dev")]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done:
            continue
        done.add((name, extra))
        dist = metadata.distribution(name)
        seen[canonicalize_name(dist.metadata["Name"])] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(canonicalize_name(req.name), e) for e in ("", *req.extras)]
    return seen
