"""A Spark standalone cluster on loopback: one master and two workers started from the installed
pyspark (``spark-class``), each its own JVM, so a ``spark://`` driver gets executors in their own
JVMs as on a real cluster. Ports are free ones; logs and work directories live in a temporary
directory; stopping kills each daemon's process group (the workers' executors with them) and
removes that directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from delayq_backends.embedded import free_port

__all__ = ["SparkStandalone"]

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


class SparkStandalone:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, on 127.0.0.1."""

    def __init__(self, *, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="delayq-spark-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.dir / "local"),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_NO_DAEMONIZE": "1",
        }

    def _launch(self, name: str, *args: str) -> None:
        # the pip-installed pyspark is a full Spark home (bin/spark-class, jars/), unless SPARK_HOME says another
        home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
        spark_class = home / "bin" / "spark-class"
        log = (self.dir / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                [str(spark_class), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,  # its own group: stop() kills the executors it spawned too
            )
        )
        log.close()

    def start(self, timeout: float = 90.0) -> SparkStandalone:
        self._launch(
            "master", MASTER, "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)
        )
        for i in range(self.workers):
            work = self.dir / f"worker{i}"
            work.mkdir()
            self._launch(
                f"worker{i}",
                WORKER,
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.url,
            )
        self._wait_alive(timeout)
        return self

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status page, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as response:
                return json.loads(response.read())  # type: ignore[no-any-return]
        except OSError:
            return None

    def _wait_alive(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if state is not None and state.get("aliveworkers") == self.workers:
                return
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = self.logs()
                self.stop()
                raise RuntimeError(
                    f"the Spark standalone cluster did not come up with {self.workers} workers "
                    f"(exited: {dead}; master says {state}):\n{logs}"
                )
            time.sleep(0.5)

    def logs(self, lines: int = 15) -> str:
        """The last lines of each daemon's log, to explain a failure."""
        out = []
        for log in sorted(self.dir.glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
