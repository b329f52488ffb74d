"""Dead tuples under a long stream: does awa.jobs stay small while it churns?

A producer streams no-op jobs in COPY batches (keeping a bounded backlog) while one worker
drains them at full speed, with retention deleting completed jobs after a few seconds. Every
second the script samples ``n_live_tup``, ``n_dead_tup`` and the autovacuum count of
``awa.jobs`` (pg_stat_user_tables) and the table's size with its indexes, then reports the
maximum and final values. It runs in a scratch database (``awa_dead_tuples``, dropped and
recreated) on the server of ``--database-url`` / ``DATABASE_URL``.

    .venv/bin/python bench/dead_tuples.py --jobs 200000 --own-server

Statistics reach pg_stat_user_tables with a delay of about a second, so samples trail the
table slightly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

import awa
from awa.migrations import migrate_sync

SCRATCH = "awa_dead_tuples"
STATS = """
SELECT n_live_tup, n_dead_tup, autovacuum_count,
       pg_total_relation_size('awa.jobs') AS bytes,
       (SELECT count(*) FROM awa.jobs WHERE state = 'completed') AS completed_rows
FROM pg_stat_user_tables WHERE relid = 'awa.jobs'::regclass
"""


@dataclasses.dataclass
class Tick:
    n: int


@dataclasses.dataclass
class Sample:
    at: float
    live: int
    dead: int
    autovacuums: int
    bytes: int
    completed_rows: int
    done: int


@contextlib.contextmanager
def own_server() -> Iterator[str]:
    """A throwaway server with the stock settings (autovacuum on, naptime 60 s), started
    with the test suite's cluster helper; yields its URL."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest_cluster import Cluster, _bin_dir

    bin_dir = _bin_dir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries found (set PG_BIN)")
    server = Cluster(bin_dir)
    try:
        server.init(durable=True)
        server.start()
        yield server.url
    finally:
        server.destroy()


def scratch_database(server: str) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(SCRATCH))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SCRATCH)))
    url = psycopg.conninfo.make_conninfo(server, dbname=SCRATCH)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_sync(conn)
    return url


async def produce(client: awa.AsyncClient, total: int, batch: int, backlog: int) -> None:
    """Insert ``total`` jobs in COPY batches, keeping at most ``backlog`` available."""
    sent = 0
    while sent < total:
        async with client.connection() as conn:
            cursor = await conn.execute("SELECT count(*) FROM awa.jobs WHERE state = 'available'")
            row = await cursor.fetchone()
        if row is not None and row[0] >= backlog:
            await asyncio.sleep(0.01)
            continue
        size = min(batch, total - sent)
        await client.insert_many_copy([Tick(sent + i) for i in range(size)])
        sent += size


async def sample(url: str, runtime_done: list[int]) -> Sample:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(STATS)
        row = await cursor.fetchone()
    assert row is not None
    live, dead, autovacuums, size, completed_rows = row
    return Sample(time.monotonic(), live, dead, autovacuums, size, completed_rows, runtime_done[0])


async def vacuum_now_and_then(url: str, every: float) -> None:
    """VACUUM awa.jobs every ``every`` seconds (what a prompt autovacuum would do)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            await asyncio.sleep(every)
            await conn.execute("VACUUM awa.jobs")


async def run(args: argparse.Namespace) -> None:
    url = scratch_database(args.database_url)
    client = awa.AsyncClient(url, max_connections=16)

    @client.task(Tick)
    async def handle(job: awa.Job[Tick]) -> None:
        pass

    await client.start(
        {"default": {"max_workers": args.workers, "poll_interval": 0.1}},
        completed_retention=args.retention,
        cleanup_interval=args.cleanup_interval,
    )
    runtime = client.runtime
    assert runtime is not None
    done = [0]
    samples: list[Sample] = []
    started = time.monotonic()
    producer = asyncio.create_task(produce(client, args.jobs, args.batch, args.backlog))
    vacuum = None
    if args.vacuum_every:
        vacuum = asyncio.create_task(vacuum_now_and_then(url, args.vacuum_every))
    while runtime.completed < args.jobs:
        await asyncio.sleep(args.interval)
        done[0] = runtime.completed
        samples.append(await sample(url, done))
        if args.verbose:
            last = samples[-1]
            print(
                f"{last.at - started:6.1f}s done {last.done:>7} live {last.live:>7} "
                f"dead {last.dead:>7} autovacuums {last.autovacuums} "
                f"size {last.bytes / 2**20:.1f} MiB"
            )
    drained = time.monotonic() - started
    await producer
    # After the drain: let retention delete what is left and autovacuum catch up.
    settle_until = time.monotonic() + args.retention + 2 * args.cleanup_interval + args.settle
    while time.monotonic() < settle_until:
        await asyncio.sleep(args.interval)
        samples.append(await sample(url, done))
    if vacuum is not None:
        vacuum.cancel()
    await client.shutdown()
    await client.close()

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings"
            " WHERE name IN ('autovacuum', 'autovacuum_naptime', 'server_version')"
        )
        settings = await cursor.fetchone()
    peak = max(samples, key=lambda s: s.dead)
    final = samples[-1]
    during = [s for s in samples if s.at - started <= drained]
    extra = f"every {args.vacuum_every:g}s" if args.vacuum_every else "none"
    print(f"server:              {settings[0] if settings else '?'}")
    print(f"extra VACUUM:        {extra}")
    print(
        f"jobs:                {args.jobs} drained in {drained:.1f}s "
        f"({args.jobs / drained:,.0f} jobs/s), {args.workers} handler slots"
    )
    print(
        f"retention:           completed after {args.retention:g}s, cleanup every "
        f"{args.cleanup_interval:g}s"
    )
    print(
        f"n_dead_tup max:      {peak.dead:,} (at {peak.at - started:.0f}s, {peak.done:,} jobs done)"
    )
    print(
        f"n_dead_tup mean:     {sum(s.dead for s in during) / max(len(during), 1):,.0f} "
        f"during the drain"
    )
    print(
        f"n_dead_tup final:    {final.dead:,} ({final.at - started - drained:.0f}s after "
        f"the drain; live rows {final.live:,})"
    )
    print(f"autovacuum runs:     {final.autovacuums}")
    print(
        f"table + indexes:     max {max(s.bytes for s in samples) / 2**20:.1f} MiB, "
        f"final {final.bytes / 2**20:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="a server URL (the scratch database is created next to it)",
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=32, help="handler slots")
    parser.add_argument("--batch", type=int, default=2000, help="jobs per COPY")
    parser.add_argument("--backlog", type=int, default=10_000, help="most jobs waiting")
    parser.add_argument("--retention", type=float, default=5.0, help="completed_retention (s)")
    parser.add_argument("--cleanup-interval", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds sampled after")
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=0.0,
        help="also VACUUM awa.jobs every so many seconds (0: leave it to autovacuum)",
    )
    parser.add_argument("--verbose", action="store_true", help="print every sample")
    parser.add_argument(
        "--own-server",
        action="store_true",
        help="start a throwaway server with the stock settings instead (as the tests do)",
    )
    args = parser.parse_args()
    if args.own_server:
        with own_server() as url:
            args.database_url = url
            asyncio.run(run(args))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
