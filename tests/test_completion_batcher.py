"""The completion batcher: batches with follow-ups flush side by side (one plans its
follow-ups while the other waits on the database), plain ones one at a time, and a batch
whose flush fails for a database reason is retried until it commits, losing nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

from awa.worker.completer import CompletionBatcher, Done, Pending
from helpers_worker import wait_for

ITEMS = 12


class FlushLog:
    """A flush on the real database that records how many ran at once and what each
    committed; the first ``failures`` flushes fail with a database error."""

    def __init__(self, failures: int = 0) -> None:
        self.running = 0
        self.most_at_once = 0
        self.failures = failures
        self.reported: list[Any] = []

    async def flush(self, conn: psycopg.AsyncConnection[Any], batch: list[Pending]) -> list[Done]:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            if self.failures:
                self.failures -= 1
                await conn.execute("SELECT 1 / 0")  # a real error from the server
            await conn.execute("SELECT pg_sleep(0.05)")
        finally:
            self.running -= 1
        return [Done(job, duration, 1.0) for job, duration in batch]

    def on_done(self, done: list[Done]) -> None:
        self.reported.extend(item.job for item in done if item.finalized_at is not None)


def connector(database_url: str) -> Callable[[], Any]:
    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            yield conn

    return connect


def batcher(
    database_url: str, log: FlushLog, may_overlap: Callable[[list[Pending]], bool]
) -> CompletionBatcher:
    return CompletionBatcher(
        connector(database_url),
        batch_size=2,
        linger=0.0,
        on_done=log.on_done,
        flush=log.flush,
        may_overlap=may_overlap,
    )


async def run_all(completer: CompletionBatcher, log: FlushLog) -> None:
    completer.start()
    for n in range(ITEMS):
        completer.add(n, 0.0)  # type: ignore[arg-type]  # the flush never reads the job
    await wait_for(lambda: len(log.reported) >= ITEMS, 10.0)
    await completer.close()


async def test_batches_with_follow_ups_flush_side_by_side(database_url: str) -> None:
    log = FlushLog()
    await run_all(batcher(database_url, log, lambda batch: True), log)
    assert log.most_at_once == 2
    assert sorted(log.reported) == list(range(ITEMS))


async def test_plain_batches_flush_one_at_a_time(database_url: str) -> None:
    log = FlushLog()
    await run_all(batcher(database_url, log, lambda batch: False), log)
    assert log.most_at_once == 1
    assert sorted(log.reported) == list(range(ITEMS))


async def test_a_failed_flush_is_retried_and_loses_nothing(database_url: str) -> None:
    """Two flushes fail while others are in flight: their batches go back to the queue and
    commit later; every completion is reported once."""
    log = FlushLog(failures=2)
    await run_all(batcher(database_url, log, lambda batch: True), log)
    assert sorted(log.reported) == list(range(ITEMS))


async def test_close_gives_back_what_no_flush_committed(database_url: str) -> None:
    """A flush that never finishes is cancelled at close(): its completions are reported as
    not applied (they stay running for rescue), none as committed."""
    reported: list[Done] = []
    started = asyncio.Event()

    async def hang(conn: psycopg.AsyncConnection[Any], batch: list[Pending]) -> list[Done]:
        started.set()
        await asyncio.Event().wait()  # never set: only close() ends it, by cancelling it
        return []

    completer = CompletionBatcher(
        connector(database_url),
        batch_size=2,
        linger=0.0,
        on_done=reported.extend,
        flush=hang,
        may_overlap=lambda batch: True,
    )
    completer.start()
    for n in range(4):
        completer.add(n, 0.0)  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), 5.0)
    await completer.close(timeout=0.2)
    assert sorted(item.job for item in reported) == [0, 1, 2, 3]  # type: ignore[type-var]
    assert all(item.finalized_at is None for item in reported)
