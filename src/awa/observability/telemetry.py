"""``awa.init_telemetry()`` / ``awa.shutdown_telemetry()``: OTLP export of awa's metrics and
traces in one call, as the reference package offers it.

awa's instruments (``awa.observability.metrics``) and spans (``awa.observability.tracing``)
report to OpenTelemetry's global providers. An application that configures its own SDK
providers needs neither function. ``init_telemetry`` is for the others: it installs an SDK
``MeterProvider`` with a periodic OTLP/gRPC exporter (and, with ``traces``, a
``TracerProvider`` exporting spans in batches) as the global providers. The SDK and the
exporter are imported only here, so ``import awa`` never needs them; without them the call
raises ``awa.errors.MissingExtra`` (an ImportError) naming the extra that brings them,
``otlp``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from awa.core.extras import missing_extra
from awa.errors import ValidationError

log = logging.getLogger("awa.telemetry")


_lock = threading.Lock()
_meter_provider: Any = None
_tracer_provider: Any = None


def _import(module: str, package: str) -> Any:
    """``module`` (a part of ``package``), or the one-line error naming the otlp extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise missing_extra("otlp", f"awa.init_telemetry() ({package})") from error


def _check(
    endpoint: object, service_name: object, export_interval_ms: object, traces: object
) -> None:
    for field, value in (("endpoint", endpoint), ("service_name", service_name)):
        if not isinstance(value, str) or not value.strip():
            raise ValidationError(f"init_telemetry(): {field} must be a non-empty string")
    if (
        isinstance(export_interval_ms, bool)
        or not isinstance(export_interval_ms, int)
        or export_interval_ms <= 0
    ):
        raise ValidationError(
            "init_telemetry(): export_interval_ms must be a positive integer (milliseconds), "
            f"got {export_interval_ms!r}"
        )
    if not isinstance(traces, bool):
        raise ValidationError("init_telemetry(): traces must be True or False")


def init_telemetry(
    endpoint: str,
    service_name: str,
    export_interval_ms: int = 5000,
    traces: bool = True,
) -> bool:
    """Export awa's metrics (every ``export_interval_ms``) and, with ``traces``, its spans
    to the OTLP/gRPC collector at ``endpoint`` (e.g. ``"http://localhost:4317"``), under the
    resource ``service.name = service_name``.

    Returns True when it installed the providers; False when this process has them already
    (a second call, or SDK providers the application set itself, which are kept: awa's
    instruments report to them). Safe from any thread; the export runs in the background.
    """
    global _meter_provider, _tracer_provider
    _check(endpoint, service_name, export_interval_ms, traces)
    sdk_metrics = _import("opentelemetry.sdk.metrics", "the OpenTelemetry SDK")
    with _lock:
        if _meter_provider is not None:
            return False
        from opentelemetry import metrics, trace

        if isinstance(metrics.get_meter_provider(), sdk_metrics.MeterProvider):
            log.info("init_telemetry(): the application's MeterProvider is kept")
            return False
        export = _import("opentelemetry.sdk.metrics.export", "the OpenTelemetry SDK")
        resources = _import("opentelemetry.sdk.resources", "the OpenTelemetry SDK")
        otlp_metrics = _import(
            "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
            "the OTLP exporter (opentelemetry-exporter-otlp-proto-grpc)",
        )
        resource = resources.Resource.create({"service.name": service_name})
        reader = export.PeriodicExportingMetricReader(
            otlp_metrics.OTLPMetricExporter(endpoint=endpoint),
            export_interval_millis=export_interval_ms,
        )
        meter_provider = sdk_metrics.MeterProvider(resource=resource, metric_readers=[reader])
        tracer_provider = None
        if traces:
            sdk_trace = _import("opentelemetry.sdk.trace", "the OpenTelemetry SDK")
            if isinstance(trace.get_tracer_provider(), sdk_trace.TracerProvider):
                log.info("init_telemetry(): the application's TracerProvider is kept")
            else:
                batch = _import("opentelemetry.sdk.trace.export", "the OpenTelemetry SDK")
                otlp_trace = _import(
                    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                    "the OTLP exporter (opentelemetry-exporter-otlp-proto-grpc)",
                )
                tracer_provider = sdk_trace.TracerProvider(resource=resource)
                tracer_provider.add_span_processor(
                    batch.BatchSpanProcessor(otlp_trace.OTLPSpanExporter(endpoint=endpoint))
                )
        # Installed only once everything is built: a failure above leaves nothing behind.
        metrics.set_meter_provider(meter_provider)
        if tracer_provider is not None:
            trace.set_tracer_provider(tracer_provider)
        _meter_provider, _tracer_provider = meter_provider, tracer_provider
        return True


def shutdown_telemetry() -> None:
    """Flush what ``init_telemetry`` has not exported yet and stop its exporters (for
    short-lived scripts, before they exit). Does nothing when it installed nothing."""
    global _meter_provider, _tracer_provider
    with _lock:
        providers = (_tracer_provider, _meter_provider)
        _meter_provider = _tracer_provider = None
    for provider in providers:
        if provider is not None:
            provider.shutdown()
