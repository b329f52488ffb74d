"""The embedded server: `awa db status` and `awa db stop`, starting it on a throwaway data
directory, and, as root, starting it without changing the permissions of any existing
directory (the home directory's chain above all)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

import awa.storage.embedded
from awa.cli import main
from awa.storage.embedded import DATA_DIR_ENV, SERVER_USER, embedded_database_url, embedded_status
from helpers_embedded import env_without_database, throwaway_data_dir

AWA = Path(sys.executable).with_name("awa")


@pytest.fixture
def running_as_root() -> None:
    """These tests check what awa does as root (the server runs as another user): run the
    suite as root, as CI does; elsewhere they fail rather than check nothing."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.fail("this test checks what awa does as root: run the suite as root (CI does)")


as_root = pytest.mark.usefixtures("running_as_root")


def cli(*args: str, env: dict[str, str | None]) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def awa_process(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**env_without_database(), DATA_DIR_ENV: str(data_dir)}
    return subprocess.run(
        [str(AWA), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def modes(paths: list[Path]) -> dict[Path, tuple[int, int, int]]:
    """Mode bits and ownership of each path."""
    found = {}
    for path in paths:
        st = path.stat()
        found[path] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return found


def chain(path: Path) -> list[Path]:
    """The path and every directory above it."""
    return [path, *path.parents]


NO_DATABASE: dict[str, str | None] = {"DATABASE_URL": None, "PGHOST": None, "PGPORT": None}
NO_DATABASE |= {"PGDATABASE": None, "PGUSER": None, "PGHOSTADDR": None, "PGSERVICE": None}


# status and stop without a server ----------------------------------------------------------


def test_status_of_a_server_never_created_starts_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "never" / "postgres"
    env = {**NO_DATABASE, DATA_DIR_ENV: str(data_dir)}
    text = cli("db", "status", env=env)
    assert text.exit_code == 0, text.output
    assert text.stdout == (
        "embedded server  not created yet (awa creates and starts it when it needs it)\n"
        f"data directory   {data_dir}\n"
    )
    answer = json.loads(cli("db", "status", "--json", env=env).stdout)
    assert answer == {
        "embedded": {
            "data_dir": str(data_dir),
            "initialized": False,
            "running": False,
            "pid": None,
            "url": None,
            "version": None,
            "owner": None,
        },
        "in_use": True,
        "configured_by": None,
        "database_url": None,
    }
    assert not data_dir.parent.exists()


def test_status_says_when_awa_uses_another_server(tmp_path: Path) -> None:
    env = {**NO_DATABASE, DATA_DIR_ENV: str(tmp_path / "pg")}
    url = "postgresql://app:s3cret@db.example/app"
    from_env = cli("db", "status", env={**env, "DATABASE_URL": url}).stdout
    assert from_env.endswith(
        "note: DATABASE_URL is set (postgresql://app:***@db.example/app): awa uses that "
        "server, not the embedded one\n"
    )
    answer = json.loads(cli("--database-url", url, "db", "status", "--json", env=env).stdout)
    assert answer["in_use"] is False
    assert answer["configured_by"] == "--database-url"
    assert answer["database_url"] == "postgresql://app:***@db.example/app"
    pg_vars = cli("db", "status", env={**env, "PGHOST": "db.example"}).stdout
    assert pg_vars.endswith(
        "note: PG* variables are set (PGHOST=db.example): awa uses that server, not the "
        "embedded one\n"
    )


def test_stop_when_nothing_runs(tmp_path: Path) -> None:
    env = {**NO_DATABASE, DATA_DIR_ENV: str(tmp_path / "pg")}
    result = cli("db", "stop", env=env)
    assert result.exit_code == 0
    assert result.stdout == (
        f"the embedded server is not running (data directory {tmp_path / 'pg'})\n"
    )
    answer = json.loads(cli("db", "stop", "--json", env=env).stdout)
    assert answer == {"stopped": False, "pid": None, "data_dir": str(tmp_path / "pg")}


# a real server -----------------------------------------------------------------------------


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with throwaway_data_dir() as path:
        yield path


@pytest.mark.slow
def test_start_status_stop_and_start_again(data_dir: Path) -> None:
    first = awa_process("db", "url", "--show-password", data_dir=data_dir)
    assert first.returncode == 0, first.stderr
    url = first.stdout.strip()
    assert f"using the embedded PostgreSQL server in {data_dir}" in first.stderr
    assert f"created a new PostgreSQL 18 database cluster in {data_dir}" in first.stderr
    started = re.search(r"started the embedded server \(pid (\d+)\)", first.stderr)
    assert started, first.stderr
    pid = int(started.group(1))
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None
        assert row[0] >= 180000
        # A Unix socket only: no TCP port to collide with another server.
        listen = conn.execute("SELECT current_setting('listen_addresses')").fetchone()
        assert listen == ("",)

    status = awa_process("db", "status", "--json", data_dir=data_dir)
    embedded = json.loads(status.stdout)["embedded"]
    assert embedded["running"] is True
    assert embedded["pid"] == pid
    assert embedded["url"] == url
    assert embedded["data_dir"] == str(data_dir)
    text = awa_process("db", "status", data_dir=data_dir).stdout
    assert f"embedded server  running (pid {pid})\n" in text
    assert f"url              {url}\n" in text

    stopped = awa_process("db", "stop", data_dir=data_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert (
        stopped.stdout == f"stopped the embedded server (pid {pid}); its data stays in {data_dir}\n"
    )
    assert not alive(pid)
    assert not (data_dir / "postmaster.pid").exists()  # a clean shutdown
    after = json.loads(awa_process("db", "status", "--json", data_dir=data_dir).stdout)
    assert after["embedded"]["running"] is False
    assert after["embedded"]["initialized"] is True

    again = awa_process("db", "url", data_dir=data_dir)
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stderr  # the same cluster, started again
    restarted = re.search(r"started the embedded server \(pid (\d+)\)", again.stderr)
    assert restarted, again.stderr
    reused = awa_process("db", "url", data_dir=data_dir)
    assert "started" not in reused.stderr  # running: reused as it is
    assert reused.stdout == again.stdout


# as root -----------------------------------------------------------------------------------


@as_root
@pytest.mark.slow
def test_as_root_no_existing_directory_changes(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default data directory for root (here moved to the throwaway directory) and a
    private home: afterwards every existing directory has the mode and owner it had; the
    directories awa created belong to the server user, who runs the server."""
    home = tmp_path / "home" / "ops"
    home.mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(awa.storage.embedded, "ROOT_DATA_DIR", data_dir)
    watched = chain(home) + chain(Path.home()) + chain(data_dir.parent.parent)
    watched += chain(awa.storage.embedded._package_install() / "bin")
    watched = sorted(set(watched))
    before = modes(watched)

    embedded_database_url.cache_clear()
    try:
        url = embedded_database_url()
    finally:
        embedded_database_url.cache_clear()
    with psycopg.connect(url, connect_timeout=10) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)

    assert modes(watched) == before
    assert list(home.iterdir()) == []  # nothing written in the home directory
    server = embedded_status(data_dir)
    assert server.running
    assert server.pid is not None
    assert server.owner == SERVER_USER
    assert Path(f"/proc/{server.pid}").stat().st_uid == data_dir.stat().st_uid != 0
    for created in (data_dir.parent, data_dir):
        st = created.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, data_dir.stat().st_uid)
    err = capsys.readouterr().err
    assert f"created {data_dir.parent} (owner {SERVER_USER}, mode 0700)" in err
    assert f"created {data_dir} (owner {SERVER_USER}, mode 0700)" in err


@as_root
def test_as_root_refuses_a_data_dir_the_server_user_cannot_reach(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    before = modes(chain(closed))
    result = cli("db", "url", env={**NO_DATABASE, DATA_DIR_ENV: str(closed / "pg")})
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[-1].startswith(
        f"error: the embedded server runs as {SERVER_USER} (PostgreSQL refuses root), and "
        f"{SERVER_USER} cannot reach {closed / 'pg'}: "
    )
    assert "which awa does not do" in lines[-1]
    assert modes(chain(closed)) == before
    assert not (closed / "pg").exists()


@as_root
@pytest.mark.slow
def test_as_root_copies_binaries_the_server_user_cannot_reach(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PostgreSQL installed under a private directory (a virtual environment in root's home,
    say): the server runs from a copy owned by the server user, and the private directory
    keeps its mode."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    installed = awa.storage.embedded._package_install()
    site = installed.parent.parent
    for part in awa.storage.embedded._install_parts(installed):
        shutil.copytree(part, private / part.relative_to(site), symlinks=True)
    install = private / installed.relative_to(site)
    monkeypatch.setattr(awa.storage.embedded, "_package_install", lambda: install)
    monkeypatch.setenv(DATA_DIR_ENV, str(data_dir))
    before = modes(chain(private))

    embedded_database_url.cache_clear()
    try:
        url = embedded_database_url()
    finally:
        embedded_database_url.cache_clear()
    with psycopg.connect(url, connect_timeout=10):
        pass

    assert modes(chain(private)) == before
    copy = data_dir.parent / f"pginstall-{awa.storage.embedded._package_version()}"
    server = embedded_status(data_dir)
    assert server.pid is not None
    program = copy / installed.relative_to(site) / "bin" / "postgres"
    assert Path(f"/proc/{server.pid}/exe").resolve() == program
    assert copy.stat().st_uid == data_dir.stat().st_uid
    assert f"copied the PostgreSQL binaries to {copy} (owner {SERVER_USER})" in (
        capsys.readouterr().err
    )
