"""A worker process for the periodic-job failover test (tests/test_periodic_failover.py).

Declares one schedule, ``tick`` (every second, ``catch_up``), whose jobs go to queue
``ticks`` and complete at once. Its connections carry ``application_name``
``awa-cron-<name>``, so the test can tell which process leads maintenance. Reads
``DATABASE_URL``; prints ``ready`` once the runtime has started; runs until killed or
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal

import awa


@dataclasses.dataclass
class Tick:
    pass


async def main(name: str) -> None:
    client = awa.AsyncClient(application_name=f"awa-cron-{name}")

    @client.task(Tick, queue="ticks")
    async def tick(job: awa.Job[Tick]) -> None:
        return None

    client.periodic("tick", "* * * * * *", Tick, Tick(), missed_fire_policy="catch_up")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await client.start(
        {"ticks": 4},
        cron_interval=0.2,
        leader_election_interval=0.2,
        leader_check_interval=0.5,
        heartbeat_interval=0.5,
        heartbeat_staleness=5.0,
    )
    print("ready", flush=True)
    await stop.wait()
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    asyncio.run(main(parser.parse_args().name))
