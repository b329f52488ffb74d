"""`awa bench` runs every scenario end to end (tiny sizes: this checks it works, not speed)."""

from __future__ import annotations

import json
import os
import uuid

import psycopg
from click.testing import CliRunner
from psycopg import sql

from awa.cli import main


def test_bench_runs_every_scenario(server_url: str) -> None:
    name = f"awa_bench_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    args = ["--database-url", server_url, "bench", "--scratch-database", name, "--jobs", "200"]
    args += ["--runs", "1", "--rate", "50", "--seconds", "0.5", "--json"]
    try:
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))
    assert set(report) == {"enqueue", "copy", "drain", "drain-hook", "drain-followup", "latency"}
    for scenario in ("enqueue", "copy", "drain", "drain-hook", "drain-followup"):
        assert report[scenario]["jobs"] == 200
        assert report[scenario]["jobs_per_second"] > 0
    assert report["drain"]["commits_per_job"] < 1
    assert report["latency"]["jobs"] == 25
    assert report["latency"]["p50_ms"] > 0
    # The baselines measured beside awa's figures, for ratios.
    assert report["enqueue"]["raw_sql_per_second"] > 0
    assert report["enqueue"]["producers_8_per_second"] > 0
    assert report["copy"]["raw_copy_per_second"] > 0
    assert report["latency"]["floor_p50_ms"] > 0
    assert report["latency"]["floor_commit_p50_ms"] >= 0
