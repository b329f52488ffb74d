"""``awa bench``: measure enqueue, COPY, drain and latency on a scratch database.

Each scenario runs ``--runs`` times (round by round, every scenario once per round) and
reports the median; a drain variant also reports the median of its ratios to the plain
drain of the same round. The benchmark works only in a
database it creates on the configured server (``awa_bench_<random hex>``, or the name given
with ``--scratch-database``), marks as its own with a comment, and drops when it ends, also on
an error or Ctrl-C. It never drops a database that lacks its mark, so it cannot harm your
data. Figures depend on the machine: compare runs made on the same one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import math
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import click
import psycopg
from psycopg import sql as pgsql
from rich.console import Console
from rich.progress import Progress

import awa
from awa.cli.bench_drain import DRAIN_VARIANTS, SDK_VARIANTS, Noop, Result, bench_drain, reset
from awa.cli.bench_pinned import PinnedHorizonOptions, bench_drain_pinned, bench_pinned_horizon
from awa.cli.bench_soak import SoakOptions, bench_soak
from awa.cli.group import database_url_from_context, json_option, main, print_json, print_table
from awa.core.extras import has_extra, missing_extra, require_extra
from awa.errors import ValidationError
from awa.sql import query
from awa.storage.db import connection_kwargs, redact, resolve_database_url
from awa.worker.lanes import LanePositions, claim_statement

SCRATCH_MARK = "awa bench scratch database"
"""The comment awa bench writes on each database it creates; it drops no database without."""

MAX_DATABASE_NAME = 63  # bytes; PostgreSQL silently truncates longer identifiers


@dataclasses.dataclass
class Timed:
    n: int
    sent_at: float


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _database_statement(name: str, database: str, **extra: pgsql.Composable) -> pgsql.Composed:
    return pgsql.SQL(query(name)).format(database=pgsql.Identifier(database), **extra)


def _drop(server_url: str, database: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(_database_statement("bench_drop_database", database))


def scratch_database_name(name: str | None) -> str:
    """The name to work in: ``name`` once checked, else a fresh ``awa_bench_<random hex>``."""
    if name is None:
        return f"awa_bench_{secrets.token_hex(6)}"
    if not name or len(name.encode()) > MAX_DATABASE_NAME or "\0" in name:
        raise ValidationError(
            f"--scratch-database must be a database name of 1 to {MAX_DATABASE_NAME} bytes"
        )
    return name


@contextlib.contextmanager
def scratch_database(server_url: str, name: str) -> Iterator[str]:
    """Create the database ``name`` marked as awa bench's own, yield its URL, and drop it when
    the block ends (also on an error or Ctrl-C).

    A database of that name that carries the mark (left by an earlier run) is dropped and
    created again; any other is refused with ``ValidationError`` and nothing is dropped.
    """
    with psycopg.connect(server_url, autocommit=True) as conn:
        row = conn.execute(query("bench_database_comment"), {"name": name}).fetchone()
        if row is not None and row[0] != SCRATCH_MARK:
            raise ValidationError(
                f"database {name} exists and was not created by awa bench (it lacks the "
                f"comment {SCRATCH_MARK!r}); awa bench drops no such database: choose "
                "another --scratch-database, or leave the option out for a fresh one"
            )
        if row is not None:
            conn.execute(_database_statement("bench_drop_database", name))
        conn.execute(_database_statement("bench_create_database", name))
        try:
            mark = pgsql.Literal(SCRATCH_MARK)
            conn.execute(_database_statement("bench_mark_database", name, mark=mark))
        except BaseException:
            _drop(server_url, name)
            raise
    try:
        yield psycopg.conninfo.make_conninfo(server_url, dbname=name)
    finally:
        _drop(server_url, name)


async def bench_enqueue(client: awa.AsyncClient, jobs: int, progress: Progress) -> Result:
    """Sequential single inserts, each its own transaction. Bare INSERTs (the baseline) run
    between chunks of them, so both rates come from the same minutes of a noisy machine."""
    await reset(client)
    task = progress.add_task("enqueue one by one", total=jobs)
    latencies = []
    elapsed = raw_elapsed = 0.0
    raw_count = 0
    async with client.connection() as raw_conn:
        for chunk in range(0, jobs, ENQUEUE_CHUNK):
            began = time.perf_counter()
            for n in range(chunk, min(chunk + ENQUEUE_CHUNK, jobs)):
                before = time.perf_counter()
                await client.insert(Noop(n))
                latencies.append(time.perf_counter() - before)
            elapsed += time.perf_counter() - began
            began = time.perf_counter()
            for _ in range(ENQUEUE_CHUNK // 4):
                await raw_conn.execute(query("bench_raw_insert"))
            raw_elapsed += time.perf_counter() - began
            raw_count += ENQUEUE_CHUNK // 4
            progress.update(task, completed=min(chunk + ENQUEUE_CHUNK, jobs))
    concurrent = await _concurrent_insert_rate(client, jobs, PRODUCERS)
    return Result(
        "enqueue",
        jobs,
        elapsed,
        {
            "p50_ms": percentile(latencies, 0.5) * 1e3,
            "p99_ms": percentile(latencies, 0.99) * 1e3,
            "raw_sql_per_second": raw_count / raw_elapsed,
            f"producers_{PRODUCERS}_per_second": concurrent,
        },
    )


# Inserts through awa between two runs of bare INSERTs (a quarter as many) in the enqueue
# scenario.
ENQUEUE_CHUNK = 500


# Producers of the concurrent enqueue figure: one-by-one inserts from this many tasks at once
# (a web application's request handlers), whose commits the server flushes together.
PRODUCERS = 8


async def _concurrent_insert_rate(client: awa.AsyncClient, jobs: int, producers: int) -> float:
    await reset(client)
    share = max(1, jobs // producers)

    async def produce() -> None:
        for n in range(share):
            await client.insert(Noop(n))

    started = time.perf_counter()
    await asyncio.gather(*(produce() for _ in range(producers)))
    return share * producers / (time.perf_counter() - started)


async def bench_copy(client: awa.AsyncClient, jobs: int, progress: Progress) -> Result:
    """One ``insert_many_copy`` of every job."""
    await reset(client)
    task = progress.add_task("bulk COPY", total=jobs)
    batch = [Noop(n) for n in range(jobs)]
    started = time.perf_counter()
    await client.insert_many_copy(batch)
    elapsed = time.perf_counter() - started
    progress.update(task, completed=jobs)
    await reset(client)
    raw = await _raw_copy_rate(client, jobs)
    return Result("copy", jobs, elapsed, {"raw_copy_per_second": raw})


async def _raw_copy_rate(client: awa.AsyncClient, count: int) -> float:
    """The same COPY of rows formatted in advance, in one write (no validation, no per-job
    work in Python): what the server allows, for comparison."""
    async with client.connection() as conn:
        started = time.perf_counter()
        async with conn.transaction():
            cursor = await conn.execute(query("copy_reserve_ids"), {"count": count})
            row = await cursor.fetchone()
            assert row is not None
            now, slot, ids = row[0].isoformat(), row[1], row[2]
            formatting = time.perf_counter()
            data = "".join(
                f'{job_id}\traw\tdefault\t{{"n": {job_id}}}\tavailable\t2\t25\t{now}\t{now}'
                f"\t{{}}\t{{}}\t\\N\t\\N\t\\N\t{slot}\n"
                for job_id in ids
            )
            started += time.perf_counter() - formatting  # not counted: done in advance
            async with conn.cursor() as copy_cursor, copy_cursor.copy(query("copy_jobs")) as copy:
                await copy.write(data)
        return count / (time.perf_counter() - started)


async def bench_latency(
    url: str, rate: float, seconds: float, concurrency: int, progress: Progress
) -> Result:
    """Insert at a fixed rate while a worker runs; percentiles of the time from the insert
    call to the handler's start (``p50_ms``...), and from the insert's commit returning to
    the handler's start (``commit_p50_ms``...; the insert's own commit, a disk flush, is the
    larger part of the first)."""
    client = awa.AsyncClient(url, application_name="awa-bench")
    latencies: list[float] = []
    started: dict[int, float] = {}
    committed: dict[int, float] = {}
    try:
        await reset(client)

        @client.task(Timed)
        async def timed(job: awa.Job[Timed]) -> None:
            now = time.time()
            started[job.args.n] = now
            latencies.append(now - job.args.sent_at)

        total = int(rate * seconds)
        task = progress.add_task(f"latency at {rate:g}/s", total=total)
        async with client.run({"default": {"max_workers": concurrency}}):
            producer = awa.AsyncClient(url, application_name="awa-bench-producer")
            try:
                start = time.perf_counter()
                for n in range(total):
                    delay = start + n / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await producer.insert(Timed(n, time.time()))
                    committed[n] = time.time()
                    progress.update(task, completed=n + 1)
                deadline = time.monotonic() + 30
                while len(latencies) < total and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                await producer.close()
        await reset(client)
        floor, floor_after_commit = await _latency_floor(url, rate, seconds)
        ms = [value * 1e3 for value in latencies]
        # A job can start before its producer sees the commit return: count that as zero.
        after_commit = [
            max(0.0, started[n] - committed[n]) * 1e3 for n in started if n in committed
        ]
        return Result(
            "latency",
            len(ms),
            seconds,
            {
                "rate": rate,
                "p50_ms": percentile(ms, 0.5),
                "p95_ms": percentile(ms, 0.95),
                "p99_ms": percentile(ms, 0.99),
                "commit_p50_ms": percentile(after_commit, 0.5),
                "commit_p99_ms": percentile(after_commit, 0.99),
                "floor_p50_ms": percentile(floor, 0.5),
                "floor_p99_ms": percentile(floor, 0.99),
                "floor_commit_p50_ms": percentile(floor_after_commit, 0.5),
                "floor_commit_p99_ms": percentile(floor_after_commit, 0.99),
            },
        )
    finally:
        await client.close()


async def _latency_floor(url: str, rate: float, seconds: float) -> tuple[list[float], list[float]]:
    """Milliseconds from an insert call, and from its commit returning, to the return of the
    claim that took the job, for bare statements at the same rate: one connection inserts,
    one listens, one claims (with the worker's claim statement), all on this event loop, no
    handler and no completion. What this machine allows, for comparison with awa's figures."""
    connect = functools.partial(
        psycopg.AsyncConnection.connect, url, **connection_kwargs("awa-bench-floor")
    )
    sent: dict[int, float] = {}
    committed: dict[int, float] = {}
    claimed: dict[int, float] = {}
    lanes = LanePositions()
    claim = claim_statement(lanes.start_claim(), 16)  # every lane (see worker/lanes.py)
    params = {
        "queue": "default",
        "limit": 16,
        "deadline": dt.timedelta(minutes=5),
        "kinds": ["raw"],  # bench_raw_insert_returning's
        **lanes.params(),  # from their heads
    }
    async with await connect() as producer, await connect() as listener, await connect() as worker:
        await listener.execute(query("listen_channels"))

        stop = asyncio.Event()

        async def claim_on_notify() -> None:
            # Short listening windows, so that it stops between claims (cancelling a claim in
            # flight would make psycopg cancel the query and warn).
            while not stop.is_set():
                async for _ in listener.notifies(timeout=0.05):
                    cursor = await worker.execute(claim, params)
                    rows = await cursor.fetchall()
                    now = time.perf_counter()
                    claimed.update((row[0], now) for row in rows)

        claimer = asyncio.create_task(claim_on_notify())
        total = int(rate * seconds)
        start = time.perf_counter()
        for n in range(total):
            delay = start + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            before = time.perf_counter()
            cursor = await producer.execute(query("bench_raw_insert_returning"))
            row = await cursor.fetchone()
            assert row is not None
            committed[row[0]] = time.perf_counter()
            sent[row[0]] = before
        deadline = time.monotonic() + 5
        while len(claimed) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        await claimer
    done = [job_id for job_id in claimed if job_id in sent]
    # A claim can return before the producer sees its commit return: count that as zero.
    from_call = [(claimed[job_id] - sent[job_id]) * 1e3 for job_id in done]
    from_commit = [max(0.0, claimed[job_id] - committed[job_id]) * 1e3 for job_id in done]
    return from_call or [math.nan], from_commit or [math.nan]


async def _own_client(
    url: str,
    scenario: Callable[[awa.AsyncClient, int, Progress], Awaitable[Result]],
    jobs: int,
    progress: Progress,
) -> Result:
    """Run a producer scenario on a client of its own, closed at its end: a backend reports
    its commits when it exits (or when idle for a while), and a pool kept open would report
    them in the middle of a later scenario's commits per job."""
    async with awa.AsyncClient(url, application_name="awa-bench") as client:
        return await scenario(client, jobs, progress)


def _median(results: list[Result]) -> Result:
    """The run with the median rate, its numeric extras replaced by each one's median (the
    others, such as pinned-horizon's windows, are the median run's)."""
    ordered = sorted(results, key=lambda result: result.rate)
    middle = ordered[len(ordered) // 2]
    extras = {
        key: (
            statistics.median(result.extra[key] for result in results)
            if isinstance(value, int | float)
            else value
        )
        for key, value in middle.extra.items()
    }
    return Result(middle.scenario, middle.jobs, middle.seconds, extras)


PINNED = ("pinned-horizon", "drain-pinned")
SCENARIOS = ("enqueue", "copy", *DRAIN_VARIANTS, "latency", *PINNED, "soak")
DEFAULT_SCENARIOS = ("enqueue", "copy", *DRAIN_VARIANTS, "latency")
"""What runs without --only: the pinned scenarios and the soak take minutes each, so they
run when asked."""


async def run_bench(
    url: str,
    *,
    scenarios: tuple[str, ...],
    jobs: int,
    concurrency: int,
    rate: float,
    seconds: float,
    runs: int,
    console: Console,
    pinned: PinnedHorizonOptions | None = None,
    soak: SoakOptions | None = None,
) -> dict[str, dict[str, Any]]:
    async with awa.AsyncClient(url, application_name="awa-bench") as client:
        await client.migrate()
    report: dict[str, dict[str, Any]] = {}
    plans: dict[str, Callable[[Progress], Awaitable[Result]]] = {
        "enqueue": lambda progress: _own_client(url, bench_enqueue, jobs, progress),
        "copy": lambda progress: _own_client(url, bench_copy, jobs, progress),
        **{
            variant: functools.partial(bench_drain, url, jobs, concurrency, variant=variant)
            for variant in DRAIN_VARIANTS
        },
        "latency": lambda progress: bench_latency(url, rate, seconds, concurrency, progress),
        "pinned-horizon": lambda progress: bench_pinned_horizon(
            url, concurrency, pinned or PinnedHorizonOptions(), progress
        ),
        "drain-pinned": lambda progress: bench_drain_pinned(url, jobs, concurrency, progress),
        "soak": lambda progress: bench_soak(
            url, jobs, concurrency, soak or SoakOptions(), progress
        ),
    }
    results: dict[str, list[Result]] = {name: [] for name in scenarios}
    with Progress(console=console, transient=True) as progress:
        # Round by round, every scenario once per round: a drain variant is compared with
        # the plain drain of its own round, minutes apart at most.
        for _ in range(runs):
            for name in scenarios:
                results[name].append(await plans[name](progress))
    for name in scenarios:
        median = _median(results[name])
        report[name] = {
            "jobs_per_second": median.rate,
            "runs": [round(result.rate, 1) for result in results[name]],
            "jobs": median.jobs,
            **median.extra,
        }
        if name.startswith("drain-") and name not in PINNED and "drain" in results:
            ratios = [
                variant.rate / plain.rate
                for variant, plain in zip(results[name], results["drain"], strict=True)
            ]
            report[name]["ratio_to_drain"] = statistics.median(ratios)
    return report


_POSITIVE_INT = click.IntRange(min=1)
_POSITIVE_FLOAT = click.FloatRange(min=0, min_open=True)


@main.command()
@click.option(
    "--jobs", type=_POSITIVE_INT, default=20_000, show_default=True, help="Jobs per scenario."
)
@click.option(
    "--scratch-database",
    "database_name",
    metavar="NAME",
    help="Work in this database instead of a fresh awa_bench_<random hex>. It is created "
    "(or, if an earlier awa bench run created it, recreated) and dropped at the end; a "
    "database awa bench did not create is refused.",
)
@click.option(
    "--concurrency",
    type=_POSITIVE_INT,
    default=16,
    show_default=True,
    help="Handlers at once (drain, latency).",
)
@click.option(
    "--rate",
    type=_POSITIVE_FLOAT,
    default=200.0,
    show_default=True,
    help="Offered jobs/s (latency).",
)
@click.option(
    "--seconds",
    type=_POSITIVE_FLOAT,
    default=10.0,
    show_default=True,
    help="Duration of the latency run.",
)
@click.option(
    "--runs",
    type=_POSITIVE_INT,
    default=3,
    show_default=True,
    help="Runs per scenario; median shown.",
)
@click.option(
    "--only",
    type=click.Choice(SCENARIOS),
    multiple=True,
    help="Run only these scenarios (repeatable). Default: all but pinned-horizon, "
    "drain-pinned and soak.",
)
@click.option(
    "--offered-rate",
    type=_POSITIVE_FLOAT,
    default=800.0,
    show_default=True,
    help="Offered jobs/s (pinned-horizon).",
)
@click.option(
    "--pin-seconds",
    type=_POSITIVE_FLOAT,
    default=300.0,
    show_default=True,
    help="How long the snapshot stays pinned (pinned-horizon).",
)
@click.option(
    "--phase-seconds",
    type=_POSITIVE_FLOAT,
    default=60.0,
    show_default=True,
    help="Duration of the clean and the recover phase (pinned-horizon).",
)
@click.option(
    "--window-seconds",
    type=_POSITIVE_FLOAT,
    default=10.0,
    show_default=True,
    help="Length of each reported window (pinned-horizon, soak).",
)
@click.option(
    "--soak-seconds",
    type=_POSITIVE_FLOAT,
    default=1800.0,
    show_default=True,
    help="Duration of the soak.",
)
@click.option(
    "--soak-rate",
    type=_POSITIVE_FLOAT,
    help="Offered jobs/s of the soak. Default: half of a drain of the soak's own jobs, "
    "measured first.",
)
@click.option(
    "--soak-retention",
    type=_POSITIVE_FLOAT,
    default=60.0,
    show_default=True,
    help="Seconds the soak's worker keeps completed jobs.",
)
@json_option
@click.pass_context
def bench(
    ctx: click.Context,
    jobs: int,
    database_name: str | None,
    concurrency: int,
    rate: float,
    seconds: float,
    runs: int,
    only: tuple[str, ...],
    offered_rate: float,
    pin_seconds: float,
    phase_seconds: float,
    window_seconds: float,
    soak_seconds: float,
    soak_rate: float | None,
    soak_retention: float,
    as_json: bool,
) -> None:
    """Benchmark enqueue, bulk COPY, drain throughput and latency.

    Works only in a scratch database it creates on the configured server and drops at the
    end, also on an error or Ctrl-C: your jobs and databases are never touched.
    """
    scenarios = only or DEFAULT_SCENARIOS
    sdk_scenarios = [name for name in scenarios if name in SDK_VARIANTS]
    if sdk_scenarios and only:
        require_extra("metrics", f"awa bench --only {sdk_scenarios[0]}")
    elif sdk_scenarios and not has_extra("metrics"):
        scenarios = tuple(name for name in scenarios if name not in SDK_VARIANTS)
        skipped = " and ".join(sdk_scenarios)
        click.echo(f"awa bench: skipping {skipped}: {missing_extra('metrics', 'each')}", err=True)
    if "latency" in scenarios and rate * seconds < 1:
        raise click.BadParameter(
            f"--rate x --seconds is {rate * seconds:g}: the latency run needs at least 1 job",
            param_hint="'--rate' / '--seconds'",
        )
    name = scratch_database_name(database_name)
    console = Console(stderr=True)
    server = resolve_database_url(database_url_from_context(ctx))
    with scratch_database(server, name) as url:
        click.echo(
            f"awa bench: working in the scratch database {name} on {redact(server)} "
            "(dropped at the end)",
            err=True,
        )
        report = asyncio.run(
            run_bench(
                url,
                scenarios=scenarios,
                jobs=jobs,
                concurrency=concurrency,
                rate=rate,
                seconds=seconds,
                runs=runs,
                console=console,
                pinned=PinnedHorizonOptions(
                    offered_rate=offered_rate,
                    pin_seconds=pin_seconds,
                    phase_seconds=phase_seconds,
                    window_seconds=window_seconds,
                ),
                soak=SoakOptions(
                    seconds=soak_seconds,
                    rate=soak_rate,
                    retention=soak_retention,
                    window_seconds=window_seconds,
                ),
            )
        )
    if as_json:
        print_json(report)
        return
    rows = []
    for name, figures in report.items():
        details = ", ".join(
            f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
            for key, value in figures.items()
            if key not in ("jobs_per_second", "runs", "jobs") and not isinstance(value, list | dict)
        )
        rows.append([name, f"{figures['jobs_per_second']:,.0f}", figures["jobs"], details])
    print_table(["SCENARIO", "JOBS/S (MEDIAN)", "JOBS", "DETAILS"], rows)
