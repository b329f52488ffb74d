"""The attempt's side of an external callback: register it, then park the job or wait in
the handler until an outside system resumes it (``job.register_callback`` and
``job.wait_for_callback``)."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from typing import Any

from awa.callbacks import cel
from awa.callbacks.resolve import check_timeout
from awa.errors import CallbackWaitError
from awa.outcomes import CallbackToken
from awa.sql import query
from awa.storage.db import Statement


def register_statement(
    job_id: int,
    run_lease: int,
    token: CallbackToken,
    timeout_seconds: float,
    expressions: dict[str, str | None],
) -> Statement[bool]:
    params = {
        "id": job_id,
        "lease": run_lease,
        "callback_id": token.id,
        "timeout_seconds": check_timeout(timeout_seconds),
        **{name: cel.check_expression(name, source) for name, source in expressions.items()},
    }
    return Statement(query("register_callback"), params, bool)


def new_token() -> CallbackToken:
    return CallbackToken(str(uuid.uuid4()))


@dataclasses.dataclass(frozen=True, slots=True)
class WaitState:
    state: str
    run_lease: int
    callback_id: str | None
    resumed: bool
    payload: Any


def wait_state_statement(job_id: int) -> Statement[WaitState | None]:
    def decode(rows: list[dict[str, Any]]) -> WaitState | None:
        if not rows:
            return None
        row = rows[0]
        callback = row["callback_id"]
        return WaitState(
            row["state"],
            row["run_lease"],
            str(callback) if callback is not None else None,
            bool(row["resumed"]),
            row["payload"],
        )

    return Statement(query("callback_wait_state"), {"id": job_id}, decode)


def enter_wait_statement(job_id: int, run_lease: int, token: CallbackToken) -> Statement[bool]:
    params = {"id": job_id, "lease": run_lease, "callback_id": token.id}
    return Statement(query("enter_callback_wait"), params, bool)


def leave_wait_statement(job_id: int, run_lease: int, token: CallbackToken) -> Statement[bool]:
    params = {"id": job_id, "lease": run_lease, "callback_id": token.id}
    return Statement(query("leave_callback_wait"), params, bool)


def take_result_statement(job_id: int, run_lease: int) -> Statement[bool]:
    return Statement(query("take_callback_result"), {"id": job_id, "lease": run_lease}, bool)


WAIT_POLL_SECONDS = 1.0
"""How often a waiting handler re-reads its row when no notification wakes it."""


async def wait_for_callback(services: Any, job: Any, token: CallbackToken) -> Any:
    """The loop behind ``job.wait_for_callback``: park the row, then wait for a resume
    (woken by the awa_callbacks notification, or by polling) and take its payload."""
    if not isinstance(token, CallbackToken):
        raise TypeError("wait_for_callback() takes the token returned by register_callback()")
    if not job._holds_callback(token.id):
        # Checked here: the row may still hold the payload of an earlier resume, which a
        # wait on a token this attempt does not hold must not return.
        raise CallbackWaitError(
            f"callback token {token.id} is stale: it is not the callback job {job.id} "
            "registered last in this attempt (register again and wait on the new token)"
        )
    await services.execute(enter_wait_statement(job.id, job.run_lease, token))
    try:
        payload = await _wait_for_resume(services, job, token)
    except BaseException:
        # Leaving the wait without a payload (the worker shuts down, the handler is
        # interrupted): a row still parked in this wait goes back to running, so that the
        # attempt's own outcome applies instead of leaving a parked job nobody waits for.
        with contextlib.suppress(Exception):
            await services.execute(leave_wait_statement(job.id, job.run_lease, token))
        raise
    job._callback_id = None  # consumed: waiting on it again is waiting on a stale token
    return payload


async def _wait_for_resume(services: Any, job: Any, token: CallbackToken) -> Any:
    while True:
        state: WaitState | None = await services.execute(wait_state_statement(job.id))
        if state is None:
            raise CallbackWaitError(f"job {job.id} no longer exists")
        if state.run_lease != job.run_lease:
            raise CallbackWaitError(f"job {job.id} was claimed by another attempt meanwhile")
        if state.state == "running" and state.callback_id is None and state.resumed:
            await services.execute(take_result_statement(job.id, job.run_lease))
            return state.payload
        if state.callback_id is not None and state.callback_id != token.id:
            raise CallbackWaitError(
                f"callback token {token.id} is stale: job {job.id} registered "
                f"{state.callback_id} since"
            )
        if job.is_cancelled() or state.state == "cancelled":
            raise CallbackWaitError(f"job {job.id} was cancelled while waiting for its callback")
        if state.state != "waiting_external":
            raise CallbackWaitError(
                f"job {job.id} left its callback wait: it is now {state.state} (resolved, "
                "rescued or timed out)"
            )
        await services.wait_signal(job.id, WAIT_POLL_SECONDS)
