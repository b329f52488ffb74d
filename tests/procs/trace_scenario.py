"""The tracing scenario of tests/test_tracing.py, in a process of its own (a tracer
provider is global): jobs inserted in a request's span, run by a worker, with follow-ups
from a spec, staged by async and def handlers, a retry, and a callback resolved in a
webhook's span. Prints the finished spans as JSON lines. Reads ``DATABASE_URL``."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import awa

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("app")

client = awa.AsyncClient()
tokens: asyncio.Queue[str] = asyncio.Queue()


@dataclasses.dataclass
class Signup:
    user: str


@dataclasses.dataclass
class Welcome:
    user: str


@dataclasses.dataclass
class Receipt:
    user: str


@dataclasses.dataclass
class Flaky:
    n: int


@dataclasses.dataclass
class Report:
    n: int


@dataclasses.dataclass
class Payment:
    n: int


@dataclasses.dataclass
class Notify:
    n: int


@client.task(Signup, queue="t")
async def signup(job: awa.Job[Signup]) -> None:
    job.enqueue_on_completion(Receipt(job.args.user))


client.on_completed_enqueue_with(Signup, lambda args, row: awa.EnqueueRequest(Welcome(args.user)))


@client.task(Welcome, queue="t")
async def welcome(job: awa.Job[Welcome]) -> None:
    return None


@client.task(Receipt, queue="t")
async def receipt(job: awa.Job[Receipt]) -> None:
    return None


@client.task(Flaky, queue="t")
async def flaky(job: awa.Job[Flaky]) -> None:
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")


@client.task(Report, queue="t")
def report(job: awa.Job[Report]) -> None:  # a def handler, in a thread
    job.enqueue_on_completion(Receipt("report"))


@client.task(Payment, queue="t")
async def payment(job: awa.Job[Payment]) -> awa.WaitForCallback:
    token = await job.register_callback(timeout_seconds=60)
    await tokens.put(token.id)
    return awa.WaitForCallback(token)


client.on_completed_enqueue_with(Payment, lambda args, row: awa.EnqueueRequest(Notify(args.n)))


@client.task(Notify, queue="t")
async def notify(job: awa.Job[Notify]) -> None:
    return None


async def main() -> None:
    await client.migrate()
    with tracer.start_as_current_span("signup request"):
        await client.insert(Signup("ada"))
        async with client.transaction() as tx:
            await tx.insert(Flaky(1))
        await client.insert_many([Report(1)])
    with tracer.start_as_current_span("checkout request"):
        await client.insert(Payment(1))
    async with client.run({"t": 4}, promote_interval=0.05):
        token = await tokens.get()
        async with client.connection() as conn:
            while True:
                cursor = await conn.execute(
                    "SELECT count(*) FROM awa.jobs WHERE state = 'waiting_external'"
                )
                row = await cursor.fetchone()
                if row and row[0] == 1:
                    break
                await asyncio.sleep(0.02)
        with tracer.start_as_current_span("payment webhook"):
            await client.complete_external(token)
        async with client.connection() as conn:
            while True:
                cursor = await conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FROM awa.jobs"
                )
                row = await cursor.fetchone()
                if row and row[0] == row[1] == 8:
                    break
                await asyncio.sleep(0.05)
    await client.close()
    for span in exporter.get_finished_spans():
        context = span.get_span_context()
        print(
            json.dumps(
                {
                    "name": span.name,
                    "trace": f"{context.trace_id:032x}",
                    "id": f"{context.span_id:016x}",
                    "parent": f"{span.parent.span_id:016x}" if span.parent else None,
                    "kind": span.kind.name,
                    "status": span.status.status_code.name,
                    "attributes": dict(span.attributes or {}),
                    "events": [event.name for event in span.events],
                }
            )
        )


asyncio.run(main())
