"""The drain scenarios of ``awa bench``: pre-inserted no-op jobs run by one worker process
(or two), plain or with lifecycle work on every job.

- ``drain``: no-op handlers, nothing else (the baseline of the others).
- ``drain-hook``: one no-op lifecycle hook on the kind.
- ``drain-followup``: a ``Completed`` follow-up spec: every completion inserts a follow-up
  in its transaction.
- ``drain-staged``: every handler stages one follow-up with ``job.enqueue_on_completion``.
- ``drain-finalize``: every handler completes in its own transaction (``job.finalize()``,
  one statement standing for the business write): the opt-in path of docs/finalize.md,
  one transaction per job instead of the batched completion.
- ``drain-2proc``: ``drain`` with a second worker process on the same queue.
- ``drain-beside-limits``: ``drain`` while the worker also runs a queue with every
  fleet-wide limit (a queue without limits must not pay for them).
- ``drain-capped``: the queue has ``global_max_running=16``.
- ``drain-keys``: the jobs spread over 100 concurrency keys, ``key_concurrency=2``.
- ``drain-rated``: the queue has ``rate_limit=(2000, 200)``; ``rate_vs_limit`` says how
  close the drain came to the limit.
- ``drain-otel``: ``drain`` in a process with the OpenTelemetry SDK configured: a
  ``MeterProvider`` with the Prometheus reader (scraped once at the end) and a
  ``TracerProvider`` whose batch processor exports every span (to a sink). The jobs are
  inserted outside any trace, so their attempts start no spans (``awa.observability.tracing``).
- ``drain-otel-traced``: the same with every job inserted inside a span: each attempt is
  a span of that trace.
- ``drain-chain``: the jobs form 1,000 chains (each job depends on the one before it in its
  chain): every completion releases the next job, in its transaction.
- ``drain-fan-in``: the jobs form batches of 100 members and one fan-in job each
  (``insert_batch``): the last member's completion releases its fan-in job.

The jobs wait in a paused queue while the workers start; the clock starts when the queue is
resumed and stops when every job is committed as completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import time
from typing import Any

import psycopg
from rich.progress import Progress

import awa
from awa.sql import query

DRAIN_VARIANTS = (
    "drain",
    "drain-hook",
    "drain-followup",
    "drain-staged",
    "drain-finalize",
    "drain-2proc",
    "drain-beside-limits",
    "drain-capped",
    "drain-keys",
    "drain-rated",
    "drain-otel",
    "drain-otel-traced",
    "drain-chain",
    "drain-fan-in",
)
SDK_VARIANTS = ("drain-otel", "drain-otel-traced")
"""The drains that configure the OpenTelemetry SDK (the ``metrics`` extra)."""
CHAINS = 1000
BATCH = 100
FOLLOW_UP_QUEUE = "bench-followups"  # nobody works it: follow-ups stay put
QUEUE = "default"
LIMITED_QUEUE = "bench-limited"  # drain-beside-limits: limits on a queue with no jobs
CAP = 16
KEYS = 100
RATE = (2000.0, 200)


@dataclasses.dataclass
class Noop:
    n: int


@dataclasses.dataclass
class Echo:
    n: int


@dataclasses.dataclass
class Result:
    scenario: str
    jobs: int
    seconds: float
    # Figures beside the rate (numbers, except pinned-horizon's windows and dead tuples).
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


async def reset(client: awa.AsyncClient) -> None:
    async with client.connection() as conn:
        await conn.execute(query("bench_reset"))


async def stat(conn: psycopg.AsyncConnection[Any], name: str) -> Any:
    """The single value of the named bench query."""
    cursor = await conn.execute(query(name))
    row = await cursor.fetchone()
    return row[0] if row else None


def drain_client(url: str, variant: str) -> awa.AsyncClient:
    """A client whose Noop handler (and hooks or follow-ups) make ``variant``."""
    client = awa.AsyncClient(url, application_name="awa-bench")
    staged = variant == "drain-staged"
    finalize = variant == "drain-finalize"

    @client.task(Noop, queue=QUEUE)
    async def noop(job: awa.Job[Noop]) -> None:
        if staged:
            job.enqueue_on_completion(Echo(job.args.n), queue=FOLLOW_UP_QUEUE)
        elif finalize:
            async with job.finalize() as tx:
                await tx.execute("SELECT %s", job.id)

    if variant == "drain-hook":

        @client.on_event(Noop)
        async def observe(event: awa.JobEvent[Noop]) -> None:
            return None

    elif variant == "drain-followup":
        client.on_completed_enqueue_with(
            Noop, lambda args, job: awa.EnqueueRequest(Echo(args.n)).queue(FOLLOW_UP_QUEUE)
        )
    return client


def queues_of(variant: str, concurrency: int) -> dict[str, dict[str, Any]]:
    """``start()``'s queues for ``variant``."""
    options: dict[str, Any] = {"max_workers": concurrency}
    if variant == "drain-capped":
        options["global_max_running"] = CAP
    elif variant == "drain-keys":
        options["key_concurrency"] = 2
    elif variant == "drain-rated":
        options["rate_limit"] = RATE
    queues = {QUEUE: options}
    if variant == "drain-beside-limits":
        queues[LIMITED_QUEUE] = {
            "max_workers": 4,
            "rate_limit": (100.0, 10),
            "global_max_running": 2,
            "key_concurrency": 1,
        }
    return queues


def jobs_of(variant: str, jobs: int) -> list[Any]:
    if variant == "drain-keys":
        return [awa.EnqueueRequest(Noop(n)).concurrency_key(f"key-{n % KEYS}") for n in range(jobs)]
    return [Noop(n) for n in range(jobs)]


