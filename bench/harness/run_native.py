"""Drive the cross-system harness's phases for awa (Python) on an existing PostgreSQL server,
without Docker.

The harness (hardbyte/postgresql-job-queue-benchmarking) starts its own PostgreSQL with
``docker compose`` and runs Python adapters in containers. This script runs the harness's
own orchestrator (phases, idle-in-transaction holder, metrics daemon, wait events,
raw.csv, summary.json, plots) with four changes made before it starts:

- the server is the one of ``--database-url`` (its database part is replaced by each
  system's ``db_name``); nothing is started, stopped or restarted through Docker, so the
  phases that restart PostgreSQL are refused;
- each system's database is dropped and created anew before its run (what a fresh
  server gives the harness);
- ``awa-python`` runs natively: ``main.py`` beside this script, with ``--adapter-python``
  (default: this repository's ``.venv``), so it measures this checkout of awa;
- results go under ``--results`` (default: a folder in the temporary directory; a run's
  raw.csv is tens of megabytes).

Run it with a Python that has the harness's dependencies (psycopg, pydantic, numpy,
matplotlib); everything after the driver's own options goes to the harness's CLI::

    /tmp/harness-venv/bin/python bench/harness/run_native.py --harness /tmp/pjqb \\
        --database-url postgresql://postgres@127.0.0.1:5432/postgres \\
        run --systems awa-python --producer-rate 800 --worker-count 32 \\
        --phase warmup=warmup:30s --phase clean_1=clean:60s ...
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def database_url(base: str, dbname: str) -> str:
    """``base`` with its database replaced by ``dbname``."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def git(*args: str) -> str | None:
    found = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() if found.returncode == 0 else None


def patch_harness(harness: Path, base_url: str, adapter_python: Path, results: Path) -> Any:
    """Import the harness from ``harness`` and point it at the server and the native
    adapter; returns its orchestrator module."""
    sys.path.insert(0, str(harness))
    adapters: Any = importlib.import_module("bench_harness.adapters")
    orchestrator: Any = importlib.import_module("bench_harness.orchestrator")
    versions: Any = importlib.import_module("bench_harness.versions")
    psycopg: Any = importlib.import_module("psycopg")

    def url(dbname: str, host: str = "") -> str:
        return database_url(base_url, dbname)

    def server_is_up(_image: str) -> None:
        with psycopg.connect(url("postgres"), autocommit=True) as conn:
            conn.execute("SELECT 1")

    def no_docker(*_args: object) -> None:
        raise RuntimeError("this phase restarts PostgreSQL through Docker: not available here")

    fresh_database = orchestrator.preflight_database

    def preflight(manifest: Any, *, recreate: bool = False) -> None:
        fresh_database(manifest, recreate=True)

    def launch(manifest: Any, overrides: dict[str, str]) -> Any:
        return adapters.LaunchSpec(
            argv=[str(adapter_python), str(HERE / "awa-python-bench" / "main.py")],
            env=adapters._base_env(manifest, overrides),
        )

    def revision() -> dict[str, Any]:
        return {
            "source": "awa-py checkout",
            "git_sha": git("rev-parse", "HEAD"),
            "git_short": git("rev-parse", "--short", "HEAD"),
            "git_branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }

    adapters.pg_url = orchestrator.pg_url = url
    orchestrator.start_postgres = server_is_up
    orchestrator.stop_postgres = lambda _image: None
    orchestrator._compose_stop_postgres = orchestrator._compose_start_postgres = no_docker
    orchestrator._restart_postgres = no_docker
    orchestrator.preflight_database = preflight
    orchestrator.RESULTS_ROOT = results
    adapters.ADAPTERS["awa-python"] = adapters.AdapterEntry(
        bench_dir=HERE / "awa-python-bench", builder=lambda _skip: None, launcher=launch
    )
    versions._CAPTURE["awa-python"] = revision
    return orchestrator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--harness", type=Path, required=True, help="a checkout of the harness")
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="the server (any database: each system gets its own)",
    )
    parser.add_argument("--adapter-python", type=Path, default=REPO / ".venv" / "bin" / "python")
    parser.add_argument(
        "--results", type=Path, default=Path(tempfile.gettempdir()) / "awa-harness-runs"
    )
    ours, theirs = parser.parse_known_args()
    orchestrator = patch_harness(
        ours.harness.resolve(), ours.database_url, ours.adapter_python, ours.results.resolve()
    )
    return int(orchestrator.main(theirs))


if __name__ == "__main__":
    raise SystemExit(main())
