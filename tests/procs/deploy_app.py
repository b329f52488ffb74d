"""The task module of the least-privilege roles test (tests/test_deployment_roles.py), run as
``awa worker deploy_app:client`` under the worker role of docs/deployment.md.

Its jobs take the worker through every statement family it runs in production: plain
completions, a follow-up staged by the handler (inserted with COPY, so it needs the id
sequence), a retry (promoted again by the leader), a plain ``def`` handler (a thread), a
queue with a rate limit (``awa.claim_limited`` and ``awa.queue_limits``), and a periodic
job (``awa.cron_jobs``, fired by the leader).
"""

from __future__ import annotations

import dataclasses

import awa

client = awa.AsyncClient(application_name="awa-deploy-worker")


@dataclasses.dataclass
class Greet:
    n: int


@dataclasses.dataclass
class Receipt:
    n: int


@dataclasses.dataclass
class Flaky:
    n: int


@dataclasses.dataclass
class Limited:
    n: int


@dataclasses.dataclass
class Tick:
    pass


@client.task(Greet, queue="deploy")
async def greet(job: awa.Job[Greet]) -> None:
    job.enqueue_on_completion(Receipt(job.args.n))


@client.task(Receipt, queue="deploy")
async def receipt(job: awa.Job[Receipt]) -> None:
    job.record_output({"receipt": job.args.n})


@client.task(Flaky, queue="deploy")
def flaky(job: awa.Job[Flaky]) -> awa.RetryAfter | None:
    # The first attempt asks to run again shortly: the leader promotes the retryable job.
    return awa.RetryAfter(0.1) if job.attempt == 1 else None


@client.task(Limited, queue="limited")
async def limited(job: awa.Job[Limited]) -> None:
    return None


@client.task(Tick, queue="ticks")
async def tick(job: awa.Job[Tick]) -> None:
    return None


client.periodic("deploy-tick", "* * * * * *", Tick, Tick())
