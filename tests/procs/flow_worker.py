"""A worker process for the fleet-wide flow-control tests (tests/test_flow_fleet.py).

Runs the handler of ``Call`` (sleeps ``seconds``) on the queues given as JSON (``start()``'s
dict form) with the runtime options given as JSON. Reads ``DATABASE_URL``; prints ``ready``
once the runtime has started; runs until killed or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal

import awa


@dataclasses.dataclass
class Call:
    seconds: float = 0.0


async def main(name: str, queues: dict[str, object], options: dict[str, object]) -> None:
    client = awa.AsyncClient(application_name=f"awa-flow-{name}")

    @client.task(Call, queue="api")
    async def call(job: awa.Job[Call]) -> None:
        await asyncio.sleep(job.args.seconds)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await client.start(queues, **options)
    print("ready", flush=True)
    await stop.wait()
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--queues", required=True)
    parser.add_argument("--options", default="{}")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.name, json.loads(arguments.queues), json.loads(arguments.options)))
