"""``awa bench --only soak``: a long steady load with a short completed retention, to show
that throughput stays flat and the job tables stop growing once retention starts dropping
what completed.

The offered rate is ``--soak-rate``, or half of the capacity measured first: a drain of
``--jobs`` of the soak's own jobs by the soak's own worker (a no-op drain runs several times
faster than 1 ms handlers can, and half of it would overload the worker from the start).
Jobs are those of pinned-horizon (an async sleep of 1 ms, ``--concurrency`` at once); the
producer runs in the worker's process, as in pinned-horizon. The worker keeps
completed jobs ``--soak-retention`` seconds. Every ``--window-seconds`` it records
throughput, latency p50/p99 (insert to handler start), queue depth, dead tuples and the
bytes of each job table and its indexes. The summary compares the last third of the run
with the first: throughput, and the largest size each table reached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row
from rich.progress import Progress

from awa.cli.bench_drain import QUEUE, Result, reset
from awa.cli.bench_pinned import (
    Paced,
    PacedProducer,
    median_of,
    paced_client,
    window_figures,
)
from awa.sql import query


@dataclasses.dataclass(frozen=True, slots=True)
class SoakOptions:
    seconds: float = 1800.0
    rate: float | None = None
    """Offered jobs/s; None: half of a plain drain measured first."""
    retention: float = 60.0
    window_seconds: float = 10.0


async def table_sizes(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """Bytes of each job table and the tables beside it, indexes included."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("bench_table_sizes"))
        return {
            row["home"]: int(row["table_bytes"]) + int(row["index_bytes"])
            for row in await cursor.fetchall()
        }


async def bench_soak(
    url: str, jobs: int, concurrency: int, options: SoakOptions, progress: Progress
) -> Result:
    """The steady load for ``options.seconds`` (see the module docstring)."""
    client, started = paced_client(url)
    await reset(client)
    capacity = None
    rate = options.rate
    if rate is None:
        await client.pause_queue(QUEUE)
        await client.insert_many_copy([Paced(time.time()) for _ in range(jobs)])
    await client.start({QUEUE: {"max_workers": concurrency}}, completed_retention=options.retention)
    runtime = client.runtime
    assert runtime is not None
    if rate is None:
        drain_began = time.perf_counter()
        await client.resume_queue(QUEUE)
        while runtime.completed < jobs:
            await asyncio.sleep(0.01)
        capacity = jobs / (time.perf_counter() - drain_began)
        rate = capacity / 2
        started.clear()
    windows: list[dict[str, Any]] = []
    task = progress.add_task("soak", total=options.seconds)
    producer = PacedProducer(client, rate)
    began = time.time()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
            while (now := time.time()) < began + options.seconds - 1e-3:
                window_start, completed_before = now, runtime.completed
                await asyncio.sleep(min(options.window_seconds, began + options.seconds - now))
                window_end = time.time()
                figures = await window_figures(
                    watch, runtime.completed - completed_before, started, window_start, window_end
                )
                windows.append(
                    {
                        "t": round(window_end - began, 1),
                        **figures,
                        "bytes": await table_sizes(watch),
                    }
                )
                progress.update(task, completed=window_end - began)
    finally:
        await producer.stop()
        await client.close()
        progress.remove_task(task)
    return Result("soak", producer.inserted, options.seconds, _summary(windows, rate, capacity))


def _summary(windows: list[dict[str, Any]], rate: float, capacity: float | None) -> dict[str, Any]:
    third = max(1, len(windows) // 3)
    first, last = windows[:third], windows[-third:]

    def rate_of(part: list[dict[str, Any]]) -> float:
        return median_of([w["jobs_per_second"] for w in part])

    def largest(part: list[dict[str, Any]]) -> dict[str, int]:
        homes = {home for w in part for home in w["bytes"]}
        return {home: max(w["bytes"].get(home, 0) for w in part) for home in sorted(homes)}

    first_rate, last_rate = rate_of(first), rate_of(last)
    first_bytes, last_bytes = largest(first), largest(last)
    return {
        "offered_jobs_per_second": rate,
        "capacity_jobs_per_second": capacity,
        "first_third_jobs_per_second": first_rate,
        "last_third_jobs_per_second": last_rate,
        "throughput_ratio_last_to_first": last_rate / first_rate if first_rate else float("nan"),
        "first_third_p50_ms": median_of([w["p50_ms"] for w in first]),
        "last_third_p50_ms": median_of([w["p50_ms"] for w in last]),
        "first_third_largest_bytes": first_bytes,
        "last_third_largest_bytes": last_bytes,
        "total_bytes_ratio_last_to_first": sum(last_bytes.values()) / sum(first_bytes.values())
        if sum(first_bytes.values())
        else float("nan"),
        "windows": windows,
    }
