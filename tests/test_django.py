"""awa.contrib.django: Django's task API on awa, the worker and migrate commands, settings.

Django settings can be configured once per process and test_bridge.py configures them in
this one, so every Django scenario runs in a subprocess: the project in
tests/django_project/ (settings from AWA_TEST_DB and AWA_TEST_OVERRIDES), scenario scripts
in tests/procs/django_scenario.py, and ``python -m django awa_worker`` as the worker.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from awa.contrib.django import KIND, awa_priority
from awa.sql import current_version
from helpers_django import TIMEOUT, django_env, manage, scenario
from helpers_worker import wait_for, wait_for_state
from jobs_helpers import Conn, must_job_row

STARTED = "awa worker started: queues "


class Worker:
    """A ``manage.py awa_worker`` subprocess, started and found ready."""

    def __init__(self, env: dict[str, str], args: tuple[str, ...]) -> None:
        command = [sys.executable, "-m", "django", "awa_worker", *args]
        # Closed by close(), which every user of a Worker calls in a finally.
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.queues = self._wait_started()
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def _wait_started(self) -> str:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith(STARTED):
                return line.removeprefix(STARTED)
        raise AssertionError(f"the worker did not start:\n{self.log()}")

    def log(self) -> str:
        """What the worker wrote to stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read()

    def stop(self) -> int:
        """SIGTERM, then wait for the graceful exit; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=TIMEOUT)

    def close(self) -> None:
        """Kill the worker if it still runs (a test that failed midway)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@contextlib.contextmanager
def worker(env: dict[str, str], *args: str) -> Iterator[Worker]:
    """Run a worker for the block; it must stop cleanly (exit 0) on SIGTERM afterwards."""
    running = Worker(env, args)
    try:
        yield running
        code = running.stop()
        assert code == 0, f"the worker exited with {code}:\n{running.log()}"
    finally:
        running.close()


