"""Sending one function request: a pooled httpx client per event loop, a cap on the requests
in flight, one timeout for the whole exchange, and bodies read only up to a limit.

httpx comes from the ``http-worker`` extra and is imported on first use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import TYPE_CHECKING

from awa.http_worker.options import Options
from awa.http_worker.responses import ERROR_BODY_BYTES, FunctionError, Reply

if TYPE_CHECKING:
    import httpx

__all__ = ["Transport"]


@dataclasses.dataclass(slots=True)
class _Pool:
    client: httpx.AsyncClient
    slots: asyncio.Semaphore


class Transport:
    """The connections of one HTTP handler. asyncio primitives and httpx clients belong to
    one event loop, so each loop that runs the handler gets its own pool."""

    def __init__(self, options: Options) -> None:
        self._options = options
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = (
            weakref.WeakKeyDictionary()
        )
        self.in_flight = 0
        """Requests sent and not yet answered, over every loop (for tests and metrics)."""

    def _pool(self) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            import httpx

            limit = self._options.max_connections
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(self._options.timeout),
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
                follow_redirects=False,
                trust_env=False,
            )
            pool = self._pools[loop] = _Pool(client, asyncio.Semaphore(limit))
        return pool

    async def post(self, body: bytes, headers: dict[str, str], success_bytes: int) -> Reply:
        """POST ``body``; the answer with at most ``success_bytes`` of a 2xx body read (more
        is flagged ``truncated``). Raises FunctionError when there is no answer in time or
        no connection. Waits for a free slot first when ``max_connections`` are busy."""
        import httpx

        options = self._options
        pool = self._pool()
        async with pool.slots:
            self.in_flight += 1
            try:
                async with asyncio.timeout(options.timeout):
                    request = pool.client.build_request(
                        "POST", options.url, content=body, headers=headers
                    )
                    response = await pool.client.send(request, stream=True)
                    try:
                        return await _read(response, success_bytes)
                    finally:
                        await response.aclose()
            except (TimeoutError, httpx.TimeoutException):
                raise FunctionError(
                    f"POST {options.shown_url}: no answer within {options.timeout:g}s"
                ) from None
            except httpx.TransportError as error:
                raise FunctionError(
                    f"POST {options.shown_url} failed: {type(error).__name__}: {error}"
                ) from None
            finally:
                self.in_flight -= 1

    async def aclose(self) -> None:
        """Close the connections of the running loop's pool."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.client.aclose()


async def _read(response: httpx.Response, success_bytes: int) -> Reply:
    status = response.status_code
    success = 200 <= status < 300
    limit = success_bytes if success else ERROR_BODY_BYTES
    declared = response.headers.get("content-length", "").strip()
    # An output too large is refused unread; an error's first bytes are read to quote them.
    truncated = success and declared.isascii() and declared.isdigit() and int(declared) > limit
    chunks: list[bytes] = []
    size = 0
    if not truncated and limit > 0:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                truncated = True
                break
    return Reply(
        status=status,
        reason=response.reason_phrase,
        retry_after=response.headers.get("retry-after"),
        body=b"".join(chunks)[:limit],
        truncated=truncated,
    )
