"""An awa task registered on the Django integration's client (settings.AWA TASK_MODULES)."""

from __future__ import annotations

import dataclasses

import awa
from awa.contrib.django import get_client


@dataclasses.dataclass
class Ping:
    text: str


@get_client().task(Ping, queue="default")
async def ping(job: awa.Job[Ping]) -> None:
    job.record_output({"pong": job.args.text})
