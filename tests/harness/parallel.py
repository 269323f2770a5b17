"""The suite on several xdist workers (``-n`` and ``--dist loadgroup`` in pyproject.toml's addopts):
most tests only wait (on a worker, a forwarder, a due time), so they share the cores.

- Each worker has servers of its own: the system Redis's database moved up by the worker's
  number (:func:`worker_url`), its own embedded Valkey and cluster (session fixtures, on free
  ports), its own temp dirs (xdist gives each a basetemp) and RabbitMQ queues (uuid-named).
- Tests that share a costly fixture run on one worker, so it starts once: a module's tests that
  use a module- or class-scoped fixture (a running Celery worker) form one ``xdist_group``, and so
  do the tests of each fixture in :data:`ONCE_PER_RUN` (a JVM).
- Tests marked ``alone`` (CPU-hungry or timing-sensitive: lateness bounds, SIGKILL and SIGSTOP
  proofs, throughput) run with no neighbour: the other workers finish their current test and wait
  (:func:`room`). They are collected last, so they mostly follow each other at the run's end.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import pytest

__all__ = ["ONCE_PER_RUN", "room", "worker_index", "worker_url"]

#: session fixtures started once per run, not once per worker: their tests share a worker
ONCE_PER_RUN = ("spark", "spark_standalone")


def worker_index() -> int:
    """This xdist worker's number (``gw2`` -> 2); 0 in a run without workers."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def worker_url(url: str, index: int) -> str:
    """``url`` with its database number moved up by ``index`` (``/8`` -> ``/10`` for worker 2), so
    each worker writes to a database of its own. Every worker derives it from the same environment,
    so a subprocess that imports the harness again gets the same database, not the next one."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{int(parts.path.strip('/') or 0) + index}"))


@contextmanager
def room(folder: Path, *, alone: bool) -> Iterator[None]:
    """Hold the run's room while a test runs: shared by every other test, whole for an ``alone``
    one. A waiting ``alone`` test holds the gate, so no new test enters before it (without the
    gate, workers taking turns in the shared room could keep it from ever being empty)."""
    whole = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
    with _locked(folder / "gate", fcntl.LOCK_EX) as gate, _locked(folder / "room", whole):
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@contextmanager
def _locked(path: Path, how: int) -> Iterator[IO[str]]:
    with path.open("a") as lock:
        fcntl.flock(lock, how)
        yield lock  # closing the file releases the lock


def _group(item: pytest.Item) -> str | None:
    """The worker group of ``item``: a fixture of :data:`ONCE_PER_RUN`, else its module when it uses
    a module- or class-scoped fixture, else none (any worker)."""
    definitions = [d for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]  # type: ignore[attr-defined]
    for name in ONCE_PER_RUN:
        if name in item.fixturenames:
            return name
    if any(d.scope in ("module", "class", "package") for d in definitions):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(wrapper=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    """Give each item its group: the ``@group`` suffix of its node id is what the loadgroup
    scheduler reads (set here: xdist 3.8's own hook sets it where pytest 9 no longer reads it)."""
    if config.getoption("loadgroup", False):  # set on each xdist worker by --dist loadgroup
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            group = mark.args[0] if mark else _group(item)
            if group and "@" not in item.nodeid:
                # pytest 9 reads the node id from the structured _id (xdist 3.8 still sets _nodeid)
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
        items.sort(key=lambda item: item.get_closest_marker("alone") is not None)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Setup, call and teardown of ``item`` inside the run's room (on an xdist worker only)."""
    if not hasattr(item.config, "workerinput"):
        return (yield)
    folder = Path(item.config.option.basetemp).parent  # xdist: <run's basetemp>/popen-gwN
    with room(folder, alone=item.get_closest_marker("alone") is not None):
        return (yield)
