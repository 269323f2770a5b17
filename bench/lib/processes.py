"""Subprocesses of a bench (forwarders, workers, beats): started from this checkout, each with
its output in a log file or dropped, and all stopped at the end (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from .report import BENCH_DIR

__all__ = ["ROOT", "Processes", "checkout_env"]

ROOT = BENCH_DIR.parent


def checkout_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default: this environment) plus ``extra``, with ``bench/`` and this checkout
    first on ``PYTHONPATH`` so a subprocess runs the code being measured."""
    env = dict(os.environ if base is None else base)
    path = os.pathsep.join(p for p in (str(BENCH_DIR), str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, **extra}


class Processes:
    """The bench's subprocesses; a context manager that stops them all on the way out."""

    def __init__(self, *, grace: float = 10) -> None:
        self.grace = grace
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, args: Sequence[str], *, env: Mapping[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``args``; its stdout and stderr go to ``log``, or nowhere."""
        command, full_env = list(args), checkout_env(env)
        if log is None:
            out = subprocess.DEVNULL
            proc = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=out, stderr=out)
        else:
            with log.open("wb") as fh:
                proc = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=fh, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def delayq(self, *args: str, **options: object) -> subprocess.Popen[bytes]:
        """``delayq ARGS…`` of this checkout."""
        return self.start([sys.executable, "-m", "delayq_backends.cli", *args], **options)  # type: ignore[arg-type]

    def stop(self) -> None:
        """SIGTERM every process still running, wait ``grace`` s each, SIGKILL the rest."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
