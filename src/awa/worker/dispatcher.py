"""One queue's dispatcher and its handler slots.

The dispatcher claims jobs in batches sized to what the queue can take: the free handler
slots, plus a prefetch allowance while handlers are quick. Claimed jobs wait in a local
buffer for a slot, most urgent first. It wakes on a notification for its queue, when a slot
frees up while more jobs may wait, or at its poll interval.

A weighted queue (``start(global_max_workers=N)``) takes its slots from the process's
``WeightedPool`` before each claim and gives back what the claim did not fill. A claim held
back by a fleet-wide limit (rate, cap, per-key) says when to ask again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from awa.core.outage import FailureLog
from awa.core.tasks import cancel_and_wait
from awa.errors import AwaError
from awa.job import Job
from awa.worker.config import QueueConfig
from awa.worker.lanes import LanePositions
from awa.worker.weighted_pool import WeightedPool

log = logging.getLogger("awa.worker")

# How far ahead prefetch may reach, in expected handler time: the buffer holds at most what
# the slots are expected to finish within this window.
PREFETCH_WINDOW = 0.05

# How long shutdown waits for a claim in progress before cancelling it.
STOP_GRACE = 5.0


class QueueDispatcher:
    def __init__(
        self,
        config: QueueConfig,
        *,
        claim: Callable[
            [QueueConfig, int, LanePositions], Awaitable[tuple[list[Job[Any]], float | None]]
        ],
        execute: Callable[[Job[Any], QueueConfig], Awaitable[None]],
        backlogged: Callable[[], bool],
        pool: WeightedPool | None = None,
    ) -> None:
        self.config = config
        self._pool = pool if pool is not None and config.name in pool else None
        self._claim = claim
        # Where the next claim starts in each priority lane (see worker/lanes.py).
        self.lanes = LanePositions()
        self._execute = execute
        self._backlogged = backlogged
        # Claimed jobs waiting for a slot, in claim order (priority, then run_at, then id),
        # so that a more urgent job claimed later overtakes the buffered ones. The stop
        # markers sort after every job.
        self._ready: asyncio.PriorityQueue[tuple[tuple[float, float, int], Job[Any] | None]] = (
            asyncio.PriorityQueue()
        )
        self._stop_markers = itertools.count()
        self._wake = asyncio.Event()
        self._running = 0
        self._mean_duration: float | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._slots: list[asyncio.Task[None]] = []
        self._failures = FailureLog(log, f"claiming on queue {config.name}")
        # Whether more jobs may be waiting: the last claim filled its batch, or a notification
        # came since it started. A claim that came back short found the queue empty: a slot
        # freeing up then has nothing to claim (a job inserted since sends a notification),
        # and claiming anyway would cost a round trip per job at low load.
        self._more_waiting = True
        # Waiting for a fleet-wide limit to lift: a slot freeing up does not lift it.
        self._held = False
        # Room freed while a claim ran, which that claim may not have seen.
        self._freed_since_claim = False
        # Under a cap: jobs whose handler finished and whose completion has not committed
        # (they still count as running). A claim waits until at most half the cap is in
        # flight here, so that claims and completions keep batching: claiming as each
        # single completion commits would settle into one claim and one commit per job.
        self._uncommitted = 0
        self._follow_limits(config)
        self.claimed = 0

    def _follow_limits(self, config: QueueConfig) -> None:
        # Under a cap or a per-key limit a job stops counting when its outcome commits,
        # which for a batched completion is after its slot is free: the runtime calls
        # room_freed() then. Under a cap a free slot alone does not claim (the cap is
        # reached until the commit); under a per-key limit it does (other keys may wait).
        self._counts_until_commit = (
            config.global_max_running is not None or config.key_concurrency is not None
        )
        if not self._counts_until_commit:
            # Nothing tells this dispatcher of commits any more (a live override removed the
            # limits): forget the completions it was waiting for, or a cap set again later
            # would wait for them for ever.
            self._uncommitted = 0
        self._slot_free_claims = config.global_max_running is None
        self._half_cap = (
            config.global_max_running // 2 if config.global_max_running is not None else None
        )

    def reconfigure(self, config: QueueConfig) -> None:
        """Run with other settings from the next claim on (a live override); the handler
        slots stay as started. The lanes are read from their heads again, and a wait for
        the poll interval or a limit ends now."""
        self.config = config
        self._follow_limits(config)
        self.lanes.reset()
        self.wake()

    @property
    def running(self) -> int:
        return self._running

    @property
    def buffered(self) -> int:
        return self._ready.qsize()

    def start(self) -> None:
        name = self.config.name
        self._slots = [
            asyncio.create_task(self._slot(), name=f"awa-slot-{name}-{index}")
            for index in range(self.config.max_workers)
        ]
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"awa-dispatch-{name}")

    def wake(self) -> None:
        """New jobs may be available (a notification, a reconnect): claim when room allows."""
        self._more_waiting = True
        self._wake.set()

    @property
    def counts_until_commit(self) -> bool:
        """Whether its jobs count against a fleet-wide limit until their outcome commits."""
        return self._counts_until_commit

    def awaiting_commit(self) -> None:
        """A job of this queue finished its handler; its completion is still to commit."""
        self._uncommitted += 1

    def room_freed(self, committed: int = 0) -> None:
        """Slots or limits came free elsewhere (``committed`` completions of this queue, a
        slot of the weighted pool): claim again if jobs were left waiting."""
        self._uncommitted = max(0, self._uncommitted - committed)
        self._freed_since_claim = True
        if self._more_waiting:
            self._wake.set()

    def _prefetch_allowance(self) -> int:
        cap = self.config.prefetch
        if cap == 0 or self._mean_duration is None:
            return 0
        expected = self.config.max_workers * PREFETCH_WINDOW / max(self._mean_duration, 1e-6)
        return min(cap, int(expected))

    def _claim_size(self) -> int:
        if self._backlogged():
            return 0
        allowance = self._prefetch_allowance()
        buffered = self._ready.qsize()
        room = self.config.max_workers + allowance - self._running - buffered
        if room <= 0:
            return 0
        if self._half_cap is not None and (
            self._running + buffered + self._uncommitted > self._half_cap
        ):
            return 0
        free_slots = self.config.max_workers - self._running
        # Claim at once when a slot would otherwise idle; otherwise refill the prefetch
        # buffer only once it runs low, so claims stay large.
        if (buffered == 0 and free_slots > 0) or buffered < allowance // 2:
            size = min(room, self.config.claim_batch_size)
            return size if self._pool is None else self._pool.acquire(self.config.name, size)
        return 0

    async def _dispatch(self) -> None:
        delay = 0.1
        while not self._stopping:
            self._wake.clear()
            size = self._claim_size()
            if size > 0:
                # This claim tells whether more jobs wait; a notification arriving while it
                # runs sets the flag again, and the claim's result must not erase that.
                self._more_waiting = False
                self._freed_since_claim = False
                try:
                    jobs, retry_after = await self._claim(self.config, size, self.lanes)
                except Exception as error:
                    self._more_waiting = True
                    if self._pool is not None:
                        self._pool.release(self.config.name, size)
                    # Whatever it is (database down, schema not migrated yet, a bug), the
                    # dispatcher must survive it: a dead dispatcher claims nothing, silently.
                    self._failures.failed(
                        error,
                        then="retrying with backoff",
                        traceback=not isinstance(error, AwaError),
                    )
                    await self._idle(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.1
                self._failures.succeeded()
                for job in jobs:
                    self._ready.put_nowait((job._claim_order, job))
                self.claimed += len(jobs)
                if self._pool is not None and len(jobs) < size:
                    # The queue ran dry unless a limit held jobs back.
                    self._pool.release(
                        self.config.name, size - len(jobs), satisfied=retry_after is None
                    )
                if retry_after is not None:
                    # A fleet-wide limit held jobs back: they wait, ask again when it lifts
                    # (at once if room came free during the claim).
                    self._more_waiting = True
                    if self._freed_since_claim:
                        await asyncio.sleep(0)  # let slots start the claimed jobs
                        continue
                    self._held = True
                    await self._idle(min(retry_after, self.config.poll_interval))
                    self._held = False
                    continue
                if len(jobs) == size:
                    self._more_waiting = True
                    await asyncio.sleep(0)  # let slots start before claiming more
                    continue
            await self._idle(self.config.poll_interval)

    async def _idle(self, seconds: float) -> None:
        """Wait for a wakeup (a notification, a free slot, shutdown), at most ``seconds``."""
        # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as
        # the wakeup fires, and asyncio.timeout does not.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _slot(self) -> None:
        ready = self._ready
        while True:
            _, job = await ready.get()
            if job is None:
                return
            self._running += 1
            started = time.perf_counter()
            try:
                await self._execute(job, self.config)
            finally:
                self._running -= 1
                if self._pool is not None:
                    self._pool.release(self.config.name)
                elapsed = time.perf_counter() - started
                mean = self._mean_duration
                self._mean_duration = elapsed if mean is None else mean * 0.9 + elapsed * 0.1
                if (
                    self._more_waiting
                    and self._slot_free_claims
                    and not self._held
                    and ready.qsize() <= self._prefetch_allowance() // 2
                ):
                    self._wake.set()

    async def stop_claiming(self, grace: float = STOP_GRACE) -> list[Job[Any]]:
        """Stop the dispatcher; returns the claimed jobs no slot has started.

        The dispatcher is stopped by a flag, not cancelled: a claim in progress finishes and
        its jobs land in the buffer, so a claim committed in the database is never lost.
        Only a claim still unfinished after ``grace`` seconds (the database is unreachable
        and the claim waits for a connection) is cancelled; should it have committed after
        all, its jobs stay running without a heartbeat and rescue retries them.
        """
        self._stopping = True
        self._wake.set()
        if self._dispatcher is not None:
            _, pending = await asyncio.wait([self._dispatcher], timeout=grace)
            if pending:
                log.warning(
                    "queue %s: a claim did not finish within %gs of shutdown; cancelled",
                    self.config.name,
                    grace,
                )
                await cancel_and_wait(self._dispatcher)
        unstarted = []
        while not self._ready.empty():
            _, job = self._ready.get_nowait()
            if job is not None:
                unstarted.append(job)
        return unstarted

    async def drain(self, timeout: float) -> list[asyncio.Task[None]]:
        """Let busy slots finish; returns the slots still busy after ``timeout``."""
        for _ in self._slots:
            self._ready.put_nowait(((math.inf, math.inf, next(self._stop_markers)), None))
        if not self._slots:
            return []
        _, pending = await asyncio.wait(self._slots, timeout=timeout)
        return list(pending)
