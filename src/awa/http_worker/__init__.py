"""HTTP workers: a job kind served by an HTTP endpoint (a serverless function, another
service) instead of Python code.

``HttpHandler(url, mode="sync" | "async", ...)`` is a handler like any other: register it
with ``client.task(Args, queue=...)(HttpHandler(...))`` and its attempts are claimed,
retried, rescued, hooked, counted and traced as every attempt is. Sync mode maps the
function's answer to the outcome (``awa.http_worker.responses``); async mode parks the job
on a callback that the function answers through the receiver (``awa.callbacks.http``),
with the reference package's contract (``awa.callbacks.contract``). Requests can be signed
(``awa.http_worker.signing``). Sending needs httpx: ``pip install 'awa-py[http-worker]'``.
"""

from __future__ import annotations

from awa.http_worker.handler import HttpHandler
from awa.http_worker.options import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_RETRY_AFTER,
    DEFAULT_TIMEOUT,
    Mode,
)
from awa.http_worker.responses import FunctionError
from awa.http_worker.signing import (
    MAX_SKEW_SECONDS,
    REQUEST_SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    RequestSignatureError,
    sign_request,
    verify_request,
)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "MAX_SKEW_SECONDS",
    "REQUEST_SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "FunctionError",
    "HttpHandler",
    "Mode",
    "RequestSignatureError",
    "sign_request",
    "verify_request",
]
