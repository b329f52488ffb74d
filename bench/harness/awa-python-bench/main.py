"""awa (Python) as a long-running adapter of the cross-system queue benchmark harness
(hardbyte/postgresql-job-queue-benchmarking, its ``long_horizon`` scenario).

The harness starts this process with its settings in the environment (``DATABASE_URL``,
``PRODUCER_RATE``, ``WORKER_COUNT``, ...), reads JSON lines from its stdout (one descriptor,
then one record per metric every ``SAMPLE_EVERY_S``) and stops it with SIGTERM. The process
migrates awa, inserts jobs at the offered rate through ``insert_many``, works them with
``WORKER_COUNT`` handlers of ``JOB_WORK_MS`` each, and reports claim latency (insert call to
handler start), enqueue and completion rates and the queue depth. Logs go to stderr.

Pacing: with ``PRODUCER_PACING=harness`` the harness writes ``ENQUEUE <n>`` lines to stdin
and each becomes one insert of n jobs; otherwise the producer paces itself, crediting the
offered rate on the wall-clock time that really passed (a slow insert is made up at the next
tick, never lost) and inserting at most ``PRODUCER_BATCH_MAX`` jobs per call every
``PRODUCER_BATCH_MS``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import awa
from awa.storage.migrations import current_migration_version

HERE = Path(__file__).resolve().parent
MANIFEST = json.loads((HERE / "adapter.json").read_text())
SYSTEM: str = MANIFEST["system"]
QUEUE = "harness"
LATENCY_WINDOW_S = 30
DEPTH_SQL = "SELECT count(*) FROM awa.active_jobs WHERE state = 'available' AND queue = %s"


@dataclasses.dataclass
class HarnessJob:
    sent_at: float  # time.time() when the insert was called
    padding: str


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    rate: float
    batch_max: int
    batch_ms: int
    workers: int
    work_ms: float
    payload_bytes: int
    sample_every_s: int
    harness_pacing: bool
    rate_file: str | None
    instance_id: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        def number(name: str, default: float, minimum: float) -> float:
            try:
                value = float(env.get(name) or default)
            except ValueError:
                raise SystemExit(f"{SYSTEM}: {name}={env[name]!r} is not a number") from None
            if not value >= minimum:
                raise SystemExit(f"{SYSTEM}: {name}={value} is below {minimum}")
            return value

        scenario = env.get("SCENARIO", "long_horizon")
        mode = env.get("PRODUCER_MODE", "fixed")
        if scenario != "long_horizon" or mode != "fixed":
            raise SystemExit(
                f"{SYSTEM}: only SCENARIO=long_horizon with PRODUCER_MODE=fixed is supported "
                f"(got {scenario!r}, {mode!r})"
            )
        if not env.get("DATABASE_URL"):
            raise SystemExit(f"{SYSTEM}: DATABASE_URL is not set")
        return cls(
            database_url=env["DATABASE_URL"],
            rate=number("PRODUCER_RATE", 800, 0),
            batch_max=int(number("PRODUCER_BATCH_MAX", 128, 1)),
            batch_ms=int(number("PRODUCER_BATCH_MS", 25, 1)),
            workers=int(number("WORKER_COUNT", 32, 1)),
            work_ms=number("JOB_WORK_MS", 1, 0),
            payload_bytes=int(number("JOB_PAYLOAD_BYTES", 256, 0)),
            sample_every_s=int(number("SAMPLE_EVERY_S", 5, 1)),
            harness_pacing=env.get("PRODUCER_PACING", "adapter") == "harness",
            rate_file=env.get("PRODUCER_RATE_CONTROL_FILE") or None,
            instance_id=int(number("BENCH_INSTANCE_ID", 0, 0)),
        )


class RollingLatency:
    """Percentiles of the last ``window_s`` seconds with bounded memory: one sparse
    histogram per second, log buckets 0.2 % wide (three significant figures), so memory
    depends on the window and the spread of latencies, not on the job rate."""

    FLOOR_MS = 0.001
    STEP = math.log(1.002)

    def __init__(self, window_s: int = LATENCY_WINDOW_S) -> None:
        self._window_s = window_s
        self._seconds: collections.deque[tuple[int, collections.Counter[int]]] = collections.deque()

    def record(self, ms: float, now: float) -> None:
        second = int(now)
        if not self._seconds or self._seconds[-1][0] != second:
            self._seconds.append((second, collections.Counter()))
            self._expire(now)
        bucket = int(math.log(max(ms, self.FLOOR_MS) / self.FLOOR_MS) / self.STEP)
        self._seconds[-1][1][bucket] += 1

    def percentiles(self, fractions: tuple[float, ...], now: float) -> list[float] | None:
        self._expire(now)
        merged: collections.Counter[int] = collections.Counter()
        for _, counts in self._seconds:
            merged.update(counts)
        total = sum(merged.values())
        if not total:
            return None
        ordered = sorted(merged.items())
        result = []
        for fraction in fractions:
            rank, seen = max(1, math.ceil(fraction * total)), 0
            for bucket, count in ordered:
                seen += count
                if seen >= rank:
                    # The bucket's geometric middle.
                    result.append(self.FLOOR_MS * math.exp((bucket + 0.5) * self.STEP))
                    break
        return result

    def _expire(self, now: float) -> None:
        while self._seconds and self._seconds[0][0] <= int(now) - self._window_s:
            self._seconds.popleft()


def emit(record: Mapping[str, object]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def revision() -> str:
    """awa's version and, when it runs from a git checkout, the commit."""
    found = subprocess.run(
        ["git", "-C", str(Path(awa.__file__).parent), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    commit = found.stdout.strip()
    return f"{awa.__version__}+{commit}" if found.returncode == 0 and commit else awa.__version__


def offered_rate(settings: Settings) -> float:
    """The rate in the harness's control file (its high-load phases), else the setting."""
    if settings.rate_file:
        try:
            return float(Path(settings.rate_file).read_text().strip())
        except (OSError, ValueError):
            pass
    return settings.rate


class Adapter:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = awa.AsyncClient(
            settings.database_url, application_name=f"awa-python-bench-{settings.instance_id}"
        )
        self.latency = RollingLatency()
        self.enqueued = 0
        self.target_rate = settings.rate
        self.failed = False
        self._padding = "x" * settings.payload_bytes

        @self.client.task(HarnessJob, queue=QUEUE)
        async def work(job: awa.Job[HarnessJob]) -> None:
            self.latency.record((time.time() - job.args.sent_at) * 1e3, time.monotonic())
            if settings.work_ms:
                await asyncio.sleep(settings.work_ms / 1e3)

    async def insert(self, count: int) -> None:
        sent_at = time.time()
        jobs = [HarnessJob(sent_at, self._padding) for _ in range(count)]
        try:
            await self.client.insert_many(jobs, queue=QUEUE)
        except Exception as exc:  # a failed insert is reported and the stream goes on
            print(f"[{SYSTEM}] insert of {count} jobs failed: {exc!r}", file=sys.stderr)
            await asyncio.sleep(0.1)
            return
        self.enqueued += count

    async def pace(self) -> None:
        """Insert what the offered rate owes for the time that really passed."""
        period = self.settings.batch_ms / 1e3
        credit, last, rate_read = 0.0, time.monotonic(), -math.inf
        while True:
            await asyncio.sleep(max(0.0, period - (time.monotonic() - last)))
            now = time.monotonic()
            if now - rate_read >= 1.0:
                self.target_rate, rate_read = offered_rate(self.settings), now
            credit += self.target_rate * (now - last)
            last = now
            while credit >= 1.0:
                count = min(int(credit), self.settings.batch_max)
                credit -= count
                await self.insert(count)

    async def follow_harness(self) -> None:
        """Insert what each ``ENQUEUE <n>`` line on stdin asks for, until stdin closes."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            word, _, count = line.decode().strip().partition(" ")
            if word == "ENQUEUE" and count.isdigit():
                await self.insert(min(int(count), self.settings.batch_max))

    async def depth(self) -> int:
        async with self.client.connection() as conn:
            cursor = await conn.execute(DEPTH_SQL, (QUEUE,))
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def sample(self) -> None:
        """Every SAMPLE_EVERY_S, on wall-clock multiples of it, one record per metric."""
        every = self.settings.sample_every_s
        runtime = self.client.runtime
        assert runtime is not None
        enqueued, completed, last = self.enqueued, runtime.completed, time.monotonic()
        while True:
            await asyncio.sleep(every - time.time() % every)
            now = time.monotonic()
            elapsed, last = now - last, now
            values: list[tuple[str, float, float]] = [
                ("enqueue_rate", (self.enqueued - enqueued) / elapsed, every),
                ("completion_rate", (runtime.completed - completed) / elapsed, every),
            ]
            enqueued, completed = self.enqueued, runtime.completed
            found = self.latency.percentiles((0.5, 0.95, 0.99), now)
            if found:  # nothing started in the window: no percentile to report
                for name, ms in zip(("p50", "p95", "p99"), found, strict=True):
                    values.append((f"claim_{name}_ms", ms, LATENCY_WINDOW_S))
            if self.settings.instance_id == 0:  # one replica observes the shared queue
                try:
                    values.append(("queue_depth", await self.depth(), 0))
                except Exception as exc:
                    print(f"[{SYSTEM}] queue depth failed: {exc!r}", file=sys.stderr)
                values.append(("producer_target_rate", self.target_rate, 0))
            stamp = now_iso()
            for metric, value, window in values:
                emit(
                    {
                        "t": stamp,
                        "system": SYSTEM,
                        "kind": "adapter",
                        "subject_kind": "adapter",
                        "subject": "",
                        "metric": metric,
                        "value": round(value, 3),
                        "window_s": window,
                        "instance_id": self.settings.instance_id,
                    }
                )

    async def guard(self, job: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
        """A producer or sampler that fails stops the run (a silent one would skew it)."""
        try:
            await job
        except Exception as exc:
            print(f"[{SYSTEM}] stopping: {exc!r}", file=sys.stderr)
            self.failed = True
            stop.set()

    async def run(self, stop: asyncio.Event) -> None:
        await self.client.migrate()
        emit(
            {
                "kind": "descriptor",
                "system": SYSTEM,
                "event_tables": MANIFEST["event_tables"],
                "extensions": MANIFEST["extensions"],
                "version": revision(),
                "schema_version": str(current_migration_version()),
                "db_name": urlsplit(self.settings.database_url).path.lstrip("/"),
                "started_at": now_iso(),
            }
        )
        await self.client.start({QUEUE: self.settings.workers})
        produce = self.follow_harness if self.settings.harness_pacing else self.pace
        tasks = [asyncio.create_task(self.guard(job, stop)) for job in (produce(), self.sample())]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.shutdown(2.0)
            await self.client.close()


async def main() -> None:
    settings = Settings.from_env(os.environ)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    adapter = Adapter(settings)
    await adapter.run(stop)
    print(f"[{SYSTEM}] stopped", file=sys.stderr)
    if adapter.failed:
        raise SystemExit(1)


if __name__ == "__main__":
    asyncio.run(main())
