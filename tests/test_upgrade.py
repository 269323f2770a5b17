"""A rolling upgrade: the previous release (installed from git in a venv of its own) runs beside
this one, real ``delayq forward`` processes of each, producers of each, one store and a Redis
list target. In each mixed state every item arrives once: none lost, none dead-lettered.

The previous release is the tag before this version's (releases are tagged ``vX.Y.Z`` on main,
CHANGELOG.md): :data:`PREVIOUS_TAG`, at commit :data:`PREVIOUS` for a clone that has no tags; its
package goes straight from ``git archive`` into the venv's site-packages, and the venv sees
this interpreter's packages for its dependencies (the two releases need the same ones), so the
install takes well under a second and no network.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from delayq_backends import DelayStore, Envelope, __version__
from delayq_backends.celery import StoredMessage
from tests.harness import ROOT, Launcher, Proc, make_store
from tests.helpers import wait_for
from tests.test_envelope import CELERY_V1, LIST_V1, RQ_V1

#: The previous release: the tag before this version's in CHANGELOG.md, and the commit it
#: tags (what the test installs when a clone has no tags; with the tag, they must agree).
PREVIOUS_TAG = "v0.3.0"
PREVIOUS = "a73b83b"
CHANGELOG = ROOT / "CHANGELOG.md"
#: A release's heading in CHANGELOG.md: ``## [0.3.0] - 2026-11-27`` (or ``- Unreleased``).
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - ", re.M)
SHARDS = 4
#: Items each producer writes per scenario, due over the first :data:`SPREAD_S` seconds.
ITEMS = 1500
SPREAD_S = 3.0

#: A producer: ``schedule_many`` of list items whose body is the id, due over ``spread`` seconds;
#: run by either release's interpreter.
PRODUCER = """
import sys, time
from delayq_backends import DelayStore, Envelope, __version__
from delayq_backends.celery import StoredMessage
from delayq_backends.targets import RedisListTarget
url, prefix, shards, tag, count, spread, out = sys.argv[1:]
store = DelayStore.from_url(url, prefix=prefix, shards=int(shards))
start = time.time()
store.schedule_many(
    (f"{tag}{i}", start + float(spread) * (i % 30) / 30, RedisListTarget.envelope(out, f"{tag}{i}".encode()))
    for i in range(int(count))
)
"""


@dataclass(frozen=True)
class Release:
    """A venv with the previous release installed: its interpreter, and where it runs (not this
    checkout, whose package would shadow the installed one on ``sys.path``)."""

    python: Path
    home: Path

    def start(self, launcher: Launcher, *args: str, log: Path | None = None, capture: bool = False) -> Proc:
        return launcher.start([str(self.python), *args], cwd=self.home, code=None, log=log, capture=capture)


def test_the_version_the_changelog_and_the_previous_release_agree() -> None:
    """``__version__`` (what ``delayq --version`` prints) is the newest release in CHANGELOG.md,
    and :data:`PREVIOUS_TAG` the one before it: bumping the version without naming its previous
    release here (or the reverse) fails."""
    releases = RELEASE.findall(CHANGELOG.read_text(encoding="utf-8"))
    assert releases[:2] == [__version__, PREVIOUS_TAG.removeprefix("v")], releases
    printed = subprocess.run(
        [sys.executable, "-m", "delayq_backends.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert printed.stdout.strip() == f"delayq, version {__version__}"


def previous_commit() -> str:
    """What to install: :data:`PREVIOUS_TAG` where the clone has it (checked to be
    :data:`PREVIOUS`), else :data:`PREVIOUS`."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "-q", "--verify", f"{PREVIOUS_TAG}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        return PREVIOUS
    assert found.stdout.startswith(PREVIOUS), f"{PREVIOUS_TAG} is {found.stdout.strip()}, not {PREVIOUS}: fix PREVIOUS"
    return PREVIOUS_TAG


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    if not (ROOT / ".git").exists():
        pytest.skip("needs this project's git checkout (the previous release comes from its history)")
    home = tmp_path_factory.mktemp("previous-release")
    archive = home / "previous.tar"
    ref = previous_commit()
    made = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "delayq_backends"])
    if made.returncode != 0:
        pytest.fail(f"git archive {ref} failed: a shallow clone? `git fetch --unshallow` and run again")
    venv.create(home / "venv", with_pip=False)
    python = home / "venv" / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([python, "-c", where], text=True).strip())
    subprocess.run(["tar", "-xf", str(archive), "-C", str(site)], check=True)
    # its dependencies are this interpreter's: the two releases need the same ones
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    where = subprocess.check_output(
        [python, "-c", "import delayq_backends; print(delayq_backends.__file__)"], cwd=home, text=True
    )
    assert where.startswith(str(site)), f"the venv imports {where}, not the previous release"
    return Release(python, home)


