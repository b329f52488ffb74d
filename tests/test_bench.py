"""`awa bench` runs every scenario end to end (tiny sizes: this checks it works, not speed),
and works only in a scratch database of its own: it refuses any other, and drops its own at
the end, also when a run fails or is interrupted."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

import awa.cli.bench
from awa.cli import main
from awa.cli.bench import SCRATCH_MARK

TINY = ["--jobs", "50", "--runs", "1", "--only", "copy", "--json"]


def bench(server_url: str, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["--database-url", server_url, "bench", *args], catch_exceptions=False
    )


def comment_of(server_url: str, name: str) -> str | None:
    """The database's comment, "" when it has none, None when it does not exist."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(shobj_description(oid, 'pg_database'), '')"
            " FROM pg_database WHERE datname = %s",
            (name,),
        ).fetchone()
    return None if row is None else str(row[0])


def scratch_name_in(result: Result) -> str:
    match = re.search(r"working in the scratch database (\S+) on ", result.stderr)
    assert match, result.stderr
    return match.group(1)


@pytest.fixture
def database_name(server_url: str) -> Iterator[str]:
    """A name for a database of the test's own; dropped afterwards if it exists."""
    name = f"awa_bench_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    yield name
    with psycopg.connect(server_url, autocommit=True) as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(name)))


