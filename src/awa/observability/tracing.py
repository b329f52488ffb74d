"""Traces across jobs: the OpenTelemetry context of whoever inserts a job travels with it,
and each attempt continues it.

- An insert made while a span is active stores that span's W3C ``traceparent`` in the job's
  metadata under ``"awa:traceparent"`` (a value the caller put there wins).
  ``AWA_TRACE_CAPTURE=off`` turns capture off. The client's ``insert`` and ``insert_many``
  also open a producer span ``send <queue>`` when a span is recording.
- The worker runs each attempt of such a job in a consumer span ``job.execute <kind>``, a
  child of that context (every attempt of a job is in the same trace), with the job's id,
  kind, queue and attempt, and its outcome; a failure is recorded on the span. A job
  inserted outside any trace (a script, a bulk load) starts no trace of its own unless
  ``AWA_TRACE_ATTEMPTS=all``: a root trace per job floods a tracing backend, and a span
  costs tens of microseconds per job with the Python SDK.
- Follow-ups inserted for an attempt's outcome carry the attempt's context, so one trace
  shows the request, its job, and the jobs that job led to.

Without an SDK ``TracerProvider`` configured, none of this costs more than a check per
insert and per attempt.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "awa:traceparent"
"""The metadata key holding the W3C traceparent of the context a job was inserted in."""

_KEY_JSON = f'"{TRACEPARENT}"'
_CAPTURE = os.environ.get("AWA_TRACE_CAPTURE", "on").strip().lower() not in ("off", "false", "0")
_ALL_ATTEMPTS = os.environ.get("AWA_TRACE_ATTEMPTS", "traced").strip().lower() == "all"
_tracer = trace.get_tracer("awa")
_propagator = TraceContextTextMapPropagator()


def tracing_configured() -> bool:
    """Whether an SDK TracerProvider is set (spans would be recorded)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_traceparent() -> str | None:
    """The traceparent of the active span, when there is one and capture is on."""
    if not _CAPTURE or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def with_traceparent(metadata_json: str) -> str:
    """``metadata_json`` with the active span's traceparent added (unless it has one)."""
    parent = current_traceparent()
    if parent is None or _KEY_JSON in metadata_json:
        return metadata_json
    entry = f'{_KEY_JSON}:"{parent}"'
    return "{" + entry + ("}" if metadata_json == "{}" else "," + metadata_json[1:])


def _context_of(traceparent: str | None) -> otel_context.Context | None:
    if not traceparent:
        return None
    return _parsed(traceparent)


@functools.lru_cache(maxsize=1024)
def _parsed(traceparent: str) -> otel_context.Context:
    # Contexts are immutable; the jobs of one request share their traceparent.
    return _propagator.extract({"traceparent": traceparent})


@contextlib.contextmanager
def continuing(traceparent: str | None) -> Iterator[None]:
    """Run the block in the context of ``traceparent`` (what its inserts capture)."""
    parent = _context_of(traceparent) if _CAPTURE else None
    if parent is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def child_span(name: str, kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span | None]:
    """A span under the active one, when that one is recording (else None: no trace to
    add to, and nothing is spent)."""
    if not trace.get_current_span().is_recording():
        yield None
        return
    with _tracer.start_as_current_span(
        name, kind=kind, attributes={"messaging.system": "awa"}
    ) as span:
        yield span


def producing() -> contextlib.AbstractContextManager[Span | None]:
    """The producer span around an insert (see ``child_span``)."""
    return child_span("send", SpanKind.PRODUCER)


class _Described(Protocol):
    kind: str
    queue: str


def describe_insert(span: Span | None, jobs: Sequence[_Described]) -> None:
    """Name the producer span after the queue the jobs go to (the first job's)."""
    if span is None or not jobs:
        return
    span.update_name(f"send {jobs[0].queue}")
    span.set_attribute("messaging.destination.name", jobs[0].queue)
    span.set_attribute("awa.job.kind", jobs[0].kind)
    if len(jobs) != 1:
        span.set_attribute("messaging.batch.message_count", len(jobs))


def start_attempt(
    job_id: int, kind: str, queue: str, attempt: int, metadata: Mapping[str, Any] | None
) -> tuple[Span, str | None] | None:
    """The consumer span of one attempt, continuing the job's trace, and the attempt's own
    traceparent (for its follow-ups); None when no SDK is configured."""
    parent = metadata.get(TRACEPARENT) if metadata else None
    if not isinstance(parent, str) and not _ALL_ATTEMPTS:
        return None
    if not tracing_configured():
        return None
    span = _tracer.start_span(
        f"job.execute {kind}",
        context=_context_of(parent if isinstance(parent, str) else None),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "awa",
            "awa.job.id": job_id,
            "awa.job.kind": kind,
            "awa.job.queue": queue,
            "awa.job.attempt": attempt,
        },
    )
    own = span.get_span_context()
    traceparent = f"00-{own.trace_id:032x}-{own.span_id:016x}-{own.trace_flags:02x}"
    return span, traceparent if own.is_valid else None


def activate(span: Span) -> object:
    """Make ``span`` current in this task (until ``deactivate``)."""
    return otel_context.attach(trace.set_span_in_context(span))


def deactivate(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def end_attempt(span: Span, outcome: str, error: BaseException | None, failed: bool) -> None:
    span.set_attribute("awa.job.outcome", outcome)
    if error is not None:
        span.record_exception(error)
    if failed:
        span.set_status(Status(StatusCode.ERROR, description=outcome))
    span.end()
