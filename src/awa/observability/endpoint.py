"""An HTTP endpoint for operators: ``/metrics`` (Prometheus), ``/healthz`` (liveness) and
``/readyz`` (readiness), as an ASGI app (Starlette) to mount in your web app, or served by
``awa worker --metrics-port``. Needs the ``metrics`` extra (``pip install 'awa-py[metrics]'``):
without it, importing this module raises ``awa.errors.MissingExtra`` saying so.

The metrics are awa's OpenTelemetry instruments, exported by the OpenTelemetry Prometheus
exporter: ``install_prometheus()`` gives the process an SDK ``MeterProvider`` with a
``PrometheusMetricReader`` (unless one is configured already), and ``/metrics`` renders
``prometheus_client``'s registry. Queue gauges come from the leader's last sample; the
endpoint reads it before answering when no worker in this process keeps it fresh.

Each endpoint answers GET (and HEAD) without query parameters; anything else gets a JSON
``{"error": ...}`` naming what is wrong: 400 a query string, 404 another path, 405 another
method.

``/readyz`` answers 200 when ``health_check(queues=False)`` finds the process healthy
(database reachable and migrated, a maintenance leader, this worker's listener and
heartbeat alive), else 503; both bodies are the findings as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import psycopg
from opentelemetry import metrics as otel_metrics

from awa.core.extras import missing_extra
from awa.errors import ValidationError
from awa.observability.health import HealthCheck
from awa.observability.metrics import sources
from awa.observability.queue_samples import refresh_queue_samples

try:
    import uvicorn
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as error:
    raise missing_extra("metrics", "awa.observability.endpoint") from error

log = logging.getLogger("awa.observability")

# A scrape reads the queue samples again when the last read is older than this.
SAMPLES_MAX_AGE = 1.0


class EndpointClient(Protocol):
    """What the endpoint needs of an ``AsyncClient``."""

    async def health_check(self, *, queues: bool = True) -> HealthCheck: ...

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...


def install_prometheus() -> bool:
    """Export awa's instruments to ``prometheus_client``'s registry: set an SDK
    ``MeterProvider`` with a ``PrometheusMetricReader`` as the global one. Returns False
    (and changes nothing) when the application set an SDK ``MeterProvider`` already: give
    it a ``PrometheusMetricReader`` yourself then."""
    if isinstance(otel_metrics.get_meter_provider(), MeterProvider):
        return False
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
    return True


def observability_app(
    client: EndpointClient, *, registry: CollectorRegistry = REGISTRY
) -> Starlette:
    """The ``/metrics``, ``/healthz`` and ``/readyz`` app for ``client``."""

    async def scrape(request: Request) -> Response:
        if time.monotonic() - sources.sampled_at > SAMPLES_MAX_AGE:
            try:
                async with client.connection() as conn:
                    await refresh_queue_samples(conn)
            except Exception as error:  # the process's own metrics still answer
                log.warning("metrics: could not read the queue samples (%s)", error)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def alive(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def ready(request: Request) -> Response:
        check = await client.health_check(queues=False)
        body = {
            "status": check.status,
            "problems": check.problems,
            "schema_version": check.schema_version,
            "leader": check.leader.application_name if check.leader is not None else None,
            "listener_connected": (
                check.runtime.listener_connected if check.runtime is not None else None
            ),
            "heartbeat_alive": check.runtime.heartbeat_alive if check.runtime is not None else None,
        }
        return JSONResponse(body, status_code=200 if check.healthy else 503)

    return Starlette(
        routes=[
            Route("/metrics", _no_query(scrape), methods=["GET"]),
            Route("/healthz", _no_query(alive), methods=["GET"]),
            Route("/readyz", _no_query(ready), methods=["GET"]),
        ],
        exception_handlers={404: _not_found, 405: _not_allowed},
    )


# Errors name what is wrong, as JSON, and never echo more than a bit of a hostile input.

_SERVED = "GET /metrics, /healthz and /readyz"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _shown(value: str, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... (cut, {len(value)} characters)"


Handler = Callable[[Request], Awaitable[Response]]


def _no_query(handler: Handler) -> Handler:
    """``handler``, refusing a query string (no endpoint takes parameters: a scrape
    configured with some would otherwise silently get something else than it asked)."""

    async def checked(request: Request) -> Response:
        if request.url.query:
            names = sorted({name for name, _ in request.query_params.multi_items()})
            given = ", ".join(_shown(name, 40) for name in names[:5]) or _shown(request.url.query)
            return _error(400, f"{request.url.path} takes no query parameters (got {given})")
        return await handler(request)

    return checked


async def _not_found(request: Request, error: Exception) -> Response:
    return _error(404, f"no endpoint at {_shown(request.url.path)}: this app serves {_SERVED}")


async def _not_allowed(request: Request, error: Exception) -> Response:
    message = f"method {_shown(request.method)} is not allowed: this app serves {_SERVED}"
    return _error(405, message, {"Allow": "GET, HEAD"})


class EndpointServer:
    """The app served on ``host:port`` by uvicorn on the running event loop, beside a
    worker (``awa worker --metrics-port``). Signals stay the worker's."""

    def __init__(self, client: EndpointClient, host: str, port: int) -> None:
        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the worker handles SIGTERM and SIGINT

        # Bound here, so that a port in use is an error now, naming the port.
        try:
            self._socket = socket.create_server((host, port), reuse_port=False)
        except OSError as error:
            raise ValidationError(f"cannot serve metrics on {host}:{port}: {error}") from None
        config = uvicorn.Config(
            observability_app(client), log_level="warning", lifespan="off", access_log=False
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        port: int = self._socket.getsockname()[1]
        return port

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._server.serve(sockets=[self._socket]), name="awa-metrics-endpoint"
        )

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._socket.close()
