"""``HttpHandler``: a handler that hands each job to an HTTP endpoint instead of running
Python code. It is registered like any handler (``client.task(Args)(HttpHandler(...))``),
so retries, deadlines, rescue, hooks, follow-ups, metrics and traces apply to its attempts
as to any other."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

import orjson
from opentelemetry.trace import SpanKind

from awa.callbacks import contract as callback_contract
from awa.core.extras import require_extra
from awa.errors import TerminalError, ValidationError
from awa.http_worker import options as _options
from awa.http_worker.options import Mode, Options
from awa.http_worker.responses import Reply, decode_output, judge
from awa.http_worker.signing import sign_request
from awa.http_worker.transport import Transport
from awa.job import Job
from awa.lifecycle.staging import MAX_OUTPUT_BYTES
from awa.observability import tracing
from awa.outcomes import Snooze, WaitForCallback
from awa.version import __version__

__all__ = ["HttpHandler"]

USER_AGENT = f"awa-py/{__version__}"
CANCEL_POLL_SECONDS = 0.1
"""How often a request in flight looks whether its attempt was cancelled or rescued."""
ABANDONED = Snooze(0)
"""The outcome of an attempt whose request was abandoned because the attempt was cancelled
or rescued: after a cancel or a rescue it changes nothing (the attempt is over); at shutdown
it puts the job back on its queue at once, without consuming the attempt."""


class HttpHandler:
    """Serve a job kind with an HTTP endpoint (a serverless function, another service).

    Each attempt POSTs the job as JSON (``job_id``, ``kind``, ``args``, ``attempt``,
    ``max_attempts``; in async mode also ``callback_id`` and ``callback_url``: the body the
    reference package's HTTP worker sends) to ``url``.

    - ``mode="sync"``: the answer decides. 2xx completes the job with the body as its output
      (JSON when it parses, else the text; an empty body records none); 429 or 503 with
      ``Retry-After`` snoozes; 408, 429, 5xx, a timeout or no connection retries with
      backoff; any other status fails the job for good.
    - ``mode="async"``: a callback is registered first (``callback_timeout`` seconds), the
      function gets its URL (``callback_base_url`` + ``callback_prefix`` +
      ``/{id}/complete``) and, with ``contract_secret``, the ``X-Awa-Signature`` header to
      forward; a 2xx parks the job until the function answers through the receiver. Other
      answers count as in sync mode.

    ``timeout``: seconds for the whole exchange. ``max_connections``: requests in flight at
    once for this handler (per worker process; a request past it waits for a free one).
    ``secret``: signs each request (``awa.http_worker.signing``). ``headers``: sent with
    every request (e.g. ``Authorization``). ``max_response_bytes``: the largest 2xx body a
    sync function may answer (a larger one fails the job, naming the limit).
    ``max_retry_after``: the longest ``Retry-After`` honoured, in seconds.

    Every argument is checked here: a bad one raises ``awa.ValidationError`` naming it.
    Without httpx (``pip install 'awa-py[http-worker]'``) this raises ``MissingExtra``.
    """

    def __init__(
        self,
        url: str,
        *,
        mode: Mode = "sync",
        timeout: float = _options.DEFAULT_TIMEOUT,
        max_connections: int = _options.DEFAULT_MAX_CONNECTIONS,
        secret: str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        max_response_bytes: int = MAX_OUTPUT_BYTES,
        max_retry_after: float = _options.DEFAULT_MAX_RETRY_AFTER,
        callback_base_url: str | None = None,
        callback_prefix: str = callback_contract.DEFAULT_PATH_PREFIX,
        callback_timeout: float = 3600.0,
        contract_secret: str | bytes | None = None,
    ) -> None:
        require_extra("http-worker", "awa.http_worker.HttpHandler")
        self.options: Options = _options.build(
            url,
            mode=mode,
            timeout=timeout,
            max_connections=max_connections,
            secret=secret,
            headers=headers,
            max_response_bytes=max_response_bytes,
            max_retry_after=max_retry_after,
            callback_base_url=callback_base_url,
            callback_prefix=callback_prefix,
            callback_timeout=callback_timeout,
            contract_secret=contract_secret,
        )
        self._transport = Transport(self.options)

    def __repr__(self) -> str:
        return f"HttpHandler({self.options.shown_url!r}, mode={self.options.mode!r})"

    @property
    def in_flight(self) -> int:
        """Requests of this handler sent and not yet answered."""
        return self._transport.in_flight

    async def __call__(self, job: Job[Any]) -> Snooze | WaitForCallback | None:
        if self.options.mode == "async":
            return await self._dispatch(job)
        return await self._call(job)

    async def aclose(self) -> None:
        """Close the connections this handler keeps open on the running event loop."""
        await self._transport.aclose()

    async def _call(self, job: Job[Any]) -> Snooze | None:
        options = self.options
        reply = await self._post(job, {}, options.max_response_bytes)
        if reply is None:
            return ABANDONED
        snooze = judge(reply, options.shown_url, options.max_retry_after)
        if snooze is not None:
            return snooze
        if reply.truncated:
            raise TerminalError(
                f"POST {options.shown_url} answered {reply.status} with a body larger than "
                f"max_response_bytes ({options.max_response_bytes} bytes)"
            )
        if reply.body:
            try:
                job.record_output(decode_output(reply.body))
            except ValidationError as error:
                raise TerminalError(
                    f"POST {options.shown_url} answered {reply.status} with a body that "
                    f"cannot be the job's output: {error}"
                ) from None
        return None

    async def _dispatch(self, job: Job[Any]) -> Snooze | WaitForCallback:
        options = self.options
        assert options.callback_base_url is not None  # checked by options.build
        token = await job.register_callback(timeout_seconds=options.callback_timeout)
        url = callback_contract.build_callback_url(
            options.callback_base_url, options.callback_prefix, token.id, "complete"
        )
        callback = {"callback_id": token.id, "callback_url": url}
        extra = {}
        if options.contract_secret is not None:
            extra = callback_contract.signature_headers(options.contract_secret, token.id)
        reply = await self._post(job, callback, 0, extra)
        if reply is None:
            return ABANDONED
        snooze = judge(reply, options.shown_url, options.max_retry_after)
        return snooze if snooze is not None else WaitForCallback(token)

    async def _post(
        self,
        job: Job[Any],
        callback: dict[str, str],
        success_bytes: int,
        extra: dict[str, str] | None = None,
    ) -> Reply | None:
        """The function's reply; None when the attempt was cancelled or rescued before it
        came (the request is abandoned)."""
        options = self.options
        body = orjson.dumps(
            callback_contract.function_request(
                job_id=job.id,
                kind=job.kind,
                args=job.raw_args,
                attempt=job.attempt,
                max_attempts=job.max_attempts,
                **callback,
            )
        )
        headers = {
            "User-Agent": USER_AGENT,  # the only one of ours that ``headers`` may replace
            **dict(options.headers),
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",  # no compressed bodies: the limit is on bytes read
            **(extra or {}),
        }
        if options.secret is not None:
            headers.update(sign_request(options.secret, body))
        with tracing.child_span("POST", SpanKind.CLIENT) as span:
            traceparent = tracing.current_traceparent()
            if traceparent is not None:
                headers["traceparent"] = traceparent
            if span is not None:
                span.set_attribute("http.request.method", "POST")
                span.set_attribute("url.full", options.shown_url)
            reply = await _until_cancelled(job, self._transport.post(body, headers, success_bytes))
            if span is not None and reply is not None:
                span.set_attribute("http.response.status_code", reply.status)
        return reply


async def _until_cancelled(job: Job[Any], request: Coroutine[Any, Any, Reply]) -> Reply | None:
    """``request``'s reply; None when the attempt is cancelled or rescued first
    (``job.is_cancelled()``, looked at every ``CANCEL_POLL_SECONDS``): the request is then
    abandoned at once and its connection closed."""
    sending = asyncio.ensure_future(request)
    try:
        while not job.is_cancelled():
            done, _ = await asyncio.wait({sending}, timeout=CANCEL_POLL_SECONDS)
            if done:
                return sending.result()
    finally:
        sending.cancel()  # a no-op once it is done
    return None
