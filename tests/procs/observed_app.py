"""The task module of the observability tests (tests/test_observability.py): every outcome
once, follow-ups from a spec and staged by a handler, and a follow-up staged then
discarded by a job that parks on a callback. Run by ``awa worker observed_app:client``."""

from __future__ import annotations

import asyncio
import dataclasses

import awa

client = awa.AsyncClient(application_name="awa-observed")


@dataclasses.dataclass
class Signup:
    user: str


@dataclasses.dataclass
class Welcome:
    user: str


@dataclasses.dataclass
class Receipt:
    user: str


@dataclasses.dataclass
class Flaky:
    n: int


@dataclasses.dataclass
class Doomed:
    n: int


@dataclasses.dataclass
class Sleepy:
    n: int


@dataclasses.dataclass
class Dropped:
    n: int


@dataclasses.dataclass
class Parker:
    n: int


@client.task(Signup, queue="obs")
async def signup(job: awa.Job[Signup]) -> None:
    job.enqueue_on_completion(Receipt(job.args.user), queue="obs")


client.on_completed_enqueue_with(
    Signup, lambda args, row: awa.EnqueueRequest(Welcome(args.user)).queue("obs")
)


@client.task(Welcome, queue="obs")
async def welcome(job: awa.Job[Welcome]) -> None:
    return None


@client.task(Receipt, queue="obs")
async def receipt(job: awa.Job[Receipt]) -> None:
    return None


@client.task(Flaky, queue="obs")
async def flaky(job: awa.Job[Flaky]) -> None:
    if job.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return None


@client.task(Doomed, queue="obs")
async def doomed(job: awa.Job[Doomed]) -> None:
    raise awa.TerminalError("this job fails for good")


@client.task(Sleepy, queue="obs")
async def sleepy(job: awa.Job[Sleepy]) -> awa.Snooze | None:
    # A snooze keeps the attempt number: this process remembers the first run instead.
    if job.id in _snoozed:
        return None
    _snoozed.add(job.id)
    return awa.Snooze(0.1)


_snoozed: set[int] = set()


@client.task(Dropped, queue="obs")
async def dropped(job: awa.Job[Dropped]) -> awa.Cancel:
    return awa.Cancel("not needed")


@client.task(Parker, queue="obs")
async def parker(job: awa.Job[Parker]) -> awa.WaitForCallback:
    job.enqueue_on_completion(Receipt("never"), queue="obs")
    token = await job.register_callback(timeout_seconds=3600)
    return awa.WaitForCallback(token)


@dataclasses.dataclass
class Broken:
    n: int


@client.task(Broken, queue="obs")
async def broken(job: awa.Job[Broken]) -> None:
    return None


def _no_follow_up(args: Broken, row: awa.JobRow) -> awa.EnqueueRequest[Welcome]:
    raise RuntimeError("this follow-up cannot be built")


client.on_completed_enqueue_with(Broken, _no_follow_up)


@dataclasses.dataclass
class Slow:
    seconds: float  # how long it waits, at most, for an operator to cancel it


@client.task(Slow, queue="obs")
async def slow(job: awa.Job[Slow]) -> None:
    # Runs until an operator cancels it, then finishes anyway: its outcome is stale.
    deadline = asyncio.get_running_loop().time() + job.args.seconds
    while not job.is_cancelled() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
