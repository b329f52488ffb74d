"""A throwaway PostgreSQL cluster for fault tests that restart or stop the server.

``initdb`` into a temporary directory, then ``pg_ctl start`` on a random free port with a
private Unix socket directory and ``listen_addresses='127.0.0.1'``. Postgres refuses to run
as root, so when the tests run as root the server runs as the ``postgres`` OS user (through
``runuser``) in directories it owns. The binaries come from ``PG_BIN`` if set, else the
newest ``/usr/lib/postgresql/<version>/bin`` that has them, else ``PATH``.

Use the ``cluster`` fixture (session-scoped; import it into the test module) and give each
test a database of its own with ``cluster.create_database()``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from awa.storage.migrations import migrate_sync


def _bin_dir() -> Path | None:
    env = os.environ.get("PG_BIN")
    if env:
        return Path(env)
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
    )
    for candidate in reversed(candidates):
        if (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    """One PostgreSQL server in a temporary directory, run as a non-root user."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="awa-cluster-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        self.sockets.mkdir()
        if self._as_postgres:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.sockets, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def _run(self, *args: str, timeout: float = 60) -> str:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}\n{self.log_tail()}"
            )
        return result.stdout

    def init(self, *, durable: bool = False) -> None:
        """initdb with the stock settings, except the port and sockets, 200 connections,
        and (unless ``durable``) no fsync: throwaway data needs no durability."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        settings = {
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sockets}'",
            "listen_addresses": "'127.0.0.1'",
            "max_connections": "200",
        }
        if not durable:
            settings |= {"fsync": "off", "full_page_writes": "off"}
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            mode,
            "-w",
            "-t",
            "60",
            "restart",
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def create_database(self) -> str:
        """A new migrated database on this cluster; returns its URL."""
        name = f"awa_fault_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = self.database_url(name)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate_sync(conn)
        return url

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL server for tests that restart it."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.fail("no PostgreSQL server binaries found: set PG_BIN to their directory")
    server = Cluster(bin_dir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()
