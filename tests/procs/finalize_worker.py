"""A worker process for the completion-in-transaction crash test (tests/test_finalize_crash.py).

Each ``charge`` job writes one row into the ``ledger`` table and completes, in one
transaction: ``job.finalize()`` for even ``n``, the worker's own psycopg connection with
``job.complete_in()`` for odd ``n``. Jobs with ``n % 10 == 0`` fail for good inside the
transaction, after their write. On some attempts (decided by the job id and attempt, so runs
repeat) the process SIGKILLs itself at one point around the commit, after noting the point
in the ``kills`` table:

- ``before``: before the transaction begins;
- ``inside``: after the business write, before the completion is written;
- ``written``: after the completion is written, before COMMIT is sent;
- ``commit``: while COMMIT is in flight (a timer fires within a few milliseconds);
- ``after``: after the commit, before the handler returns.

``MODE=plain`` is the control: the write commits in a transaction of its own and the handler
returns normally (the usual at-least-once handler), so a kill after it duplicates the write.
Reads ``DATABASE_URL``, ``KILL_RATE`` and ``KILL_ATTEMPTS``; runs until it is killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import threading

import psycopg

import awa

POINTS = ("before", "inside", "written", "commit", "after")


@dataclasses.dataclass
class Charge:
    n: int


def kill_point(job: awa.Job[Charge]) -> str | None:
    """Where this attempt dies, if it does: only the first ``KILL_ATTEMPTS`` attempts may."""
    chance = random.Random(f"{job.id}:{job.attempt}")
    last = int(os.environ.get("KILL_ATTEMPTS", "3"))
    if job.attempt > last or chance.random() >= float(os.environ["KILL_RATE"]):
        return None
    if job.args.n % 2 == 0:  # finalize(): no moment between the completion and its COMMIT
        return chance.choice([point for point in POINTS if point != "written"])
    return chance.choice([*POINTS, "written"])  # the moment only these jobs have, twice


def die(url: str, job: awa.Job[Charge], point: str) -> None:
    with psycopg.connect(url, autocommit=True) as note:
        note.execute(
            "INSERT INTO kills (job_id, attempt, point) VALUES (%s, %s, %s)",
            (job.id, job.attempt, point),
        )
    os.kill(os.getpid(), signal.SIGKILL)


async def main() -> None:
    url = os.environ["DATABASE_URL"]
    plain = os.environ.get("MODE") == "plain"
    client = awa.AsyncClient(url, max_connections=12)

    @client.task(Charge, queue="charges")
    async def charge(job: awa.Job[Charge]) -> None:
        point = kill_point(job)
        if point == "before":
            die(url, job, point)
        if plain:
            async with client.transaction() as tx:
                await tx.execute("INSERT INTO ledger VALUES (%s, %s)", job.id, job.attempt)
            if point is not None:
                die(url, job, point)
            return
        if job.args.n % 2 == 0:
            async with job.finalize() as tx:
                await tx.execute("INSERT INTO ledger VALUES (%s, %s)", job.id, job.attempt)
                if point == "inside":
                    die(url, job, point)
                if job.args.n % 10 == 0:
                    raise awa.TerminalError("declined")
                if point == "commit":
                    threading.Timer(random.uniform(0, 0.003), die, (url, job, point)).start()
            # finalize() writes the completion as its block ends: "written" is the same
            # moment as "commit" here; the odd jobs below separate them.
        else:
            connecting = psycopg.AsyncConnection.connect(url)
            async with await connecting as own, own.transaction():
                await own.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, job.attempt))
                if point == "inside":
                    die(url, job, point)
                await job.complete_in(own)
                if point == "written":
                    die(url, job, point)
                if point == "commit":
                    threading.Timer(random.uniform(0, 0.003), die, (url, job, point)).start()
        if point == "after":
            die(url, job, point)

    await client.start(
        {"charges": {"max_workers": 4, "poll_interval": 0.05}},
        promote_interval=0.05,
        heartbeat_interval=0.2,
        heartbeat_staleness=1.0,
        heartbeat_rescue_interval=0.2,
        leader_election_interval=0.2,
    )
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main())
