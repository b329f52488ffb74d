"""``awa worker``: split fleets from one task module, settings from flags, AWA_* variables and
a TOML file, JSON log lines, and bad input as one clear error line.

Workers are real ``awa worker`` processes started in a directory holding a task module of the
test's own, as a user would run them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import awa
from helpers_worker import wait_for
from jobs_helpers import Conn, must_job_row

AWA = Path(sys.executable).with_name("awa")

TASKS = """
import asyncio
import dataclasses
import os

import awa

client = awa.AsyncClient()


@dataclasses.dataclass
class SendEmail:
    to: str


@dataclasses.dataclass
class Charge:
    cents: int


@dataclasses.dataclass
class Report:
    n: int


@dataclasses.dataclass
class Flaky:
    n: int


@client.task(SendEmail, queue="email")
async def send_email(job: awa.Job[SendEmail]) -> None:
    job.record_output({"pid": os.getpid()})


@client.task(Charge, queue="billing")
async def charge(job: awa.Job[Charge]) -> None:
    job.record_output({"pid": os.getpid()})


@client.task(Report, queue="reports")
async def report(job: awa.Job[Report]) -> None:
    job.record_output({"pid": os.getpid()})


@dataclasses.dataclass
class Hang:
    n: int


@client.task(Hang, queue="hang")
async def hang(job: awa.Job[Hang]) -> None:
    await asyncio.Event().wait()  # never returns on its own; ignores is_cancelled()


@client.task(Flaky, queue="flaky")
async def flaky(job: awa.Job[Flaky]) -> None:
    deadline = round((job.deadline - job.attempted_at).total_seconds()) if job.deadline else 0
    raise ValueError(f"flaky {job.args.n} failed (deadline {deadline}s)")
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str) -> types.ModuleType:
    """A task module ``<package>.jobs`` in ``tmp_path`` (a unique package name, so that each
    test imports its own), imported here too for inserting through its client."""
    package = f"shop_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "jobs.py").write_text(TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", database_url)
    return importlib.import_module(f"{package}.jobs")


def target(app: types.ModuleType) -> str:
    return f"{app.__name__}:client"


