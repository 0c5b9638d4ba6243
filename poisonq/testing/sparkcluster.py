"""Throwaway Spark servers for tests, started from the PySpark installation's own scripts.

:class:`StandaloneCluster` runs a standalone master and workers on 127.0.0.1 (each worker
starts executors in JVMs of their own, whose tasks run in Python workers of their own), so a
test sees what a real cluster changes: nothing the driver holds in memory reaches a task
unless it is shipped with the job. :class:`ConnectServer` runs a Spark Connect server, which
a client reaches with ``SparkSession.builder.remote(server.url)``.

The pip package of PySpark has ``bin/spark-class`` but no ``start-master.sh``, so each
daemon is ``spark-class <main class>`` in a process group of its own, logging to a file in a
temporary directory; on exit every group is stopped (SIGTERM, then SIGKILL) and the
directory removed. Every wait is bounded. Ports are chosen free, so several suites can share
a machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from poisonq.testing.pgserver import free_port

START_TIMEOUT = 90.0  # seconds for a daemon to come up (JVM start on a busy machine)
STOP_TIMEOUT = 10.0


def spark_home() -> Path:
    """The PySpark installation: its ``bin/spark-class`` and ``jars`` make a Spark home."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkServers:
    """Daemons started with ``spark-class``, each in its own process group, stopped on exit."""

    daemon_memory = "256m"  # the heap of each daemon (SPARK_DAEMON_MEMORY)

    def __init__(self, python_path: Sequence[str] = ()) -> None:
        self.python_path = list(python_path)
        self.dir: Path | None = None
        self._processes: list[tuple[subprocess.Popen[bytes], Path]] = []

    def _env(self) -> dict[str, str]:
        """Executors, Connect sessions and their Python workers run this interpreter, which
        has poisonq installed, with ``python_path`` first on their path (a development
        install maps ``pyspark_poisonq`` without a path entry, and Spark finds data sources
        by scanning the path); daemons keep small heaps and their files in :attr:`dir`."""
        assert self.dir is not None
        path = [*self.python_path, os.environ.get("PYTHONPATH", "")]
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
            "SPARK_HOME": str(spark_home()),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_LOCAL_DIRS": str(self.dir / "local"),
            "SPARK_LOG_DIR": str(self.dir),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def _launch(self, name: str, script: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        """Run ``bin/<script> args`` (``spark-class``, ``spark-submit``) as daemon ``name``."""
        assert self.dir is not None
        log = self.dir / f"{name}.log"
        command = [str(spark_home() / "bin" / script), *args]
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                cwd=self.dir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append((process, log))
        return process

    def _wait(
        self, what: str, ready: Sequence[subprocess.Popen[bytes]], check: Callable[[], bool]
    ) -> None:
        """Poll ``check()`` until it holds; a daemon that exits, or :data:`START_TIMEOUT`,
        is an error that shows the end of every log."""
        deadline = time.monotonic() + START_TIMEOUT
        while not check():
            dead = [p for p in ready if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = self.logs()
                self.stop()
                raise RuntimeError(f"{what} did not come up:\n{logs}")
            time.sleep(0.25)

    def logs(self, tail: int = 3000) -> str:
        """The end of each daemon's log, for a failure message."""
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}"
            for _, log in self._processes
            if log.exists()
        )

    def stop(self) -> None:
        """Stop every daemon's process group (executors and Python workers with it)."""
        for process, _ in self._processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for process, _ in self._processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT)
        self._processes.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _make_dir(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        (self.dir / "local").mkdir()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


class StandaloneCluster(SparkServers):
    """A standalone master and ``workers`` workers of ``cores`` cores and ``memory`` each.

    Use as ``with StandaloneCluster().start() as cluster:`` and give :attr:`master_url` to
    ``SparkSession.builder.master`` (or ``spark-submit --master``); :attr:`executor_conf`
    sizes executors to fit the workers, one per worker."""

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        python_path: Sequence[str] = (),
    ) -> None:
        super().__init__(python_path)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = 0
        self.webui_port = 0

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def executor_conf(self) -> dict[str, str]:
        return {
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": "512m",
            "spark.cores.max": str(self.cores * self.workers),
        }

    def start(self) -> Self:
        self._make_dir("poisonq-spark-")
        assert self.dir is not None
        self.port, self.webui_port = free_port(), free_port()
        master_args = ["--host", "127.0.0.1", "--port", str(self.port)]
        master_args += ["--webui-port", str(self.webui_port)]
        master = self._launch(
            "master", "spark-class", ["org.apache.spark.deploy.master.Master", *master_args]
        )
        self._wait("the Spark master", [master], lambda: self._alive_workers() is not None)
        started = [master]
        for n in range(self.workers):
            worker_args = [self.master_url, "--host", "127.0.0.1", "--cores", str(self.cores)]
            worker_args += ["--memory", self.memory, "--work-dir", str(self.dir / f"worker-{n}")]
            worker_args += ["--webui-port", str(free_port())]
            worker = ["org.apache.spark.deploy.worker.Worker", *worker_args]
            started.append(self._launch(f"worker-{n}", "spark-class", worker))
        self._wait(
            f"{self.workers} Spark workers",
            started,
            lambda: (self._alive_workers() or 0) >= self.workers,
        )
        return self

    def executor_dirs(self) -> list[Path]:
        """The working directory of each executor the workers started (one per application
        and worker): where an application's tasks ran."""
        return sorted(self.dir.glob("worker-*/app-*/*")) if self.dir else []

    def _alive_workers(self) -> int | None:
        """How many workers the master has registered (its web UI's JSON); None while the
        master does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.webui_port}/json/", timeout=2
            ) as answer:
                state: Mapping[str, object] = json.load(answer)
        except (OSError, ValueError):
            return None
        alive = state.get("aliveworkers", 0)
        return alive if isinstance(alive, int) else 0


class ConnectServer(SparkServers):
    """A Spark Connect server on 127.0.0.1, its own driver on ``master`` (``local[1]``:
    executors in the server's JVM; Python workers, data sources and ``foreachBatch``
    functions in this interpreter, which finds the ``pyspark_poisonq`` data source)."""

    daemon_memory = "1g"  # Spark's launcher sizes a Connect server's driver by this

    def __init__(self, master: str = "local[1]", python_path: Sequence[str] = ()) -> None:
        super().__init__(python_path)
        self.master = master
        self.port = 0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._make_dir("poisonq-connect-")
        self.port = free_port()
        conf = {
            "spark.master": self.master,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        }
        # What sbin/start-connect-server.sh runs, in the foreground.
        args = ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
        args += [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
        server = self._launch("connect", "spark-submit", args)
        self._wait("the Spark Connect server", [server], self._listening)
        return self

    def _listening(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(1)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0