async def _insert_workflows(client: awa.AsyncClient, variant: str, jobs: int) -> None:
    """Insert the ``jobs`` jobs of ``variant`` as chains or batches, in one transaction (its
    commit must not count among the drain's)."""
    async with client.transaction() as tx:
        if variant == "drain-fan-in":
            remaining, n = jobs, 0
            while remaining > 1:
                size = min(BATCH, remaining - 1)
                await tx.insert_batch([Noop(n + k) for k in range(size)], on_complete=Noop(-1))
                remaining -= size + 1
                n += size
            if remaining:
                await tx.insert(Noop(n))
            return
        chains = min(CHAINS, jobs)
        for chain in range(chains):
            workflow = awa.Workflow(f"chain-{chain}")
            steps: list[awa.Step] = []
            for n in range(chain, jobs, chains):  # chain sizes differ by one at most
                steps.append(workflow.add(Noop(n), depends_on=steps[-1:]))
            await tx.insert_workflow(workflow)


async def _wait_until_done(
    client: awa.AsyncClient, jobs: int, processes: int, progress: Progress, task: Any
) -> None:
    """Until every job is committed as completed: this process's count when it works alone
    (no query competes with the workers), the table's, every 50 ms, with two processes."""
    runtime = client.runtime
    assert runtime is not None
    if processes == 1:
        while (done := runtime.completed) < jobs:
            progress.update(task, completed=done)
            await asyncio.sleep(0.01)
        return
    async with client.connection() as conn:
        while (done := await stat(conn, "bench_completed")) < jobs:
            progress.update(task, completed=done)
            await asyncio.sleep(0.05)


def _second_worker(url: str, concurrency: int, ready: Any, stop: Any) -> None:
    """The second process of ``drain-2proc``: a worker on the same queue until told to
    stop."""

    async def run() -> None:
        client = drain_client(url, "drain")
        async with client.run({QUEUE: {"max_workers": concurrency}}):
            ready.set()
            await asyncio.to_thread(stop.wait)
        await client.close()

    asyncio.run(run())


def _drain_with_sdk(url: str, jobs: int, concurrency: int, variant: str, results: Any) -> None:
    """The process of ``drain-otel`` and ``drain-otel-traced``: the SDK configured, then the
    plain drain (inserted inside a span for the traced one)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from prometheus_client import REGISTRY, generate_latest

    from awa.observability.endpoint import install_prometheus

    class Sink(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    install_prometheus()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Sink()))
    trace.set_tracer_provider(tracer_provider)
    span: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if variant == "drain-otel-traced":
        span = trace.get_tracer("awa-bench").start_as_current_span("bench")
    with Progress(disable=True) as progress, span:
        result = asyncio.run(bench_drain(url, jobs, concurrency, progress))
    exposition = generate_latest(REGISTRY).decode()
    tracer_provider.shutdown()
    if "awa_job_completed_total" not in exposition:
        raise awa.AwaError(f"{variant}: the Prometheus exposition lacks awa's metrics")
    results.put((variant, result.jobs, result.seconds, result.extra))


async def _drain_in_sdk_process(
    url: str, jobs: int, concurrency: int, progress: Progress, variant: str
) -> Result:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    arguments = (url, jobs, concurrency, variant, results)
    child = context.Process(target=_drain_with_sdk, args=arguments)
    task = progress.add_task(f"{variant} (in its own process)", total=None)
    child.start()
    try:
        scenario, count, seconds, extra = await asyncio.to_thread(results.get, True, 600)
    finally:
        await asyncio.to_thread(child.join, 30)
        progress.remove_task(task)
    return Result(scenario, count, seconds, extra)


async def bench_drain(
    url: str, jobs: int, concurrency: int, progress: Progress, variant: str = "drain"
) -> Result:
    """Run ``jobs`` pre-inserted jobs (see the module docstring); the rate, commits per job
    and dead tuples left in awa.jobs."""
    if variant in SDK_VARIANTS:
        return await _drain_in_sdk_process(url, jobs, concurrency, progress, variant)
    client = drain_client(url, variant)
    processes = 2 if variant == "drain-2proc" else 1
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    second = None
    try:
        await reset(client)
        await client.pause_queue(QUEUE)
        if variant in ("drain-chain", "drain-fan-in"):
            await _insert_workflows(client, variant, jobs)
        else:
            await client.insert_many_copy(jobs_of(variant, jobs))
        async with client.connection() as conn:
            await conn.execute(query("bench_vacuum"))
            commits_before = await stat(conn, "bench_commits")
        if processes == 2:
            second = context.Process(target=_second_worker, args=(url, concurrency, ready, stop))
            second.start()
            await asyncio.to_thread(ready.wait, 60)
        await client.start(queues_of(variant, concurrency))
        task = progress.add_task(f"{variant} x{concurrency}", total=jobs)
        started = time.perf_counter()
        await client.resume_queue(QUEUE)
        await _wait_until_done(client, jobs, processes, progress, task)
        elapsed = time.perf_counter() - started
        progress.update(task, completed=jobs)
        await client.close()  # stats of a backend are flushed when it exits
    finally:
        stop.set()
        if second is not None:
            await asyncio.to_thread(second.join, 30)
        await client.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await asyncio.sleep(1.2)  # let exiting backends and the stats collector catch up
        completed = await stat(conn, "bench_completed")
        commits = await stat(conn, "bench_commits") - commits_before
        dead = await stat(conn, "bench_dead_tuples")
    if completed != jobs:
        raise awa.AwaError(f"{variant}: {completed} of {jobs} jobs are completed in the table")
    extra = {"commits_per_job": commits / jobs, "dead_tuples": dead, "processes": processes}
    if variant == "drain-rated":
        extra["rate_vs_limit"] = jobs / elapsed / RATE[0]
    return Result(variant, jobs, elapsed, extra)
