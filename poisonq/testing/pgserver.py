"""A throwaway PostgreSQL server for tests and benchmarks, started from the machine's binaries.

:class:`TemporaryServer` runs ``initdb`` on a fresh directory, starts ``postgres`` on
127.0.0.1 on a free port (its unix socket inside the same directory, so it never meets the
machine's own server), and on exit stops it and removes the directory. PostgreSQL refuses to
run as root, so a root process runs the server binaries as the ``postgres`` user (``runuser``);
anyone else runs them directly. ``scripts/ensure-postgres`` installs the binaries when a
machine has none.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from poisonq.errors import StoreError

SERVER_USER = "postgres"
_START_ATTEMPTS = 3  # a free port can be taken between choosing it and binding it


def find_binaries() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: on ``PATH``, else the newest
    ``/usr/lib/postgresql/*/bin`` (where Debian puts them)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
    )
    for directory in reversed(candidates):
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise StoreError(
        "PostgreSQL binaries (initdb, pg_ctl) not found; run scripts/ensure-postgres"
        " (or apt-get install postgresql)"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TemporaryServer:
    """A PostgreSQL server in a temporary directory, for as long as the ``with`` block.

    ``settings`` are extra ``postgres -c`` settings (``{"fsync": "off"}`` for a test suite
    that does not measure durability). :attr:`url` names the ``postgres`` database;
    :meth:`create_database` makes others.
    """

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = {"max_connections": "200", **(settings or {})}
        self.port = 0
        self.dir: Path | None = None
        self._options = ""
        self._bin = find_binaries()
        self._as_server_user = os.geteuid() == 0

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{name}"

    def _run(self, *args: str) -> None:
        command: Sequence[str] = [str(self._bin / args[0]), *args[1:]]
        if self._as_server_user:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.dir / "server.log" if self.dir else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise StoreError(f"{' '.join(args[:2])} failed: {done.stderr.strip()}\n{tail}")

    def start(self) -> TemporaryServer:
        self.dir = Path(tempfile.mkdtemp(prefix="poisonq-pg-"))
        if self._as_server_user:
            shutil.chown(self.dir, SERVER_USER, SERVER_USER)
        data = self.dir / "data"
        self._run("initdb", "-D", str(data), "-U", SERVER_USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--locale=C")  # fmt: skip
        options = " ".join(f"-c {key}={value}" for key, value in self.settings.items())
        for attempt in range(_START_ATTEMPTS):
            self.port = free_port()
            try:
                self._start(f"-h 127.0.0.1 -p {self.port} -k {self.dir} {options}")
                return self
            except StoreError:
                if attempt == _START_ATTEMPTS - 1:
                    self.stop()
                    raise
        raise AssertionError("unreachable")

    def restart(self, down_for: float = 0.0) -> None:
        """Stop the server at once (``-m immediate``: as a crash, every connection cut),
        stay down ``down_for`` seconds, and start it again on the same port."""
        assert self.dir is not None, "the server is not running"
        data = self.dir / "data"
        self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        time.sleep(down_for)
        self._start(self._options)

    def _start(self, options: str) -> None:
        assert self.dir is not None
        self._options = options
        data, log = str(self.dir / "data"), str(self.dir / "server.log")
        self._run("pg_ctl", "-D", data, "-l", log, "-w", "-o", options, "start")

    def stop(self) -> None:
        """Stop the server (at once: it holds nothing worth keeping) and remove its files."""
        if self.dir is None:
            return
        data = self.dir / "data"
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(StoreError):
                self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one statement outside a transaction (``CREATE DATABASE`` needs that)."""
        import psycopg

        with psycopg.connect(self.database_url(database), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create a database (a copy of ``template`` if given) and return its URL."""
        sql = f'CREATE DATABASE "{name}"'
        if template:
            sql += f' TEMPLATE "{template}"'
        self.execute(sql)
        return self.database_url(name)

    def __enter__(self) -> TemporaryServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
