"""The scenarios of ``awa bench`` that pin the MVCC horizon, the way a long report, a backup
or an idle transaction on the application's database does: a ``REPEATABLE READ``
transaction holds its snapshot (and an xid) open, so vacuum can remove no row version
written since.

- ``pinned-horizon``: a steady offered load (``--offered-rate`` jobs/s, paced on the wall
  clock) worked by ``--concurrency`` handlers of 1 ms, in three phases: clean
  (``--phase-seconds``), pinned (``--pin-seconds``), recover (``--phase-seconds``). Every
  ``--window-seconds`` it reports throughput, claim latency (insert to handler start) p50
  and p99, queue depth and the dead tuples of each table the claim or the completion
  touches; each phase reports WAL bytes per job. The summary compares the pin's last
  minute with the clean phase.
- ``drain-pinned``: the plain drain, then the same number of jobs drained four times in a
  row under one pinned snapshot (nothing truncated between rounds; each round inserted and
  vacuumed like the plain drain's jobs, which under the pin removes no dead row): each
  round's rate and the fourth round's ratio to the unpinned drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.rows import dict_row
from rich.progress import Progress

import awa
from awa.cli.bench_drain import QUEUE, Noop, Result, bench_drain, drain_client, reset, stat
from awa.sql import query

HANDLER_SECONDS = 0.001
"""What each job of pinned-horizon does: an async sleep of 1 ms."""

PRODUCER_TICK = 0.01
"""Seconds between the producer's inserts; each inserts what the elapsed time owes."""

DRAIN_ROUNDS = 4


@dataclasses.dataclass
class Paced:
    sent_at: float


class PacedProducer:
    """Inserts ``rate`` jobs/s of ``Paced``, paced on the wall clock (each tick inserts what
    the elapsed time owes), from creation until ``stop()``."""

    def __init__(self, client: awa.AsyncClient, rate: float) -> None:
        self.inserted = 0
        self._client = client
        self._rate = rate
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._produce())

    async def _produce(self) -> None:
        credit = 0.0
        last = time.perf_counter()
        while not self._stopping.is_set():
            now = time.perf_counter()
            credit += (now - last) * self._rate
            last = now
            count = int(credit)
            if count:
                credit -= count
                sent = time.time()
                await self._client.insert_many([Paced(sent) for _ in range(count)])
                self.inserted += count
            await asyncio.sleep(PRODUCER_TICK)

    async def stop(self) -> None:
        self._stopping.set()
        await self._task


@dataclasses.dataclass(frozen=True, slots=True)
class PinnedHorizonOptions:
    offered_rate: float = 800.0
    pin_seconds: float = 300.0
    phase_seconds: float = 60.0
    window_seconds: float = 10.0


def paced_client(url: str) -> tuple[awa.AsyncClient, list[tuple[float, float]]]:
    """A client whose ``Paced`` handler takes ``HANDLER_SECONDS`` and appends (started at,
    latency from the insert) to the list returned with it."""
    client = awa.AsyncClient(url, application_name="awa-bench")
    started: list[tuple[float, float]] = []

    @client.task(Paced, queue=QUEUE)
    async def paced(job: awa.Job[Paced]) -> None:
        now = time.time()
        started.append((now, now - job.args.sent_at))
        await asyncio.sleep(HANDLER_SECONDS)

    return client, started


def latencies_between(
    started: list[tuple[float, float]], since: float, until: float
) -> list[float]:
    """The latencies of the handlers started in [since, until); drops those started before
    ``until`` from ``started``."""
    window = [latency for at, latency in started if since <= at < until]
    started[:] = [entry for entry in started if entry[0] >= until]
    return window


@contextlib.asynccontextmanager
async def pinned_snapshot(url: str) -> AsyncIterator[None]:
    """A REPEATABLE READ transaction with an xid and a snapshot, open until the block ends
    (it reads pg_class, not awa's tables, like a report on other tables would)."""
    async with await psycopg.AsyncConnection.connect(url, application_name="awa-bench-pin") as pin:
        await pin.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await pin.execute(query("bench_pin"))
        try:
            yield
        finally:
            await pin.rollback()


async def window_figures(
    watch: psycopg.AsyncConnection[Any],
    completed: int,
    started: list[tuple[float, float]],
    window_start: float,
    window_end: float,
) -> dict[str, Any]:
    """What a window of the pinned and soak scenarios reports: throughput, the latency
    (insert to handler start) of the jobs started in it, queue depth and dead tuples."""
    latencies = latencies_between(started, window_start, window_end)
    return {
        "jobs_per_second": completed / (window_end - window_start),
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "queue_depth": await stat(watch, "bench_queue_depth"),
        "dead_tuples": await dead_tuples(watch),
    }


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def dead_tuples(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("bench_dead_tuples_by_table"))
        return {row["home"]: int(row["dead"]) for row in await cursor.fetchall()}


async def _wal_lsn(conn: psycopg.AsyncConnection[Any]) -> str:
    return str(await stat(conn, "bench_wal_lsn"))