@pytest.fixture
def store(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    s = make_store(valkey_url, prefix, shards=SHARDS)
    yield s
    s.client.close()


#: Which release runs a process: the previous one, or None for this checkout.
Which = Release | None


def run(which: Which, launcher: Launcher, *args: str, log: Path | None = None, capture: bool = False) -> Proc:
    """``python ARGS…`` of the previous release or of this checkout."""
    if which is None:
        return launcher.python(*args, log=log, capture=capture)
    return which.start(launcher, *args, log=log, capture=capture)


def forward(which: Which, launcher: Launcher, store: DelayStore, log: Path) -> Proc:
    url, prefix = store.config.url, store.config.prefix
    args = ["forward", "--url", url, "--prefix", prefix, "--shards", str(SHARDS), "--log-level", "info"]
    return run(which, launcher, "-m", "delayq_backends.cli", *args, log=log)


def produce(which: Which, launcher: Launcher, store: DelayStore, tag: str, out: str) -> set[bytes]:
    """Schedule :data:`ITEMS` items with :data:`PRODUCER`; the bodies to expect in ``out``."""
    args = [store.config.url, store.config.prefix, str(SHARDS), tag, str(ITEMS), str(SPREAD_S), out]
    proc = run(which, launcher, "-c", PRODUCER, *args)
    assert proc.wait(60) == 0, launcher.output(proc)
    return {f"{tag}{i}".encode() for i in range(ITEMS)}


#: Prints what a release reads in each envelope given (hex); for a Celery message also the
#: arguments its target publishes with and the bytes the release writes for it: the tables that
#: compact a message are part of the format, so two releases writing format 2 write it alike.
READER = """
import json, sys
from datetime import datetime, timezone
from delayq_backends import Envelope
from delayq_backends.celery import StoredMessage
read = []
for data in sys.argv[1:]:
    env = Envelope.decode(bytes.fromhex(data))
    shown = {"kind": env.target, "to": env.destination, "meta": env.meta, "details": env.details.hex()}
    shown["body"] = env.body.hex()
    if env.target == "celery":
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        message = StoredMessage.from_envelope(env)
        shown["publish"] = repr(sorted(message.publish_kwargs(ready_ms=1, now=now).items()))
        shown["written"] = message.to_envelope().encode().hex()
    read.append(shown)
print(json.dumps(read, sort_keys=True))
"""


def forwarded(log: Path) -> int:
    """The count in a stopped forwarder's last summary line."""
    counts = re.findall(r"forwarded (\d+),", log.read_text(errors="replace"))
    assert counts, log.read_text(errors="replace")[-2000:]
    return int(counts[-1])


def run_mixed(
    procs: Launcher, store: DelayStore, tmp_path: Path, *, forwarders: dict[str, Which], producers: dict[str, Which]
) -> dict[str, int]:
    """Start the ``forwarders`` (by name), schedule with each of ``producers`` (by tag), check
    every item arrives once and none is a dead letter; returns what each forwarder forwarded."""
    out = f"{store.config.prefix}:out"
    logs = {name: tmp_path / f"{name}.log" for name in forwarders}
    started = {name: forward(which, procs, store, logs[name]) for name, which in forwarders.items()}

    def up() -> bool:  # every forwarder claims from the first item on
        return all(" started: " in log.read_text(errors="replace") for log in logs.values())

    wait_for(up, 30, lambda: f"every forwarder started\n{procs.tail()}", interval=0.05)
    expected: set[bytes] = set()
    for tag, which in producers.items():
        expected |= produce(which, procs, store, tag, out)

    def settled() -> bool:  # every item forwarded, or a dead letter (then fail at once)
        stats = store.stats()
        return sum(s.scheduled for s in stats) == 0 or any(s.dead for s in stats)

    wait_for(settled, 60, lambda: f"{len(expected)} items forwarded\n{procs.tail()}", interval=0.05)
    for name, proc in started.items():
        assert procs.stop(proc) == 0, f"{name} exits cleanly\n{procs.tail()}"
    assert store.dead_letters() == [], procs.tail()
    delivered = store.client.lrange(out, 0, -1)
    assert sorted(delivered) == sorted(expected), "every item once: none lost, none twice"
    return {name: forwarded(log) for name, log in logs.items()}


def test_previous_forwarder_delivers_this_releases_items(
    procs: Launcher, store: DelayStore, tmp_path: Path, previous: Release
) -> None:
    """Producers upgraded first: the previous release's forwarder reads what they write."""
    counts = run_mixed(procs, store, tmp_path, forwarders={"previous": previous}, producers={"n": None})
    assert counts == {"previous": ITEMS}


def test_this_forwarder_delivers_the_previous_releases_items(
    procs: Launcher, store: DelayStore, tmp_path: Path, previous: Release
) -> None:
    """Forwarders upgraded first: this release's forwarder reads what the previous producers write."""
    counts = run_mixed(procs, store, tmp_path, forwarders={"this": None}, producers={"o": previous})
    assert counts == {"this": ITEMS}


def test_both_releases_forward_side_by_side(
    procs: Launcher, store: DelayStore, tmp_path: Path, previous: Release
) -> None:
    """Mid-upgrade: forwarders and producers of both releases on one store share the items."""
    both = {"previous": previous, "this": None}
    counts = run_mixed(procs, store, tmp_path, forwarders=both, producers={"o": previous, "n": None})
    assert sum(counts.values()) == 2 * ITEMS
    assert all(counts.values()), f"both forwarders took part: {counts}"


def test_the_previous_release_reads_this_releases_envelopes_as_this_one_does(
    procs: Launcher, previous: Release
) -> None:
    """What this release writes for a Celery message, an RQ job and a list item reads the same in
    the previous release, down to the Celery publish: a changed table would republish wrongly."""
    celery = StoredMessage.from_envelope(Envelope.decode(CELERY_V1)).to_envelope()
    written = [celery, Envelope.decode(RQ_V1), Envelope.decode(LIST_V1)]
    encoded = [e.encode() for e in written]
    assert {e[:3] for e in encoded} == {b"DQ\x02"}, "this release writes format 2"
    reads = []
    for which in (previous, None):
        proc = run(which, procs, "-c", READER, *(e.hex() for e in encoded), capture=True)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out.decode(errors="replace")
        reads.append(out.decode())
    assert reads[0] == reads[1]
