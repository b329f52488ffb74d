"""A worker process for the follow-up crash test (tests/test_followups_crash.py).

Works the ``crash_triggers`` queue: every ``CrashTrigger`` completes after a short random
pause and, through ``on_completed_enqueue``, inserts a ``CrashFollowUp`` naming it in the
same transaction. The follow-ups go to a queue nobody works, so the test can count them.
Reads ``DATABASE_URL``; prints ``ready`` once the runtime has started, then runs until it is
killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random

import awa

TRIGGER_QUEUE = "crash_triggers"
FOLLOW_UP_QUEUE = "crash_follow_ups"


@dataclasses.dataclass
class CrashTrigger:
    n: int


@dataclasses.dataclass
class CrashFollowUp:
    n: int
    triggered_by_job_id: int


async def main() -> None:
    client = awa.AsyncClient(os.environ["DATABASE_URL"], max_connections=12)

    @client.task(CrashTrigger, queue=TRIGGER_QUEUE)
    async def handle(job: awa.Job[CrashTrigger]) -> None:
        await asyncio.sleep(random.uniform(0.01, 0.05))

    client.on_completed_enqueue_with(
        CrashTrigger,
        lambda args, job: awa.EnqueueRequest(CrashFollowUp(args.n, job.id)).queue(FOLLOW_UP_QUEUE),
    )
    await client.start(
        {TRIGGER_QUEUE: {"max_workers": 8, "poll_interval": 0.05}}, promote_interval=0.05
    )
    print("ready", flush=True)
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main())
