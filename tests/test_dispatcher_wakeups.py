"""When the queue dispatcher claims again, driven through its own interface with a claim and
an executor made for the test (no database: these check its wakeup bookkeeping, which the
database tests can only reach by chance timing)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator
from typing import Any

from awa.worker.config import QueueConfig
from awa.worker.dispatcher import QueueDispatcher
from awa.worker.lanes import LanePositions


@dataclasses.dataclass
class FakeJob:
    """What the dispatcher reads of a claimed job: the order it was claimed in."""

    name: str
    priority: int = 2
    id: int = dataclasses.field(default_factory=itertools.count(1).__next__)

    @property
    def _claim_order(self) -> tuple[int, float, int]:
        return (self.priority, 0.0, self.id)


def jobs(*names: str) -> list[FakeJob]:
    return [FakeJob(name) for name in names]


class Scripted:
    """Claims that return what the test hands them, one at a time, and handlers that run
    until the test releases them."""

    def __init__(self) -> None:
        self.claims: asyncio.Queue[asyncio.Future[list[Any]]] = asyncio.Queue()
        self.released: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.stopping = False

    async def claim(
        self, config: QueueConfig, limit: int, lanes: LanePositions
    ) -> tuple[list[Any], None]:
        answer: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        await self.claims.put(answer)
        return await answer, None

    async def execute(self, job: FakeJob, config: QueueConfig) -> None:
        self.started.append(job.name)
        if not self.stopping:
            await self.released.setdefault(job.name, asyncio.Event()).wait()

    async def next_claim(self) -> asyncio.Future[list[Any]]:
        async with asyncio.timeout(5):
            return await self.claims.get()

    async def stop(self, dispatcher: QueueDispatcher) -> None:
        """Release every handler, answer any claim in flight (empty), and stop."""
        self.stopping = True
        for event in self.released.values():
            event.set()
        stopping = asyncio.create_task(dispatcher.stop_claiming(grace=1))
        while not stopping.done():
            try:
                self.claims.get_nowait().set_result([])
            except asyncio.QueueEmpty:
                await asyncio.sleep(0.005)
        await stopping
        await dispatcher.drain(timeout=1)

    async def started_job(self, job: str) -> None:
        async with asyncio.timeout(5):
            while job not in self.started:
                await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running(
    script: Scripted, *, max_workers: int, prefetch: int, quick: bool = False
) -> AsyncIterator[QueueDispatcher]:
    """A started dispatcher on the script's claims (30 s poll: only wakeups bring claims);
    ``quick`` handlers give it the full prefetch allowance. Stopped on exit."""
    config = QueueConfig("default", max_workers=max_workers, prefetch=prefetch, poll_interval=30)
    dispatcher = QueueDispatcher(
        config, claim=script.claim, execute=script.execute, backlogged=lambda: False
    )
    if quick:
        dispatcher._mean_duration = 0.001
    dispatcher.start()
    try:
        yield dispatcher
    finally:
        await script.stop(dispatcher)


async def settle() -> None:
    """Let every ready task run (no clock involved): a claim due now is queued after this."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_notification_during_a_short_claim_is_not_forgotten() -> None:
    script = Scripted()
    async with running(script, max_workers=1, prefetch=4, quick=True) as dispatcher:
        first = await script.next_claim()
        # A job is inserted while the claim runs, too late for its snapshot: its notification
        # arrives before the claim comes back short (3 of the 5 asked for).
        dispatcher.wake()
        first.set_result(jobs("a", "b", "c"))
        await script.started_job("a")
        # One slot busy, two jobs buffered: no room worth a claim until a slot frees.
        assert script.claims.empty()
        script.released["a"].set()
        # The freed slot must claim again (the notified job waits), not sit out the 30 s poll.
        second = await script.next_claim()
        second.set_result([])


async def test_a_slot_freed_after_a_short_claim_does_not_claim() -> None:
    script = Scripted()
    async with running(script, max_workers=2, prefetch=0) as dispatcher:
        # Two slots free, one job found: the claim came back short, the queue is empty.
        (await script.next_claim()).set_result(jobs("a"))
        await script.started_job("a")
        script.released["a"].set()
        await settle()
        assert script.claims.empty()
        # A notification does bring a claim.
        dispatcher.wake()
        (await script.next_claim()).set_result(jobs("b"))
        await script.started_job("b")


async def test_a_more_urgent_job_overtakes_the_buffered_ones() -> None:
    script = Scripted()
    async with running(script, max_workers=1, prefetch=4, quick=True) as dispatcher:
        low = [FakeJob(name, priority=4) for name in ("low-1", "low-2")]
        (await script.next_claim()).set_result(low)
        await script.started_job("low-1")
        # A low-priority job waits in the buffer when an urgent one arrives.
        dispatcher.wake()
        (await script.next_claim()).set_result([FakeJob("urgent", priority=1)])
        await settle()  # the claimed job reaches the buffer
        script.released["low-1"].set()
        await script.started_job("urgent")
        assert script.started == ["low-1", "urgent"]