def job_count(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert row is not None
    return int(row[0])


# --- In this process: nothing here configures Django --------------------------------------


@pytest.mark.parametrize(
    ("django_priority", "expected"),
    [(100, 1), (1, 1), (0, 2), (-1, 3), (-50, 3), (-51, 4), (-100, 4)],
)
def test_django_priorities_map_onto_awa_priorities(django_priority: int, expected: int) -> None:
    assert awa_priority(django_priority) == expected


# --- Enqueue, in the caller's transaction -------------------------------------------------


def test_enqueue_rolled_back_with_the_transaction_leaves_no_job(
    database_url: str, conn: Conn
) -> None:
    out = scenario("rollback", django_env(database_url))
    # Inside the transaction the job exists (the result reads it on the same connection)...
    assert out["status"] == "READY"
    assert out["inside"] == "READY"
    # ...and after the rollback it never did.
    assert out["after"]["class"] == "TaskResultDoesNotExist"
    assert job_count(conn) == 0


async def test_committed_tasks_run_in_the_worker_and_report_their_results(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    env = django_env(database_url)
    signals = tmp_path / "signals.log"
    with worker({**env, "AWA_TEST_SIGNAL_LOG": str(signals)}) as running:
        assert running.queues == "default, reports"
        out = scenario("commit", env)
        ping = await wait_for_state(conn, out["ping_id"], "completed", timeout=30)
    for name, value in [
        ("add", 5),
        ("aenqueue", 13),
        ("async_task", 42),
        ("context", 1),  # takes_context: the context's attempt number
        ("orm", database_name(database_url)),  # Django's connection in the worker thread
        ("report", {"name": "q3", "pages": 4}),
    ]:
        result = out[name]
        assert result["status"] == "SUCCESSFUL", (name, result)
        assert result["return_value"] == value, name
        assert result["errors"] == []
        assert result["attempts"] == 1
        assert [result[key] for key in ("enqueued", "started", "finished")] == [True] * 3
    assert out["report"]["queue_name"] == "reports"
    assert out["report"]["kwargs"] == {"pages": 4}
    assert out["aget_result"] == out["add"]
    assert out["mismatch"]["class"] == "TaskResultMismatch"
    # Each task is one job of the Django kind, its return value the job's output.
    row = must_job_row(conn, int(out["add"]["id"]))
    assert (row["kind"], row["state"], row["output"]) == (KIND, "completed", 5)
    assert row["args"]["task"] == "django_project.tasks.add"
    assert (row["args"]["args"], row["args"]["kwargs"]) == ([2, 3], {})
    # The awa task registered on get_client() (settings.AWA TASK_MODULES) ran too.
    assert ping["output"] == {"pong": "hello"}
    finished = [json.loads(line) for line in signals.read_text().splitlines()]
    assert ("task_finished", out["add"]["id"], "SUCCESSFUL") in [
        (record["signal"], record["id"], record["status"]) for record in finished
    ]


def database_name(conninfo: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(conninfo)["dbname"])


async def test_failed_tasks_report_their_errors(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    env = django_env(database_url)
    signals = tmp_path / "signals.log"
    with worker({**env, "AWA_TEST_SIGNAL_LOG": str(signals)}):
        out = scenario("failures", env)
        missing = await wait_for_state(conn, out["missing_id"], "failed", timeout=30)

    failed = out["fail"]
    assert failed["status"] == "FAILED"
    assert failed["attempts"] == 1  # MAX_ATTEMPTS defaults to 1: a task that raises fails
    [error] = failed["errors"]
    assert error["class"] == "builtins.ValueError"
    assert error["traceback"].startswith("ValueError: boom")
    assert 'tasks.py", line' in error["traceback"]  # the task's own frame

    [error] = out["not_json"]["errors"]
    assert out["not_json"]["status"] == "FAILED"
    assert error["class"] == "awa.errors.TerminalError"
    assert (
        "return value of task 'django_project.tasks.not_json' cannot be stored as JSON"
        in (error["traceback"])
    )

    text = missing["errors"][-1]["error"]
    assert "cannot import the task 'django_project.gone.nowhere'" in text
    assert missing["errors"][-1]["terminal"] is True

    # The worker sent task_started and task_finished, from a thread where the ORM works;
    # a failure's receivers see the exception being handled (Django's log receiver needs it).
    sent = [json.loads(line) for line in signals.read_text().splitlines()]
    failing = [record for record in sent if record["id"] == failed["id"]]
    assert [(r["signal"], r["status"], r["handling"]) for r in failing] == [
        ("task_started", "RUNNING", None),
        ("task_finished", "FAILED", "ValueError"),
    ]
    assert {record["sender"] for record in sent} == {"AwaTaskBackend"}


def test_priority_run_after_and_queue_name_land_on_the_row(database_url: str, conn: Conn) -> None:
    out = scenario("options", django_env(database_url))

    def row(name: str) -> dict[str, Any]:
        return must_job_row(conn, int(out[name]))

    priorities = {name: row(name)["priority"] for name in ("urgent", "raised", "default")}
    assert priorities == {"urgent": 1, "raised": 1, "default": 2}
    assert (row("lowered")["priority"], row("lowest")["priority"]) == (3, 4)
    assert row("urgent")["args"]["priority"] == 100  # the task's own, for its result

    deferred = row("deferred")
    later = dt.datetime(2100, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert (deferred["queue"], deferred["state"], deferred["run_at"]) == (
        "reports",
        "scheduled",
        later,
    )
    assert row("report")["queue"] == "reports"  # the decorator's queue_name
    assert row("default")["max_attempts"] == 1

    # Another backend: its OPTIONS set the attempts and deadline, its empty QUEUES any queue.
    retrying = row("retrying")
    assert (retrying["max_attempts"], retrying["queue"]) == (3, "anywhere")
    assert retrying["deadline_duration"] == dt.timedelta(seconds=60)
    assert retrying["args"]["backend"] == "retrying"

    fetched = out["fetched"]
    assert fetched["status"] == "READY"
    assert (fetched["queue_name"], fetched["run_after"]) == ("reports", later.isoformat())
    assert fetched["attempts"] == 0
    assert [fetched[key] for key in ("enqueued", "started", "finished")] == [True, False, False]


def test_invalid_tasks_and_unknown_results_raise_the_apis_errors(database_url: str) -> None:
    out = scenario("invalid", django_env(database_url))
    assert out["flags"] == {
        "supports_defer": True,
        "supports_async_task": True,
        "supports_get_result": True,
        "supports_priority": True,
    }
    invalid = out["invalid_task_class"]  # InvalidTask (Django 6) or InvalidTaskError
    assert out["unknown_queue"]["class"] == invalid
    assert "nope" in out["unknown_queue"]["message"]
    assert out["priority_range"]["class"] == invalid
    assert out["naive_run_after"]["class"] == invalid
    assert out["not_json_args"]["class"] == "TypeError"
    for name in ("unknown_id", "bad_id", "other_kind"):
        assert out[name]["class"] == "TaskResultDoesNotExist", name


async def test_jobs_in_a_database_of_their_own(database_url: str, conn: Conn) -> None:
    # Django on SQLite, the jobs in PostgreSQL at settings.AWA['URL']: an enqueue commits on
    # its own (Django's transaction is another database's). Without QUEUES the worker runs
    # the backends' queues and those the awa tasks declare.
    env = django_env(
        database_url,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        AWA={"URL": database_url, "TASK_MODULES": ["django_project.awa_jobs"]},
    )
    with worker(env) as running:
        assert running.queues == "default, reports"
        out = scenario("separate_database", env)
    assert out["result"]["status"] == "SUCCESSFUL"
    assert out["result"]["return_value"] == 42
    assert job_count(conn) == 1


async def test_sigterm_lets_the_running_task_finish(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    env = {**django_env(database_url), "AWA_TEST_RELEASE": str(release)}
    running = Worker(env, ("--queue", "default=2", "--log-level", "info"))
    try:
        assert running.queues == "default"
        job_id = int(scenario("hold", env)["id"])
        await wait_for_state(conn, job_id, "running", timeout=30)
        running.proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: "shutting down gracefully" in running.log(), 30)
        assert running.proc.poll() is None  # waiting for the task, which still runs
        release.touch()
        assert running.proc.wait(timeout=TIMEOUT) == 0, running.log()
        assert "SIGTERM received: shutting down gracefully" in running.log()
    finally:
        running.close()
    row = must_job_row(conn, job_id)
    assert (row["state"], row["output"]) == ("completed", "done")


# --- Commands and settings ------------------------------------------------------------------


def test_awa_migrate_creates_the_schema_in_a_fresh_database(fresh_database: str) -> None:
    env = django_env(fresh_database)
    first = manage(env, "awa_migrate")
    assert first.returncode == 0, first.stderr
    versions = ", ".join(str(version) for version in range(1, current_version() + 1))
    assert first.stdout.strip() == f"applied awa migrations {versions}"

    assert schema_version(fresh_database) == current_version()
    again = manage(env, "awa_migrate")
    assert again.stdout.strip() == "the awa schema is up to date"
    script = manage(env, "awa_migrate", "--sql")
    assert script.stdout.startswith("-- awa schema")


def schema_version(url: str) -> int | None:
    import psycopg

    with psycopg.connect(url) as check:
        exists = check.execute("SELECT to_regclass('awa.schema_migrations')").fetchone()
        if exists is None or exists[0] is None:
            return None
        row = check.execute("SELECT max(version) FROM awa.schema_migrations").fetchone()
        return None if row is None else int(row[0])


def test_django_migrate_applies_the_schema_unless_told_not_to(fresh_database: str) -> None:
    # MIGRATE False: migrate leaves the jobs' database alone.
    off = manage(django_env(fresh_database, AWA={"MIGRATE": False}), "migrate")
    assert off.returncode == 0, off.stderr
    assert schema_version(fresh_database) is None
    # By default migrate applies awa's schema (so a test run's database has it too).
    on = manage(django_env(fresh_database), "migrate")
    assert on.returncode == 0, on.stderr
    assert "Applied awa migrations 1, " in on.stdout
    assert schema_version(fresh_database) == current_version()
    again = manage(django_env(fresh_database), "migrate")
    assert "awa" not in again.stdout  # nothing left to apply


def test_djangos_test_runner_gets_the_schema_in_its_test_database(database_url: str) -> None:
    done = manage(django_env(database_url), "test", "--noinput", "django_project.django_tests")
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stderr


def test_bad_settings_name_the_key(database_url: str) -> None:
    out = scenario("bad_settings", django_env(database_url))
    expected = {
        "not_a_dict": "settings.AWA must be a dict",
        "unknown_key": "unknown key(s) ['QUEUS']",
        "both": "not both",
        "unknown_alias": "settings.AWA['DATABASE'] is 'other'",
        "not_postgres": "awa needs PostgreSQL",
        "bad_url": "settings.AWA['URL']",
        "queues_type": "settings.AWA['QUEUES'] must be",
        "queues_option": "AWA['QUEUES']: queue 'default': unknown option(s) ['max_worker']",
        "runtime_key": "settings.AWA['RUNTIME']: start() got unknown option(s) ['heartbeat']",
        "weighted_without_queues": "weighted mode requires explicit queue configs",
        "timeout": "settings.AWA['SHUTDOWN_TIMEOUT']",
        "modules": "settings.AWA['TASK_MODULES']",
        "migrate_flag": "settings.AWA['MIGRATE'] must be True or False",
        "option_key": "TASKS['default']['OPTIONS'] has unknown key(s) ['MAX_ATTEMPT']",
        "max_attempts": "TASKS['default']['OPTIONS']['MAX_ATTEMPTS']",
        "deadline": "TASKS['default']['OPTIONS']['DEADLINE_DURATION']",
    }
    for name, fragment in expected.items():
        assert out[name]["class"] == out["improperly_configured"], name
        assert fragment in out[name]["message"], (name, out[name]["message"])


def test_commands_refuse_bad_settings(database_url: str) -> None:
    env = django_env(database_url, AWA={"QUEUES": "default"})
    for command in ("awa_worker", "awa_migrate", "check"):
        done = manage(env, command)
        assert done.returncode != 0, command
        assert "settings.AWA['QUEUES'] must be" in done.stderr, (command, done.stderr)
    assert "awa.E001" in manage(env, "check").stderr
