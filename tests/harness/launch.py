"""The one launcher of the tests' subprocesses: workers, forwarders, the dashboard, servers.

Every process starts from this checkout (its root first on ``PYTHONPATH``, so a subprocess
runs the code under test), writes to a log file or a pipe the test can read when it fails,
and is stopped at teardown, resumed first if a test SIGSTOPped it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = ["ROOT", "Launcher", "Proc", "checkout_env"]

ROOT = Path(__file__).resolve().parents[2]

Proc = subprocess.Popen[bytes]


def checkout_env(base: Mapping[str, str] | None = None, *, code: Path | None = ROOT, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) plus ``extra``, with ``code`` (this
    checkout) first on ``PYTHONPATH`` and the caller's path after it (e.g. another Celery line
    under test); ``code=None`` adds nothing, for an interpreter that has its own delayq installed."""
    env = dict(os.environ if base is None else base)
    path = os.pathsep.join(p for p in (str(code or ""), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, **extra}


class Launcher:
    """Starts processes for one test (or one module) and stops every one of them at the end.

    Output goes to ``log`` (stdout and stderr together) when given; otherwise stdout is dropped
    and stderr kept in a pipe, read by :meth:`output` when a process died unexpectedly.
    """

    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.logs: list[Path] = []

    def start(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        capture: bool = False,
        cwd: Path = ROOT,
        code: Path | None = ROOT,
        group: bool = False,
    ) -> Proc:
        """Start ``args`` in ``env`` (see :func:`checkout_env`, which puts ``code`` first on the
        path). ``capture`` pipes stdout and stderr together, for a test that reads all of it
        with ``communicate``. ``group`` starts it in a process group of its own, which
        :meth:`kill_group` kills whole (a worker with its pool or work horse)."""
        env = checkout_env(env, code=code)
        stdout: int | IO[bytes]
        if log is not None:
            self.logs.append(log)
            with log.open("wb") as out:  # the child keeps its own descriptor
                proc = subprocess.Popen(
                    list(args), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=group
                )
        else:
            stdout = subprocess.PIPE if capture else subprocess.DEVNULL
            stderr = subprocess.STDOUT if capture else subprocess.PIPE
            proc = subprocess.Popen(list(args), cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=group)
        self.procs.append(proc)
        return proc

    def python(self, *args: str, **options: object) -> Proc:
        """``python ARGS…`` with this interpreter (``-m rq.cli``, ``-m celery``, ``-m http.server``)."""
        return self.start([sys.executable, *args], **options)  # type: ignore[arg-type]

    def delayq(self, *args: str, **options: object) -> Proc:
        """``delayq ARGS…`` of this checkout (``python -m delayq_backends.cli``)."""
        return self.python("-m", "delayq_backends.cli", *args, **options)

    def kill(self, proc: Proc) -> None:
        """SIGKILL ``proc`` and reap it; it is no longer this launcher's to stop."""
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc in self.procs:
            self.procs.remove(proc)

    def kill_group(self, proc: Proc) -> None:
        """SIGKILL the process group of ``proc`` (started with ``group=True``), every process in it
        at once, as a lost machine or ``kill -9 -PGID`` ends it, and reap ``proc``."""
        assert os.getpgid(proc.pid) == proc.pid, "start it with group=True: this would kill the tests' own group"
        os.killpg(proc.pid, signal.SIGKILL)
        self.kill(proc)

    def stop(self, proc: Proc, timeout: float = 10) -> int:
        """SIGTERM ``proc`` (resumed first if stopped) and wait for it; SIGKILL if it will not exit."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def stop_all(self, *, grace: float = 0) -> None:
        """Stop every process still running: SIGTERM and up to ``grace`` s each when ``grace``
        is set (a clean shutdown under test), SIGKILL otherwise."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM if grace else signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(grace or None)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    @staticmethod
    def output(proc: Proc) -> str:
        """What a piped process wrote (call once it has exited)."""
        pipe = proc.stderr or proc.stdout
        return pipe.read().decode(errors="replace") if pipe else ""

    def tail(self, chars: int = 4000) -> str:
        """The end of every log file, for a failing test's report."""
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}" for log in self.logs)
