"""A worker process for the batch crash test (tests/test_workflows_crash.py).

Works the ``members`` queue (every third member fails terminally, the rest complete after a
short random pause) and the ``summaries`` queue (the fan-in job, which records the summary it
received in a table). Reads ``DATABASE_URL``; prints ``ready`` once started, then runs until
it is killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random

import awa


@dataclasses.dataclass
class Member:
    n: int


@dataclasses.dataclass
class Summary:
    label: str


async def main() -> None:
    client = awa.AsyncClient(os.environ["DATABASE_URL"], max_connections=12)

    @client.task(Member, queue="members")
    async def member(job: awa.Job[Member]) -> None:
        await asyncio.sleep(random.uniform(0.01, 0.05))
        if job.args.n % 3 == 0:
            raise awa.TerminalError(f"member {job.args.n} fails")

    @client.task(Summary, queue="summaries")
    async def summary(job: awa.Job[Summary]) -> None:
        async with await client.transaction() as tx:
            await tx.execute(
                "INSERT INTO batch_summaries (job_id, summary) VALUES (%s, %s)",
                job.id,
                json.dumps(job.metadata["awa:batch"]),
            )

    await client.start(
        {"members": {"max_workers": 8, "poll_interval": 0.05}, "summaries": 2},
        promote_interval=0.05,
        heartbeat_interval=0.2,
        heartbeat_staleness=1.0,
        heartbeat_rescue_interval=0.2,
        leader_election_interval=0.2,
    )
    print("ready", flush=True)
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main())