class Worker:
    """An ``awa worker`` process; its stderr goes to a file read by ``log()``."""

    def __init__(self, cwd: Path, database_url: str, *args: str, env: dict[str, str]) -> None:
        self.log_path = cwd / f"worker-{uuid.uuid4().hex[:6]}.log"
        self._log_file = self.log_path.open("w")
        self.process = subprocess.Popen(
            [str(AWA), "worker", *args],
            cwd=cwd,
            env={**os.environ, "DATABASE_URL": database_url, **env},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log_file.close()
        return code


@contextlib.contextmanager
def workers(
    cwd: Path, database_url: str, *commands: list[str], env: dict[str, str] | None = None
) -> Iterator[list[Worker]]:
    running = [Worker(cwd, database_url, *args, env=env or {}) for args in commands]
    try:
        yield running
    finally:
        for worker in running:
            worker.stop()


async def wait_started(worker: Worker) -> None:
    await wait_for(
        lambda: "worker started" in worker.log() or worker.process.poll() is not None,
        20,
        message=lambda: f"the worker did not start: {worker.log()}",
    )
    assert worker.process.poll() is None, worker.log()


def completed_by(conn: Conn, job_id: int) -> int | None:
    row = conn.execute(
        "SELECT output->>'pid' FROM awa.jobs WHERE id = %s AND state = 'completed'", (job_id,)
    ).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


# split fleets ------------------------------------------------------------------------------


async def test_two_processes_share_one_task_module_each_on_its_own_queues(
    app: types.ModuleType, tmp_path: Path, database_url: str, conn: Conn
) -> None:
    """The production shape: one task module, one process per queue. Inserts go to each
    kind's task queue; each process runs only its queue; a queue nobody runs keeps its jobs."""
    client: awa.AsyncClient = app.client
    emails = [await client.insert(app.SendEmail(f"u{n}@example.com")) for n in range(5)]
    charges = [await client.insert(app.Charge(n)) for n in range(5)]
    report = await client.insert(app.Report(1))
    assert {job.queue for job in emails} == {"email"}
    assert {job.queue for job in charges} == {"billing"}
    with workers(
        tmp_path,
        database_url,
        [target(app), "--queue", "email=2"],
        [target(app), "--queue", "billing=2"],
    ) as (email_worker, billing_worker):
        await wait_for(
            lambda: all(completed_by(conn, job.id) for job in emails + charges),
            30,
            message=lambda: f"email: {email_worker.log()}\nbilling: {billing_worker.log()}",
        )
        assert {completed_by(conn, job.id) for job in emails} == {email_worker.process.pid}
        assert {completed_by(conn, job.id) for job in charges} == {billing_worker.process.pid}
        assert (await client.get_job(report.id)).state is awa.JobState.AVAILABLE  # type: ignore[union-attr]
    assert email_worker.stop() == 0
    assert billing_worker.stop() == 0
    await client.close()


async def test_a_second_sigterm_cuts_the_graceful_wait_short(
    app: types.ModuleType, tmp_path: Path, database_url: str, conn: Conn
) -> None:
    """The first SIGTERM waits for running handlers (up to --shutdown-timeout); a second one
    interrupts them: the job goes back to available and the worker leaves awa.runtimes."""
    client: awa.AsyncClient = app.client
    job = await client.insert(app.Hang(1))
    with workers(
        tmp_path, database_url, [target(app), "--queue", "hang=1", "--shutdown-timeout", "120"]
    ) as (worker,):
        await wait_started(worker)
        await wait_for(lambda: must_job_row(conn, job.id)["state"] == "running", 20)
        worker.process.send_signal(signal.SIGTERM)
        await wait_for(lambda: "shutting down gracefully" in worker.log(), 10)
        started = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        await wait_for(lambda: worker.process.poll() is not None, 30, message=worker.log)
        assert time.monotonic() - started < 30  # not the 120 s of --shutdown-timeout
        assert worker.process.returncode == 0, worker.log()
    assert must_job_row(conn, job.id)["state"] == "available"
    assert conn.execute("SELECT count(*) FROM awa.runtimes").fetchone() == (0,)
    await client.close()


async def test_readme_production_example_with_a_module_declaring_other_queues(
    app: types.ModuleType, tmp_path: Path, database_url: str, conn: Conn
) -> None:
    """README: ``awa worker myapp.jobs:client --queue email=4`` starts although the module
    declares other queues too."""
    client: awa.AsyncClient = app.client
    job = await client.insert(app.SendEmail("ada@example.com"))
    with workers(tmp_path, database_url, [target(app), "--queue", "email=4"]) as [worker]:
        await wait_for(lambda: completed_by(conn, job.id), 30, message=worker.log)
    assert worker.stop() == 0
    assert "worker started on queues email" in worker.log()
    await client.close()


# settings ----------------------------------------------------------------------------------


async def test_settings_from_a_file_environment_and_flags(
    app: types.ModuleType, tmp_path: Path, database_url: str, conn: Conn
) -> None:
    """The file names the client, queues and runtime settings; AWA_* variables and flags
    override it; per-queue settings (deadline, retry policy) reach the queue."""
    (tmp_path / "awa.toml").write_text(
        textwrap.dedent(
            f"""
            [worker]
            client = "{target(app)}"
            heartbeat_interval = 2
            heartbeat_staleness = 10
            log_level = "debug"

            [queues.flaky]
            max_workers = 1
            deadline_duration = 45
            retry = {{ base = 1, jitter = 0, max_delay = 600 }}

            [queues.email]
            max_workers = 3
            """
        )
    )
    client: awa.AsyncClient = app.client
    flaky = await client.insert(app.Flaky(1), max_attempts=3)
    email = await client.insert(app.SendEmail("a@example.com"))
    command = ["--config", "awa.toml", "--queue-option", "flaky.retry.max_delay=7"]
    env = {"AWA_HEARTBEAT_INTERVAL": "1", "AWA_COMPLETED_RETENTION": "3600"}
    with workers(tmp_path, database_url, command, env=env) as [worker]:
        await wait_for(lambda: completed_by(conn, email.id), 30, message=worker.log)
        row = await wait_for(
            lambda: conn.execute(
                "SELECT state, errors->0->>'error', run_at - attempted_at"
                " FROM awa.jobs WHERE id = %s AND state = 'retryable'",
                (flaky.id,),
            ).fetchone(),
            30,
            message=worker.log,
        )
    assert worker.stop() == 0
    log = worker.log()
    assert "worker started on queues flaky, email" in log
    assert "(deadline 45s)" in row[1]  # the queue's deadline
    assert row[2].total_seconds() == pytest.approx(1, abs=0.5)  # retry base 1, no jitter
    assert " DEBUG " in log  # log_level from the file
    await client.close()


def run_awa(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AWA), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--shutdown-timeout", "-5"], "-5"),
        (["--log-level", "bogus"], "bogus"),
        (["--heartbeat-interval", "soon"], "heartbeat_interval must be a number of seconds"),
        (["--heartbeat-interval", "-1"], "heartbeat_interval must be > 0"),
        (["--no-such-setting", "1"], "--no-such-setting"),
        (["--queue", "email=0"], "MAX_WORKERS must be at least 1"),
        (["--queue", "email=two"], "MAX_WORKERS must be a positive integer"),
        (["--queue-option", "email.colour=red"], "unknown queue setting 'colour'"),
        (["--queue-option", "nodot"], "QUEUE.KEY=VALUE"),
        (["--queue", "email", "--queue-option", "billing.max_workers=2"], "billing"),
        (["--config", "missing.toml"], "missing.toml"),
    ],
)
def test_bad_settings_are_one_error_line(
    app: types.ModuleType, tmp_path: Path, args: list[str], expected: str
) -> None:
    line = one_error_line(run_awa("worker", target(app), *args, cwd=tmp_path))
    assert expected in line


