"""Lifecycle hooks: per-kind callbacks run after a job's transition commits.

Hooks are best-effort, in-process notifications, run in the background after the commit
that produced the event; the hooks of one kind run one after another in registration order,
while events of different jobs may run concurrently. A hook never holds a
worker slot, ``shutdown()`` does not wait for hooks, and a hook that raises is logged (with
the job id and kind) without stopping the hooks after it. For side effects that must
survive a crash, use the durable follow-ups (``on_*_enqueue``) instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from awa.core.kinds import decode_args, derive_kind
from awa.core.tasks import cancels_this_task
from awa.lifecycle.events import JobEvent
from awa.model import check_name

log = logging.getLogger("awa.hooks")

Hook = Callable[[Any], Awaitable[None] | None]


def is_async_callable(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


@dataclasses.dataclass(frozen=True, slots=True)
class _Registration:
    hook: Hook
    args_type: type[Any] | None  # None: untyped, the hook gets the JSON args
    is_async: bool

    @property
    def name(self) -> str:
        return getattr(self.hook, "__qualname__", repr(self.hook))


class HookRegistry:
    """Hooks by job kind, in registration order."""

    def __init__(self) -> None:
        self._by_kind: dict[str, list[_Registration]] = {}

    def add(self, kind: str, hook: Hook, args_type: type[Any] | None) -> None:
        check_name("kind", kind)
        if not callable(hook):
            raise TypeError(f"a lifecycle hook must be callable, not {type(hook).__name__}")
        registration = _Registration(hook, args_type, is_async_callable(hook))
        self._by_kind.setdefault(kind, []).append(registration)

    def for_kind(self, kind: str) -> list[_Registration]:
        return self._by_kind.get(kind, [])

    def __contains__(self, kind: str) -> bool:
        return kind in self._by_kind

    def __bool__(self) -> bool:
        return bool(self._by_kind)


def kind_of(args_type: type[Any], kind: str | None) -> str:
    if kind is not None:
        return kind
    if not isinstance(args_type, type):
        raise TypeError("on_event() takes an args class (use on_event_kind for a kind name)")
    return derive_kind(args_type.__name__)


_Pending = tuple[list[_Registration], JobEvent[Any], "type[Any] | None", float]


class HookDispatcher:
    """Runs the hooks of committed events in the background.

    Events wait in a queue drained by consumer tasks, so a stream of quick hooks costs no
    task per event: a resident consumer sleeps while the queue is empty and wakes on the
    next event; it ends after ``IDLE`` seconds without any. A watchdog adds consumers as
    soon as the oldest waiting event has waited ``STALL`` seconds (a slow hook is running),
    so slow hooks run concurrently instead of delaying every later event; the extra
    consumers end when the queue is empty.
    """

    STALL = 0.02
    IDLE = 5.0
    MAX_CONSUMERS = 1024

    def __init__(self, registry: HookRegistry) -> None:
        self._registry = registry
        self._queue: collections.deque[_Pending] = collections.deque()
        self._consumers: set[asyncio.Task[None]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._running = 0
        self._active = 0  # consumers still draining (tasks leave _consumers a bit later)
        self._resident: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleeping = False  # the resident consumer waits for work
        self._retire = False  # the resident consumer should end (idle too long)
        # Plain def hooks run on threads of their own: on asyncio's default executor, hooks
        # that block would queue ahead of the runtime's own calls there (shutdown uses it).
        self._threads: ThreadPoolExecutor | None = None

    def wants(self, kind: str) -> bool:
        """Whether events of this kind have any hook (build no event otherwise)."""
        return kind in self._registry

    def dispatch(self, event: JobEvent[Any], args_type: type[Any] | None = None) -> bool:
        """Queue the event's hooks to run in the background; False when it has none.

        ``event.args`` is the row's JSON args, or (with ``args_type``) already decoded into
        that type, which typed hooks of the same type then use without decoding again.
        """
        registrations = self._registry.for_kind(event.job.kind)
        if not registrations:
            return False
        loop = asyncio.get_running_loop()
        self._queue.append((registrations, event, args_type, loop.time()))
        if self._sleeping:
            self._sleeping = False
            self._wake.set()
        elif self._resident is None:
            self._resident = self._spawn_one(resident=True)
        if self._watchdog is None:
            self._watchdog = loop.create_task(self._watch(), name="awa-hooks-watchdog")
        return True

    async def dispatch_and_wait(self, event: JobEvent[Any]) -> None:
        """Run the event's hooks and wait for them (errors are logged, not raised)."""
        registrations = self._registry.for_kind(event.job.kind)
        if registrations:
            await self._run(registrations, event)

    def pending(self) -> int:
        """Events queued or running."""
        return len(self._queue) + self._running

    def cancel_all(self) -> None:
        self._queue.clear()
        for task in list(self._consumers):
            task.cancel()
        self._resident = None
        self._sleeping = False
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None

    def _spawn(self, count: int) -> None:
        for _ in range(min(count, self.MAX_CONSUMERS - self._active)):
            self._spawn_one(resident=False)

    def _spawn_one(self, *, resident: bool) -> asyncio.Task[None]:
        self._active += 1
        task = asyncio.get_running_loop().create_task(self._consume(resident), name="awa-hooks")
        self._consumers.add(task)
        task.add_done_callback(self._consumers.discard)
        return task

    async def _consume(self, resident: bool) -> None:
        queue = self._queue
        try:
            while True:
                while queue:
                    registrations, event, decoded_as, _ = queue.popleft()
                    self._running += 1
                    try:
                        await self._run(registrations, event, decoded_as)
                    finally:
                        self._running -= 1
                if not resident or self._retire:
                    return
                self._wake.clear()
                self._sleeping = True
                await self._wake.wait()
        finally:
            self._active -= 1
            if resident:
                self._sleeping = False
                self._retire = False
                self._resident = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        try:
            while True:
                await asyncio.sleep(self.STALL)
                queue = self._queue
                if queue and loop.time() - queue[0][3] >= self.STALL:
                    # Every consumer is stuck in a slow hook: one more per waiting event.
                    self._spawn(len(queue))
                elif queue and not self._active:
                    self._spawn(1)
                if queue or self._running:
                    idle_since = loop.time()
                elif loop.time() - idle_since >= self.IDLE:
                    # Nothing for a while: the resident consumer and the watchdog end.
                    if self._sleeping:
                        self._retire = True
                        self._sleeping = False
                        self._wake.set()
                    return
        finally:
            self._watchdog = None

    def _run_sync(self, hook: Hook, event: JobEvent[Any]) -> asyncio.Future[Any]:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="awa-hook"
            )
        context = contextvars.copy_context()
        return asyncio.get_running_loop().run_in_executor(self._threads, context.run, hook, event)

    async def _run(
        self,
        registrations: list[_Registration],
        event: JobEvent[Any],
        decoded_as: type[Any] | None = None,
    ) -> None:
        job = event.job
        for registration in registrations:
            if registration.args_type is decoded_as:
                typed = event
            elif registration.args_type is None:
                typed = dataclasses.replace(event, args=job.args)
            else:
                try:
                    args = decode_args(registration.args_type, job.args)
                except Exception as error:
                    log.warning(
                        "skipping hook %s for job %s (kind %s): its args do not decode into %s: %s",
                        registration.name,
                        job.id,
                        job.kind,
                        getattr(registration.args_type, "__name__", registration.args_type),
                        error,
                    )
                    continue
                typed = dataclasses.replace(event, args=args)
            try:
                if registration.is_async:
                    await registration.hook(typed)  # type: ignore[misc]
                else:
                    await self._run_sync(registration.hook, typed)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as error:
                # A hook that raises anything (a BaseException subclass, or CancelledError
                # of its own making) is logged and the next hook runs; only a cancellation
                # of this task (client.close()) stops the hooks.
                if cancels_this_task(error):
                    raise
                log.exception(
                    "lifecycle hook %s raised on %s of job %s (kind %s)",
                    registration.name,
                    type(event).__name__,
                    job.id,
                    job.kind,
                )
