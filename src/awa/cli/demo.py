"""``awa demo``: a worker processing real jobs, end to end, in a few seconds.

Signups are inserted in one transaction; a worker runs them (some fail once and retry, one
is cancelled, one fails for good), and each completed signup leads to a welcome email job
handled by a plain ``def`` handler in a thread. Runs on ``DATABASE_URL`` or, without one,
on the embedded server.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import time
import uuid

import click
from rich.console import Console

import awa
from awa.cli.group import database_url_from_context, main, print_table
from awa.sql import query

SIGNUP_QUEUE = "demo-signups"
EMAIL_QUEUE = "demo-emails"


@dataclasses.dataclass
class Signup:
    user_id: int
    email: str


@dataclasses.dataclass
class WelcomeEmail:
    user_id: int
    email: str
    signup_job_id: int


def build_demo(client: awa.AsyncClient, console: Console, run: str) -> None:
    """Register the demo's handlers, lifecycle hook and follow-up on ``client``."""

    @client.task(Signup, queue=SIGNUP_QUEUE)
    async def handle_signup(job: awa.Job[Signup]) -> awa.RetryAfter | awa.Cancel | None:
        signup = job.args
        job.set_progress(50, "creating the account")
        await asyncio.sleep(0.02)
        if signup.email.endswith("@blocked.example"):
            return awa.Cancel("address is on the block list")
        if "@" not in signup.email:
            raise awa.TerminalError(f"not an email address: {signup.email!r}")
        if signup.user_id % 4 == 0 and job.attempt == 1:
            return awa.RetryAfter(0.3)  # the mail provider is busy: try again shortly
        return None

    # Durable follow-up: the welcome email is inserted in the same transaction that marks
    # the signup completed, so a crash can never lose it (or send it for a failed signup).
    @client.on_completed_enqueue_with(Signup)
    def welcome_email(signup: Signup, job: awa.JobRow) -> awa.EnqueueRequest[WelcomeEmail]:
        email = WelcomeEmail(signup.user_id, signup.email, job.id)
        return awa.EnqueueRequest(email).queue(EMAIL_QUEUE).metadata({"demo_run": run})

    # Lifecycle hook: observation only (best-effort, after each transition commits).
    @client.on_event(Signup)
    async def report(event: awa.JobEvent[Signup]) -> None:
        user = event.args.user_id
        match event:
            case awa.Completed(duration=duration):
                took = duration.total_seconds() * 1000
                console.print(f"  signup {user}: completed in {took:.0f} ms, welcome email queued")
            case awa.Retried(next_run_at=when):
                wait = (
                    (when - event.job.finalized_at).total_seconds() if event.job.finalized_at else 0
                )
                console.print(
                    f"  signup {user}: attempt {event.job.attempt} asked to retry in {wait:.1f}s"
                )
            case awa.Cancelled(reason=reason):
                console.print(f"  signup {user}: cancelled ({reason})")
            case awa.Exhausted(error=error):
                console.print(f"  signup {user}: failed for good: {error.splitlines()[0]}")

    @client.task(WelcomeEmail, queue=EMAIL_QUEUE)
    def send_welcome(job: awa.Job[WelcomeEmail]) -> None:
        time.sleep(0.01)  # a blocking client library: runs in a worker thread
        console.print(f"  email to {job.args.email} sent (for signup job {job.args.signup_job_id})")


async def run_demo(url: str | None, signups: int, console: Console) -> dict[str, Counter]:
    """Insert the demo jobs, work them until every one has settled; returns, per queue,
    how many jobs ended in each state."""
    run = uuid.uuid4().hex
    client = awa.AsyncClient(url, application_name="awa-demo")
    try:
        await client.migrate()
        build_demo(client, console, run)
        users = [Signup(n, f"user{n}@example.com") for n in range(1, signups + 1)]
        users.append(Signup(signups + 1, "mallory@blocked.example"))
        users.append(Signup(signups + 2, "not-an-address"))
        tagged: awa.InsertKwargs = {"metadata": {"demo_run": run}, "queue": SIGNUP_QUEUE}
        async with client.transaction() as tx:
            inserted = await tx.insert_many(users, **tagged)
            soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
            later = await tx.insert(
                Signup(signups + 3, "late@example.com"),
                queue=SIGNUP_QUEUE,
                metadata={"demo_run": run},
                run_at=soon,
            )
        console.print(
            f"inserted {len(inserted)} signups, and one more scheduled a second from now "
            f"(jobs {inserted[0].id} to {later.id})"
        )
        async with client.run(
            {SIGNUP_QUEUE: 4, EMAIL_QUEUE: 2}, promote_interval=0.05, shutdown_timeout=5
        ):
            return await _wait_until_settled(client, run)
    finally:
        await client.close()


Counter = collections.Counter[str]
_UNSETTLED = {"available", "running", "scheduled", "retryable"}


async def _wait_until_settled(
    client: awa.AsyncClient, run: str, timeout: float = 60.0
) -> dict[str, Counter]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with client.connection() as conn:
            cursor = await conn.execute(query("demo_states"), {"run": run})
            rows = await cursor.fetchall()
        states: dict[str, Counter] = collections.defaultdict(collections.Counter)
        for queue, state, jobs in rows:
            states[queue][state] = jobs
        if EMAIL_QUEUE in states and not any(
            counts[state] for counts in states.values() for state in _UNSETTLED
        ):
            return states
        await asyncio.sleep(0.1)
    raise awa.AwaError("the demo jobs did not settle within a minute")


@main.command()
@click.option("--signups", default=8, show_default=True, help="How many signups to insert.")
@click.pass_context
def demo(ctx: click.Context, signups: int) -> None:
    """Run a worker on demo jobs: retries, a cancellation, a failure, follow-up emails."""
    console = Console(highlight=False)
    started = time.monotonic()
    states = asyncio.run(run_demo(database_url_from_context(ctx), signups, console))
    console.print(f"\nevery demo job settled in {time.monotonic() - started:.1f}s:")
    print_table(
        ["QUEUE", "COMPLETED", "CANCELLED", "FAILED"],
        [
            [queue, counts["completed"], counts["cancelled"], counts["failed"]]
            for queue, counts in sorted(states.items())
        ],
    )