def test_bad_config_file_is_one_error_line(app: types.ModuleType, tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[worker]\nheartbeat_intervl = 3\n")
    line = one_error_line(run_awa("worker", target(app), "--config", "bad.toml", cwd=tmp_path))
    assert "heartbeat_intervl" in line
    assert "heartbeat_interval" in line  # the valid keys are listed
    (tmp_path / "broken.toml").write_text("[worker\n")
    line = one_error_line(run_awa("worker", target(app), "--config", "broken.toml", cwd=tmp_path))
    assert "not valid TOML" in line


@pytest.mark.parametrize(
    ("source", "attribute", "expected"),
    [
        ("def broken(:\n", "client", "syntax error in"),
        ("raise RuntimeError('no config')\n", "client", "RuntimeError: no config"),
        ("import not_a_module_anywhere\n", "client", "not_a_module_anywhere"),
        ("client = 42\n", "client", "is a int, not an awa.AsyncClient"),
        ("import awa\nclient = awa.Client('postgresql://x/y')\n", "client", "awa.Client"),
        ("x = 1\n", "client", "has no attribute 'client'"),
        ("def client():\n    raise ValueError('boom')\n", "client", "ValueError: boom"),
    ],
)
def test_bad_worker_modules_are_one_error_line(
    tmp_path: Path, database_url: str, source: str, attribute: str, expected: str
) -> None:
    module = f"bad_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(source)
    result = run_awa(
        "worker", f"{module}:{attribute}", cwd=tmp_path, env={"DATABASE_URL": database_url}
    )
    line = one_error_line(result)
    assert line.startswith("error: ")
    assert expected in line


def test_missing_module_is_one_error_line(tmp_path: Path) -> None:
    line = one_error_line(run_awa("worker", "nowhere.jobs:client", cwd=tmp_path))
    assert "no module named 'nowhere'" in line


# logging -----------------------------------------------------------------------------------


async def test_json_log_lines(
    app: types.ModuleType, tmp_path: Path, database_url: str, conn: Conn
) -> None:
    """--log-format json: one JSON object per line, with the job's fields on the records
    about a job (here the retry of a failing handler)."""
    client: awa.AsyncClient = app.client
    flaky = await client.insert(app.Flaky(7))
    with workers(
        tmp_path, database_url, [target(app), "--queue", "flaky", "--log-format", "json"]
    ) as [worker]:
        await wait_for(lambda: "flaky 7 failed" in worker.log(), 30, message=worker.log)
    assert worker.stop() == 0
    entries = [json.loads(line) for line in worker.log().splitlines() if line.strip()]
    assert all({"timestamp", "level", "logger", "message"} <= set(entry) for entry in entries)
    [retry] = [entry for entry in entries if "flaky 7 failed" in entry["message"]]
    assert retry["level"] == "WARNING"
    assert retry["logger"] == "awa.worker"
    assert (retry["job_id"], retry["kind"], retry["queue"], retry["attempt"]) == (
        flaky.id,
        "flaky",
        "flaky",
        1,
    )
    assert time.time() - 60 < _epoch(retry["timestamp"]) <= time.time()
    await client.close()


def _epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp).timestamp()


def test_the_documented_settings_file_is_valid(tmp_path: Path) -> None:
    """docs/workers.md's TOML example is a settings file the worker accepts."""
    from awa.worker import settings

    text = (Path(__file__).parent.parent / "docs" / "workers.md").read_text()
    [example] = re.findall(r"```toml\n(.*?)```", text, re.DOTALL)
    path = tmp_path / "awa.toml"
    path.write_text(example)
    resolved = settings.resolve(
        config=path,
        client=None,
        queues=(),
        queue_options=(),
        runtime={},
        shutdown_timeout=None,
        log_level=None,
        log_format=None,
    )
    resolved.check()
    assert resolved.client == "shop.jobs:client"
    assert resolved.runtime["completed_retention"] == 3600
    assert resolved.start_queues([]) == {
        "email": {
            "max_workers": 8,
            "deadline_duration": 60,
            "retry": awa.RetryPolicy(base=3, max_delay=3600),
        },
        "billing": {"max_workers": 2},
    }
