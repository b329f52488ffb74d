"""The tracing scenario of tests/test_http_worker.py, in a process of its own (a tracer
provider is global): a job inserted in a request's span is handed to a real function
endpoint by an HttpHandler. Prints the finished spans, then the traceparent header the
function received, as JSON lines. Reads ``DATABASE_URL``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import awa
from awa.http_worker import HttpHandler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers_http_worker import Answer, FunctionServer

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("app")


@dataclasses.dataclass
class RenderPdf:
    document: str


async def main() -> None:
    client = awa.AsyncClient()
    await client.migrate()
    with FunctionServer(lambda request: Answer(200, b'{"ok": true}')) as function:
        client.task(RenderPdf, queue="t")(HttpHandler(function.url))
        with tracer.start_as_current_span("render request"):
            job = await client.insert(RenderPdf("a"))
        async with client.run({"t": 1}, promote_interval=0.05):
            async with asyncio.timeout(20):
                while (await client.get_job(job.id)).state is not awa.JobState.COMPLETED:
                    await asyncio.sleep(0.02)
    await client.close()
    for span in exporter.get_finished_spans():
        context = span.get_span_context()
        record = {
            "name": span.name,
            "trace": f"{context.trace_id:032x}",
            "id": f"{context.span_id:016x}",
            "parent": f"{span.parent.span_id:016x}" if span.parent else None,
            "kind": span.kind.name,
            "attributes": dict(span.attributes or {}),
        }
        print(json.dumps(record))
    [request] = function.requests
    print(json.dumps({"traceparent": request.headers.get("traceparent")}))


asyncio.run(main())
