"""How fast does each page of the operator UI render on a large table?

Fills a scratch database (``awa_ui_pages``, dropped and recreated) on the server of
``--database-url`` / ``DATABASE_URL`` with ``--jobs`` jobs (default 1,000,000) in a realistic
mix: mostly completed jobs of the last two hours, a backlog of available and scheduled jobs,
failures with tracebacks, retries, parked callbacks and follow-ups with lineage. Then it
renders each page through the ASGI app (the whole server side: queries, templates) ``--runs``
times and prints the median and the slowest time per page.

    .venv/bin/python bench/ui_pages.py                # 1,000,000 jobs, 7 runs per page
    .venv/bin/python bench/ui_pages.py --jobs 100000 --runs 3 --keep

The leader's queue sample is taken once before the runs, as a running fleet keeps it fresh.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import httpx
import psycopg
from psycopg import sql

import awa
from awa.observability.queue_samples import store_queue_samples
from awa.storage.migrations import migrate_sync
from awa.ui import create_app

SCRATCH = "awa_ui_pages"

# Shares of the table by state (the rest is completed).
MIX = {
    "available": 0.05,
    "scheduled": 0.02,
    "failed": 0.01,
    "retryable": 0.005,
    "waiting_external": 0.001,
    "running": 0.0005,
}

FILL = """
INSERT INTO awa.jobs (kind, queue, args, state, attempt, max_attempts, run_at, created_at,
                      attempted_at, finalized_at, errors, tags, metadata, callback_id,
                      callback_timeout_at, heartbeat_at)
SELECT kind, queue, args, state::awa.job_state,
       CASE WHEN state IN ('available', 'scheduled') THEN 0 ELSE 1 END,
       25,
       CASE WHEN state = 'scheduled' THEN now() + (n %% 86400) * interval '1 second'
            ELSE now() - (n %% 7200) * interval '1 second' END,
       now() - (n %% 7200) * interval '1 second',
       CASE WHEN state IN ('available', 'scheduled') THEN NULL ELSE now() END,
       CASE WHEN state IN ('completed', 'failed') THEN now() - (n %% 7200) * interval '1 second'
       END,
       CASE WHEN state IN ('failed', 'retryable') THEN jsonb_build_array(jsonb_build_object(
           'error', 'TimeoutError: upstream ' || (n %% 7) || E' timed out\n  File "app.py", '
                    || 'line 12, in handle\n    await call()',
           'attempt', 1, 'at', now()))
            ELSE '[]'::jsonb END,
       CASE WHEN n %% 10 = 0 THEN ARRAY['nightly'] ELSE '{}'::text[] END,
       CASE WHEN n %% 100 = 1 THEN jsonb_build_object('awa:trigger', jsonb_build_object(
           'id', n - 1, 'kind', 'signup', 'outcome', 'completed', 'via', 'follow_up'))
            ELSE '{}'::jsonb END,
       CASE WHEN state = 'waiting_external' THEN gen_random_uuid() END,
       CASE WHEN state = 'waiting_external' THEN now() + interval '1 hour' END,
       CASE WHEN state = 'running' THEN now() END
FROM (
    SELECT n,
           (ARRAY['email', 'charge', 'report', 'signup', 'resize'])[1 + n %% 5] AS kind,
           (ARRAY['default', 'mail', 'payments', 'media'])[1 + n %% 4] AS queue,
           jsonb_build_object('user_id', n, 'note', 'order ' || n) AS args,
           CASE
               WHEN r < %(available)s THEN 'available'
               WHEN r < %(scheduled)s THEN 'scheduled'
               WHEN r < %(failed)s THEN 'failed'
               WHEN r < %(retryable)s THEN 'retryable'
               WHEN r < %(waiting_external)s THEN 'waiting_external'
               WHEN r < %(running)s THEN 'running'
               ELSE 'completed'
           END AS state
    FROM (SELECT n, (n * 7919 %% 100000) / 100000.0 AS r
          FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n) AS numbered
) AS jobs
"""


def scratch_url(server_url: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(SCRATCH))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SCRATCH)))
    info = psycopg.conninfo.conninfo_to_dict(server_url)
    info["dbname"] = SCRATCH
    return psycopg.conninfo.make_conninfo(**info)


def fill(url: str, jobs: int) -> None:
    bounds: dict[str, float] = {}
    total = 0.0
    for state, share in MIX.items():
        total += share
        bounds[state] = total
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_sync(conn)
        step = 100_000
        for first in range(1, jobs + 1, step):
            last = min(first + step - 1, jobs)
            conn.execute(FILL, {**bounds, "first": first, "last": last})
        conn.execute("VACUUM ANALYZE awa.active_jobs, awa.held_jobs, awa.done_jobs")
    print(f"filled {jobs:,} jobs in {time.monotonic() - started:.0f} s", file=sys.stderr)


async def measure(url: str, runs: int) -> list[tuple[str, float, float]]:
    with psycopg.connect(url) as conn:
        failed = conn.execute("SELECT max(id) FROM awa.jobs WHERE state = 'failed'").fetchone()
        follow_up = conn.execute(
            "SELECT max(id) FROM awa.jobs WHERE metadata ? 'awa:trigger'"
        ).fetchone()
    assert failed is not None
    assert follow_up is not None
    trigger = int(follow_up[0]) - 1
    pages = {
        "overview": "/",
        "jobs": "/jobs",
        "jobs, failed": "/jobs?state=failed",
        "jobs, kind": "/jobs?kind=report",
        "jobs, tag": "/jobs?tag=nightly",
        "jobs, args text": "/jobs?q=order%2012345",
        "jobs, scheduled by run_at": "/jobs?state=scheduled&sort=run_at",
        "jobs, page 100": "/jobs?after=500000",
        "job (failed)": f"/jobs/{failed[0]}",
        "job (trigger)": f"/jobs/{trigger}",
        "callbacks": "/callbacks",
        "schedules": "/schedules",
        "failures": "/failed",
    }
    results = []
    async with awa.AsyncClient(url) as client:
        async with client.connection() as conn:
            await store_queue_samples(conn)
        app = create_app(client)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            for name, path in pages.items():
                await http.get(path)  # warm the statement and the template
                times = []
                for _ in range(runs):
                    started = time.perf_counter()
                    response = await http.get(path)
                    times.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, (path, response.status_code)
                results.append((name, statistics.median(times), max(times)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    options = parser.parse_args()
    server = options.database_url or "postgresql://postgres@127.0.0.1:5432/postgres"
    url = scratch_url(server)
    try:
        fill(url, options.jobs)
        results = asyncio.run(measure(url, options.runs))
        print(f"{'PAGE':<28}{'MEDIAN MS':>10}{'MAX MS':>9}")
        for name, median, slowest in results:
            print(f"{name:<28}{median:>10.1f}{slowest:>9.1f}")
    finally:
        if not options.keep:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(SCRATCH)
                    )
                )


if __name__ == "__main__":
    main()