def create_database(server_url: str, name: str, comment: str | None = None) -> str:
    """A database holding one table with one row; returns its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        if comment is not None:
            mark = sql.SQL("COMMENT ON DATABASE {} IS {}")
            conn.execute(mark.format(sql.Identifier(name), sql.Literal(comment)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE precious (note text); INSERT INTO precious VALUES ('keep me')")
    return url


def test_bench_runs_every_scenario(server_url: str, database_name: str) -> None:
    args = ["--scratch-database", database_name, "--jobs", "200"]
    args += ["--runs", "1", "--rate", "50", "--seconds", "0.5", "--json"]
    result = bench(server_url, *args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    drains = ("drain", "drain-hook", "drain-followup", "drain-staged", "drain-2proc")
    drains += ("drain-beside-limits", "drain-capped", "drain-keys", "drain-rated")
    drains += ("drain-otel", "drain-otel-traced", "drain-chain", "drain-fan-in")
    assert set(report) == {"enqueue", "copy", *drains, "drain-finalize", "latency"}
    # One transaction per job, by design (the opt-in path of docs/finalize.md).
    assert report["drain-finalize"]["jobs"] == 200
    assert report["drain-finalize"]["commits_per_job"] >= 1
    assert report["drain-finalize"]["ratio_to_drain"] > 0
    for scenario in ("enqueue", "copy", *drains):
        assert report[scenario]["jobs"] == 200
        assert report[scenario]["jobs_per_second"] > 0
    for scenario in drains:
        assert report[scenario]["commits_per_job"] < 1, (scenario, report[scenario])
    for scenario in drains[1:]:
        assert report[scenario]["ratio_to_drain"] > 0  # beside its same-round baseline
    assert report["drain-2proc"]["processes"] == 2
    assert report["drain-rated"]["rate_vs_limit"] > 0
    assert report["latency"]["jobs"] == 25
    assert report["latency"]["p50_ms"] > 0
    # The baselines measured beside awa's figures, for ratios.
    assert report["enqueue"]["raw_sql_per_second"] > 0
    assert report["enqueue"]["producers_8_per_second"] > 0
    assert report["copy"]["raw_copy_per_second"] > 0
    assert report["latency"]["floor_p50_ms"] > 0
    assert report["latency"]["floor_commit_p50_ms"] >= 0
    # The database it was told to use did not exist: created, then dropped at the end.
    assert scratch_name_in(result) == database_name
    assert comment_of(server_url, database_name) is None


def test_bench_runs_the_scenarios_under_pressure(server_url: str, database_name: str) -> None:
    """pinned-horizon, drain-pinned and soak, each in a few seconds: the figures their
    targets are stated in are there."""
    args = ["--scratch-database", database_name, "--jobs", "200", "--runs", "1", "--json"]
    args += ["--only", "pinned-horizon", "--only", "drain-pinned", "--only", "soak"]
    args += ["--offered-rate", "200", "--phase-seconds", "1", "--pin-seconds", "2"]
    args += ["--window-seconds", "0.5", "--concurrency", "4"]
    args += ["--soak-seconds", "3", "--soak-rate", "200", "--soak-retention", "1"]
    result = bench(server_url, *args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == {"pinned-horizon", "drain-pinned", "soak"}
    pinned = report["pinned-horizon"]
    assert [w["phase"] for w in pinned["windows"]] == ["clean"] * 2 + ["pinned"] * 4 + [
        "recover"
    ] * 2
    assert pinned["pinned_jobs_per_second"] > 0
    assert pinned["pinned_last_minute_claim_p50_ms"] > 0
    assert {"active_jobs", "done_jobs", "held_jobs"} <= set(pinned["windows"][-1]["dead_tuples"])
    assert pinned["clean_wal_bytes_per_job"] > 0
    drained = report["drain-pinned"]
    assert drained["jobs"] == 4 * 200
    assert drained["round_4_jobs_per_second"] > 0
    assert drained["last_round_ratio_to_unpinned"] > 0
    soak = report["soak"]
    assert soak["offered_jobs_per_second"] == 200
    assert len(soak["windows"]) == 6
    assert soak["last_third_jobs_per_second"] > 0
    sizes = soak["last_third_largest_bytes"]
    assert {"active_jobs", "done_jobs", "held_jobs", "unique_keys"} <= set(sizes)
    assert all(size > 0 for size in sizes.values())


def test_default_run_leaves_no_scratch_database_behind(server_url: str) -> None:
    result = bench(server_url, *TINY)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["copy"]["jobs"] == 50
    name = scratch_name_in(result)
    assert re.fullmatch(r"awa_bench_[0-9a-f]{12}", name)
    assert comment_of(server_url, name) is None
    # Each run picks a fresh name.
    assert scratch_name_in(bench(server_url, *TINY)) != name


@pytest.mark.parametrize("comment", [None, "team reports", "awa bench scratch"])
def test_refuses_a_database_it_did_not_create(
    server_url: str, database_name: str, comment: str | None
) -> None:
    url = create_database(server_url, database_name, comment)
    result = bench(server_url, "--scratch-database", database_name, *TINY)
    assert result.exit_code == 2  # a bad --scratch-database: a usage error
    assert result.stdout == ""
    assert result.stderr == (
        f"error: database {database_name} exists and was not created by awa bench (it lacks "
        f"the comment '{SCRATCH_MARK}'); awa bench drops no such database: choose another "
        "--scratch-database, or leave the option out for a fresh one\n"
    )
    # Still there, with its data and its comment.
    assert comment_of(server_url, database_name) == (comment or "")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT note FROM precious").fetchall() == [("keep me",)]


def test_reuses_a_scratch_database_of_its_own(server_url: str, database_name: str) -> None:
    """A database carrying the mark (left by a run killed with -9, say) is recreated empty
    for the run and dropped at the end."""
    create_database(server_url, database_name, SCRATCH_MARK)
    seen: list[Any] = []
    real_run_bench = awa.cli.bench.run_bench

    async def run_bench_and_look(url: str, **kwargs: Any) -> dict[str, dict[str, Any]]:
        with psycopg.connect(url) as conn:
            found = conn.execute("SELECT to_regclass('precious')").fetchone()
        seen.append((found, comment_of(server_url, database_name)))
        return await real_run_bench(url, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(awa.cli.bench, "run_bench", run_bench_and_look)
        result = bench(server_url, "--scratch-database", database_name, *TINY)
    assert result.exit_code == 0, result.output
    assert seen == [((None,), SCRATCH_MARK)]  # recreated: the old table is gone, marked again
    assert comment_of(server_url, database_name) is None


@pytest.mark.parametrize("interruption", [RuntimeError("boom"), KeyboardInterrupt()])
def test_drops_its_database_when_a_run_fails_or_is_interrupted(
    server_url: str, interruption: BaseException
) -> None:
    seen: list[str | None] = []

    async def failing_run(url: str, **kwargs: Any) -> dict[str, dict[str, Any]]:
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        assert isinstance(name, str)
        seen.append(name)
        seen.append(comment_of(server_url, name))
        raise interruption

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(awa.cli.bench, "run_bench", failing_run)
        if isinstance(interruption, KeyboardInterrupt):
            result = bench(server_url, *TINY)
            assert result.exit_code == 1  # click reports "Aborted!"
        else:
            with pytest.raises(RuntimeError, match="boom"):
                bench(server_url, *TINY)
    name, comment = seen
    assert comment == SCRATCH_MARK
    assert isinstance(name, str)
    assert comment_of(server_url, name) is None


def wait_for_jobs(url: str, deadline: float) -> None:
    """Until the benchmark has inserted jobs in its scratch database."""
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            try:
                row = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
                if row is not None and row[0] > 0:
                    return
            except psycopg.errors.UndefinedTable:
                pass  # not migrated yet
            assert time.monotonic() < deadline, "no job inserted in time"
            time.sleep(0.05)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_drops_the_scratch_database(server_url: str) -> None:
    """SIGINT to a real `awa bench` process in the middle of a run."""
    script = Path(sys.executable).with_name("awa")
    command = [str(script), "--database-url", server_url, "bench", "--jobs", "1000000"]
    process = subprocess.Popen(
        [*command, "--only", "enqueue"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A suite started in the background (nohup ... &) inherits SIGINT ignored, and so
        # would the child: give it the default disposition, as a terminal's Ctrl-C finds it.
        preexec_fn=_default_sigint,
    )
    try:
        assert process.stderr is not None
        selector = selectors.DefaultSelector()
        selector.register(process.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        seen = b""
        while b"(dropped at the end)" not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no start line within 30 s: {seen!r}"
            if selector.select(timeout=remaining):
                chunk = os.read(process.stderr.fileno(), 4096)
                assert chunk, f"awa bench exited early: {seen!r}"
                seen += chunk
        match = re.search(rb"scratch database (\S+) on ", seen)
        assert match, seen
        name = match.group(1).decode()
        assert comment_of(server_url, name) == SCRATCH_MARK
        wait_for_jobs(psycopg.conninfo.make_conninfo(server_url, dbname=name), deadline)
        process.send_signal(signal.SIGINT)
        # Its exit (the scratch database dropped) takes a second alone.
        process.communicate(timeout=60)
        assert process.returncode != 0
        assert comment_of(server_url, name) is None
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "0"], "Invalid value for '--jobs': 0 is not in the range x>=1."),
        (["--runs", "0"], "Invalid value for '--runs': 0 is not in the range x>=1."),
        (["--concurrency", "-2"], "Invalid value for '--concurrency': -2 is not in the range"),
        (["--seconds", "0"], "Invalid value for '--seconds': 0.0 is not in the range x>0."),
        (["--rate", "-1"], "Invalid value for '--rate': -1.0 is not in the range x>0."),
        (["--rate", "many"], "Invalid value for '--rate': 'many' is not a valid float"),
        (
            ["--rate", "1", "--seconds", "0.5"],
            "--rate x --seconds is 0.5: the latency run needs at least 1 job",
        ),
    ],
)
def test_rejects_bad_numbers_before_touching_the_server(
    server_url: str, args: list[str], message: str
) -> None:
    result = bench(server_url, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "working in the scratch database" not in result.stderr


def test_rejects_a_name_postgres_would_truncate(server_url: str) -> None:
    result = bench(server_url, "--scratch-database", "b" * 64, *TINY)
    assert result.exit_code == 2
    assert result.stderr == ("error: --scratch-database must be a database name of 1 to 63 bytes\n")
    assert comment_of(server_url, "b" * 63) is None


def test_ui_pages_bench_runs(server_url: str) -> None:
    """bench/ui_pages.py keeps working (on a small table here; 1,000,000 jobs by default)."""
    script = Path(__file__).resolve().parent.parent / "bench" / "ui_pages.py"
    result = subprocess.run(
        [sys.executable, str(script), "--jobs", "3000", "--runs", "1"],
        env={**os.environ, "DATABASE_URL": server_url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "jobs, args text" in result.stdout
    assert "failures" in result.stdout
