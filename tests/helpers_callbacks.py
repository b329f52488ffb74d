"""Helpers for the callback tests: a payment job that parks on a callback, and rows parked
by plain SQL for the tests of the resolution functions alone.

A parked job is one whose handler registered a callback and returned WaitForCallback; the
tests then play the outside system that answers it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import awa
from helpers_worker import wait_for_state
from jobs_helpers import Conn, must_job_row

QUEUE = "payments"


@dataclasses.dataclass
class Payment:
    order: int = 1


@dataclasses.dataclass
class Receipt:
    order: int
    payment_job_id: int


def register_parking_task(
    client: awa.AsyncClient, *, queue: str = QUEUE, **register: Any
) -> list[awa.Job[Payment]]:
    """Register a Payment handler that registers a callback (with ``register`` options) and
    returns WaitForCallback; returns the list the handler appends each attempt's job to."""
    runs: list[awa.Job[Payment]] = []

    @client.task(Payment, queue=queue)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        runs.append(job)
        token = await job.register_callback(**register)
        return awa.WaitForCallback(token)

    return runs


async def wait_parked(conn: Conn, job_id: int, timeout: float = 5.0) -> str:
    """Wait until the job is parked in waiting_external; returns its callback id."""
    row = await wait_for_state(conn, job_id, "waiting_external", timeout)
    assert row["callback_id"] is not None, f"job {job_id} parked without a callback: {row}"
    return str(row["callback_id"])


def callback_of(conn: Conn, job_id: int) -> str | None:
    value = must_job_row(conn, job_id)["callback_id"]
    return None if value is None else str(value)


async def insert_parked(
    client: awa.AsyncClient,
    conn: Conn,
    *,
    state: str = "waiting_external",
    args: Any = None,
    timeout_seconds: float = 3600.0,
    **expressions: str | None,
) -> tuple[int, str]:
    """A job put straight into ``state`` (waiting_external, or running as a claimed attempt
    that registered but has not parked yet) holding a fresh callback with the given CEL
    expressions (filter, on_complete, on_fail, transform), written with plain SQL as a
    worker would. Returns (job id, callback id)."""
    job = await client.insert(args if args is not None else Payment(), queue="nobody-works-this")
    callback_id = str(uuid.uuid4())
    conn.execute(
        "UPDATE awa.jobs SET state = %(state)s::awa.job_state, attempt = 1, run_lease = 1,"
        " attempted_at = now(),"
        " heartbeat_at = CASE WHEN %(state)s = 'running' THEN now() END,"
        " callback_id = %(cb)s::uuid,"
        " callback_timeout_at = now() + make_interval(secs => %(timeout)s),"
        " callback_filter = %(filter)s, callback_on_complete = %(on_complete)s,"
        " callback_on_fail = %(on_fail)s, callback_transform = %(transform)s"
        " WHERE id = %(id)s",
        {
            "state": state,
            "cb": callback_id,
            "timeout": timeout_seconds,
            "id": job.id,
            "filter": expressions.get("filter"),
            "on_complete": expressions.get("on_complete"),
            "on_fail": expressions.get("on_fail"),
            "transform": expressions.get("transform"),
        },
    )
    return job.id, callback_id


def last_error(conn: Conn, job_id: int) -> dict[str, Any]:
    errors = must_job_row(conn, job_id)["errors"]
    assert errors, f"job {job_id} has no errors"
    entry: dict[str, Any] = errors[-1]
    return entry


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def serving_receiver(
    env: dict[str, str], *args: str, cwd: Path | None = None, group: str = "callback"
) -> Iterator[str]:
    """Run ``awa <group> serve`` on a free port until the block ends (``group="callbacks"``:
    the deprecated spelling); waits, with a deadline, until it accepts connections and
    yields its base URL."""
    with receiver_process(env, *args, cwd=cwd, group=group) as (base, _process):
        yield base


@contextlib.contextmanager
def receiver_process(
    env: dict[str, str], *args: str, cwd: Path | None = None, group: str = "callback"
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``serving_receiver``, yielding the process beside the base URL (to read its memory
    from /proc, say)."""
    port = free_port()
    awa_command = Path(sys.executable).with_name("awa")  # the console script
    command = [str(awa_command), group, "serve", "--port", str(port), *args]
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                output = process.stdout.read() if process.stdout else ""
                raise AssertionError(f"the receiver did not start: {output}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
