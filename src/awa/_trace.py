"""The reference package's trace helpers under their names (``awa._trace``), for programs and
tools that import them. awa's own tracing is ``awa.observability.tracing``: producers
capture the ambient span context under the same metadata key, and the worker runs each
attempt in its job's trace, so nothing here is needed to get traces.

- ``TRACEPARENT_KEY``: the reserved metadata key, ``"awa:traceparent"``.
- ``current_traceparent()``: the active span's W3C traceparent (None outside a span).
- ``inject_traceparent(metadata)``: metadata with the ambient traceparent added (a value
  already there wins; the given dict is never changed); ``AWA_TRACE_CAPTURE=off`` (or
  ``false``, ``0``) turns capture off, read at each call.
- ``ambient_traceparent()``: the ambient traceparent unless capture is off.
- ``await call_with_context(traceparent, handler, job)``: ``await handler(job)`` with that
  trace context attached.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from awa.observability.tracing import TRACEPARENT

TRACEPARENT_KEY = TRACEPARENT
_CAPTURE_ENV = "AWA_TRACE_CAPTURE"

__all__ = [
    "TRACEPARENT_KEY",
    "ambient_traceparent",
    "call_with_context",
    "current_traceparent",
    "inject_traceparent",
]


def _capture_disabled() -> bool:
    return os.environ.get(_CAPTURE_ENV, "").strip().lower() in ("off", "false", "0")


def current_traceparent() -> str | None:
    """The active span's context as a W3C ``traceparent``; None without a valid one."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def inject_traceparent(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """``metadata`` with the ambient traceparent under ``TRACEPARENT_KEY`` (a copy; the
    same object when there is nothing to add)."""
    if metadata is not None and TRACEPARENT_KEY in metadata:
        return metadata
    traceparent = ambient_traceparent()
    if traceparent is None:
        return metadata
    return {**(metadata or {}), TRACEPARENT_KEY: traceparent}


def ambient_traceparent() -> str | None:
    """``current_traceparent()``, unless ``AWA_TRACE_CAPTURE`` turns capture off."""
    return None if _capture_disabled() else current_traceparent()


async def call_with_context(
    traceparent: str | None, handler: Callable[[Any], Awaitable[Any]], job: Any
) -> Any:
    """``await handler(job)`` with ``traceparent`` as the ambient trace context (a plain
    call without one)."""
    if not traceparent:
        return await handler(job)
    token = otel_context.attach(
        TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    )
    try:
        return await handler(job)
    finally:
        otel_context.detach(token)