async def bench_pinned_horizon(
    url: str, concurrency: int, options: PinnedHorizonOptions, progress: Progress
) -> Result:
    """The steady load through clean, pinned and recover phases (see the module docstring)."""
    client, started = paced_client(url)
    await reset(client)
    phases = [
        ("clean", options.phase_seconds),
        ("pinned", options.pin_seconds),
        ("recover", options.phase_seconds),
    ]
    total = sum(seconds for _, seconds in phases)
    windows: list[dict[str, Any]] = []
    phase_wal: dict[str, float] = {}

    task = progress.add_task("pinned-horizon", total=total)
    await client.start({QUEUE: {"max_workers": concurrency}})
    runtime = client.runtime
    assert runtime is not None
    producer = PacedProducer(client, options.offered_rate)
    began = time.time()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
            for phase, seconds in phases:
                pin = pinned_snapshot(url) if phase == "pinned" else contextlib.nullcontext()
                async with pin:
                    lsn = await _wal_lsn(watch)
                    done_before = runtime.completed
                    phase_end = time.time() + seconds
                    while time.time() < phase_end - 1e-3:
                        window_start, completed_before = time.time(), runtime.completed
                        await asyncio.sleep(min(options.window_seconds, phase_end - time.time()))
                        window_end = time.time()
                        figures = await window_figures(
                            watch,
                            runtime.completed - completed_before,
                            started,
                            window_start,
                            window_end,
                        )
                        windows.append(
                            {
                                "phase": phase,
                                "t": round(window_end - began, 1),
                                "jobs_per_second": figures["jobs_per_second"],
                                "claim_p50_ms": figures["p50_ms"],
                                "claim_p99_ms": figures["p99_ms"],
                                "queue_depth": figures["queue_depth"],
                                "dead_tuples": figures["dead_tuples"],
                            }
                        )
                        progress.update(task, completed=window_end - began)
                    jobs = runtime.completed - done_before
                    cursor = await watch.execute(query("bench_wal_bytes_since"), {"lsn": lsn})
                    row = await cursor.fetchone()
                    phase_wal[phase] = float(row[0]) / jobs if row and jobs else float("nan")
    finally:
        await producer.stop()
        await client.close()
        progress.remove_task(task)
    return Result("pinned-horizon", producer.inserted, total, _summary(windows, phase_wal, options))


def _summary(
    windows: list[dict[str, Any]], phase_wal: dict[str, float], options: PinnedHorizonOptions
) -> dict[str, Any]:
    """The figures the targets are stated in, and every window."""

    def of(phase: str, key: str, last: int | None = None) -> list[float]:
        rows = [w[key] for w in windows if w["phase"] == phase]
        return rows[-last:] if last else rows

    last_minute = max(1, round(60 / options.window_seconds))
    median = median_of
    clean_p50, clean_p99 = median(of("clean", "claim_p50_ms")), median(of("clean", "claim_p99_ms"))
    pin_p50 = median(of("pinned", "claim_p50_ms", last_minute))
    pin_p99 = median(of("pinned", "claim_p99_ms", last_minute))
    active = [w["dead_tuples"].get("active_jobs", 0) for w in windows if w["phase"] == "pinned"]
    return {
        "offered_jobs_per_second": options.offered_rate,
        "clean_jobs_per_second": median(of("clean", "jobs_per_second")),
        "pinned_jobs_per_second": median(of("pinned", "jobs_per_second")),
        "recover_jobs_per_second": median(of("recover", "jobs_per_second")),
        "clean_claim_p50_ms": clean_p50,
        "clean_claim_p99_ms": clean_p99,
        "pinned_last_minute_claim_p50_ms": pin_p50,
        "pinned_last_minute_claim_p99_ms": pin_p99,
        "p50_ratio": pin_p50 / clean_p50 if clean_p50 else float("nan"),
        "p99_ratio": pin_p99 / clean_p99 if clean_p99 else float("nan"),
        "pinned_dead_tuples_active_max": max(active, default=0),
        "pinned_dead_tuples_active_last": active[-1] if active else 0,
        **{f"{phase}_wal_bytes_per_job": wal for phase, wal in phase_wal.items()},
        "windows": windows,
    }


def median_of(values: list[float]) -> float:
    values = [v for v in values if v == v]  # without NaN
    if not values:
        return float("nan")
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


async def bench_drain_pinned(url: str, jobs: int, concurrency: int, progress: Progress) -> Result:
    """The plain drain, then four drains of as many jobs under one pinned snapshot."""
    unpinned = await bench_drain(url, jobs, concurrency, progress)
    client = drain_client(url, "drain")
    rates: list[float] = []
    try:
        await reset(client)
        async with pinned_snapshot(url):
            await client.start({QUEUE: {"max_workers": concurrency}})
            runtime = client.runtime
            assert runtime is not None
            for round_ in range(DRAIN_ROUNDS):
                await client.pause_queue(QUEUE)
                await client.insert_many_copy([Noop(n) for n in range(jobs)])
                # As the plain drain does after its insert. Under the pin VACUUM removes no
                # dead row; it sets the new rows' hint bits and ANALYZE refreshes the
                # statistics (what autovacuum does on a live database), so that the rounds
                # differ from the unpinned drain by the pin alone. Without it they ran at
                # about 60 % of it with or without a pin.
                async with client.connection() as conn:
                    await conn.execute(query("bench_vacuum"))
                task = progress.add_task(f"drain-pinned round {round_ + 1}", total=jobs)
                target = runtime.completed + jobs
                began = time.perf_counter()
                await client.resume_queue(QUEUE)
                while (done := runtime.completed) < target:
                    progress.update(task, completed=done - (target - jobs))
                    await asyncio.sleep(0.01)
                rates.append(jobs / (time.perf_counter() - began))
                progress.remove_task(task)
            await client.close()
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await asyncio.sleep(1.2)  # stats of exited backends
                dead = await dead_tuples(conn)
    finally:
        await client.close()
    extra: dict[str, Any] = {
        "unpinned_jobs_per_second": unpinned.rate,
        **{f"round_{n + 1}_jobs_per_second": rate for n, rate in enumerate(rates)},
        "last_round_ratio_to_unpinned": rates[-1] / unpinned.rate,
        "dead_tuples": dead,
    }
    seconds = sum(jobs / rate for rate in rates)
    return Result("drain-pinned", DRAIN_ROUNDS * jobs, seconds, extra)
