"""A worker process for the fault tests (tests/test_faults.py).

Works one queue of ``FaultJob`` with one of three handlers (``--mode``):

- ``work``: records its start in ``fault_starts``, sleeps a little, then records its side
  effect in ``fault_effects`` keyed by (job id, run_lease), each in a transaction of its own
  (retried until it lands, so an outage cannot lose it; a duplicate of the same attempt is
  ignored). A job completed by exactly one attempt has exactly one effect row.
- ``hang``: sleeps for an hour, ignoring cancellation (a poison job for deadline rescue).
- ``exit``: kills its own process with ``os._exit(1)`` (a poison job for heartbeat rescue).

Every process also records the ``Rescued`` events it sees in ``fault_rescued`` and enqueues
an ``on_rescued_enqueue`` follow-up (kind ``fault_rescue_note``, queue ``fault_notes``, which
nobody works). The connections carry ``application_name`` ``awa-fault-<name>``.

Reads ``DATABASE_URL``; logs to stderr; prints ``ready`` once the runtime has started, then
runs until it is killed or gets SIGTERM (graceful shutdown).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import random
import signal
import time
from typing import Any

import awa

NOTES_QUEUE = "fault_notes"
PID = os.getpid()


@dataclasses.dataclass
class FaultJob:
    n: int


@dataclasses.dataclass
class FaultRescueNote:
    job_id: int
    run_lease: int
    reason: str


async def record(client: awa.AsyncClient, statement: str, params: tuple[Any, ...]) -> None:
    """Run one INSERT in a transaction of its own, retrying through outages (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with client.connection() as conn:
                await conn.execute(statement, params)
            return
        except awa.AwaError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--queue", default="fault")
    parser.add_argument("--mode", choices=["work", "hang", "exit"], default="work")
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--sleep", type=float, nargs=2, default=[0.05, 0.15])
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--staleness", type=float, default=2.0)
    parser.add_argument("--rescue-interval", type=float, default=0.5)
    return parser.parse_args()


async def main() -> None:
    args = options()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
    )
    client = awa.AsyncClient(
        os.environ["DATABASE_URL"], max_connections=8, application_name=f"awa-fault-{args.name}"
    )

    @client.task(FaultJob, queue=args.queue)
    async def handle(job: awa.Job[FaultJob]) -> None:
        if args.mode == "exit":
            os._exit(1)
        if args.mode == "hang":
            await asyncio.Event().wait()  # hangs for good; is_cancelled() is never looked at
        key = (job.id, job.run_lease, PID)
        await record(
            client,
            "INSERT INTO fault_starts (job_id, run_lease, pid) VALUES (%s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            key,
        )
        await asyncio.sleep(random.uniform(*args.sleep))
        await record(
            client,
            "INSERT INTO fault_effects (job_id, run_lease, pid) VALUES (%s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            key,
        )

    @client.on_event(FaultJob)
    async def rescued(event: awa.JobEvent[FaultJob]) -> None:
        if isinstance(event, awa.Rescued):
            await record(
                client,
                "INSERT INTO fault_rescued (job_id, run_lease, reason, pid)"
                " VALUES (%s, %s, %s, %s)",
                (event.job.id, event.job.run_lease, str(event.reason), PID),
            )

    client.on_rescued_enqueue_with(
        FaultJob,
        lambda job_args, job, reason: awa.EnqueueRequest(
            FaultRescueNote(job.id, job.run_lease, str(reason))
        ).queue(NOTES_QUEUE),
    )

    await client.start(
        {
            args.queue: {
                "max_workers": args.max_workers,
                "poll_interval": 0.2,
                "deadline_duration": args.deadline,
            }
        },
        heartbeat_interval=args.heartbeat,
        heartbeat_staleness=args.staleness,
        heartbeat_rescue_interval=args.rescue_interval,
        deadline_rescue_interval=args.rescue_interval,
        callback_rescue_interval=args.rescue_interval,
        leader_election_interval=0.5,
        leader_check_interval=1.0,
        promote_interval=0.1,
    )
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await client.shutdown(timeout=1)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
