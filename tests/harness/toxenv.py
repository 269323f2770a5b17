"""The supported Celery and RQ lines as ``tox.ini`` declares them, read by ``.ci/matrix``: the
lines and their pins are written once (tox.ini), and the matrix installs exactly what ``tox -e
<env>`` would, without tox (which would install every other package unpinned).

    python tests/harness/toxenv.py lines          # celery53 celery55 celery57 rq116 rq2 rq3
    python tests/harness/toxenv.py deps rq116     # one requirement a line
"""

from __future__ import annotations

import configparser
import itertools
import re
import sys
from pathlib import Path

__all__ = ["TOX_INI", "deps", "lines"]

#: stdlib only (no import of the harness): .ci/matrix runs this with the bare python3
TOX_INI = Path(__file__).resolve().parents[2] / "tox.ini"
#: the envs of one supported line of a peer: ``celery53``, ``rq2``
_LINE = re.compile(r"(celery|rq)\d+")
_BRACES = re.compile(r"\{([^}]*)\}")


def _sections() -> dict[str, configparser.SectionProxy]:
    """Each env name tox.ini defines (``celery{53,55}`` expanded) and its section."""
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(TOX_INI)
    envs: dict[str, configparser.SectionProxy] = {}
    for section in ini.sections():
        if not section.startswith("testenv:"):
            continue
        pattern = section.removeprefix("testenv:")
        parts = _BRACES.split(pattern)  # text, choices, text, choices, ...
        choices = [part.split(",") if i % 2 else [part] for i, part in enumerate(parts)]
        for combo in itertools.product(*choices):
            envs["".join(combo)] = ini[section]
    return envs


def lines() -> list[str]:
    """The envs that pin one line of Celery or RQ, in tox.ini's order."""
    return [env for env in _sections() if _LINE.fullmatch(env)]


def deps(env: str) -> list[str]:
    """The requirements ``env`` installs: its ``deps``, a ``factor: req`` line kept only for its
    own factor.

    Raises:
        KeyError: tox.ini has no such env.
    """
    found = []
    for raw in _sections()[env].get("deps", "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        factor, sep, requirement = line.partition(":")
        if sep and re.fullmatch(r"[A-Za-z0-9_]+", factor.strip()):
            if factor.strip() != env:
                continue
            line = requirement.strip()
        found.append(line)
    return found


if __name__ == "__main__":
    what = sys.argv[1:]
    if what == ["lines"]:
        print(" ".join(lines()))
    elif len(what) == 2 and what[0] == "deps":
        print("\n".join(deps(what[1])))
    else:
        sys.exit("usage: python tests/harness/toxenv.py lines | deps ENV")
