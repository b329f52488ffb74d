"""Stopping the background tasks of the worker's components."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has finished."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def cancels_this_task(error: BaseException) -> bool:
    """Whether ``error`` is the cancellation of the running task itself (a shutdown), not a
    CancelledError that user code raised or let through."""
    current = asyncio.current_task()
    return (
        isinstance(error, asyncio.CancelledError)
        and current is not None
        and current.cancelling() > 0
    )
