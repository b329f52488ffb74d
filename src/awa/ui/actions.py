"""The operator UI's actions (POST): each checks the CSRF token, acts through ``awa.admin``
(rows only: no hooks, no follow-ups, like the CLI), leaves a flash message and redirects.
Bulk actions first answer with a confirmation page; they act when it is confirmed.

Names the actions apply to (a queue, a schedule, a workflow id) travel as form fields, never
in the path, and every form names its action in an ``action`` field that the address it is
posted to must agree with (400 otherwise): whatever a stored name holds, one button can
never post another action."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from awa import admin
from awa.errors import AwaError, ValidationError
from awa.model import JobState
from awa.producer.backpressure import check_policy
from awa.storage.db import run_async
from awa.ui import reads
from awa.ui.context import ui_of
from awa.ui.links import back_to, path_for
from awa.ui.params import BadRequest, job_filter, job_id, job_ids, required, shown
from awa.ui.security import CSRF_FIELD, csrf_valid, flash
from awa.workflows.operations import cancel_workflow_statement, workflow_id

MAX_BULK = 10_000
"""Jobs one bulk action moves at most (press again for the rest)."""

JobAction = Callable[[psycopg.AsyncConnection[Any], int], Awaitable[Any]]

JOB_ACTIONS: dict[str, tuple[JobAction, str]] = {
    # name: (action, what it did; a None/False result means it did not apply)
    "retry": (admin.retry, "queued to run again"),
    "cancel": (admin.cancel, "cancelled"),
    "discard": (admin.discard, "discarded"),
    "run-now": (admin.run_now, "made available now"),
}
NOT_APPLICABLE = {
    "retry": "only failed, cancelled or parked jobs can be retried",
    "cancel": "it has already finished",
    "discard": "it is running or waiting on a callback (cancel it first)",
    "run-now": "only scheduled or retryable jobs can be run now",
}


def _redirect(request: Request, form: FormData, default: str, message: str) -> Response:
    response = RedirectResponse(back_to(request, form.get("next"), default), status_code=303)
    flash(request, response, message)
    return response


def _same_action(form: FormData, address: str) -> None:
    """Refuse a form whose ``action`` field names another action than its address does."""
    asked = form.get("action")
    if asked != address:
        raise BadRequest(
            f"action: the form asks for {shown(asked)} but was sent to the address of "
            f"{address!r}; nothing was done (reload the page and press the button again)"
        )


async def _checked_form(request: Request) -> FormData:
    form = await request.form()
    if not csrf_valid(request, form.get(CSRF_FIELD)):
        raise _Refused()
    return form


class _Refused(Exception):
    """The form lacks the CSRF token of this browser's session."""


def _refused() -> Response:
    return PlainTextResponse(
        "refused: the form's CSRF token is missing or wrong (reload the page and try again)",
        status_code=403,
    )


Handler = Callable[[Request, FormData], Awaitable[Response]]


def _guarded(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            form = await _checked_form(request)
        except _Refused:
            return _refused()
        try:
            return await handler(request, form)
        except BadRequest:
            raise
        except AwaError as error:
            return _redirect(request, form, path_for(request, "overview"), f"Not done: {error}")

    return endpoint


async def job_action(request: Request, form: FormData) -> Response:
    ui = ui_of(request)
    wanted = job_id(request.path_params["job_id"])
    name: str = request.path_params["action"]
    if name not in JOB_ACTIONS:
        return PlainTextResponse(f"unknown action {shown(name)}", status_code=404)
    _same_action(form, name)
    action, done = JOB_ACTIONS[name]
    async with ui.connection() as conn:
        result = await action(conn, wanted)
    message = f"Job {wanted} {done}." if result else f"Job {wanted}: {NOT_APPLICABLE[name]}."
    return _redirect(request, form, path_for(request, "job", job_id=wanted), message)


def _confirm(
    request: Request, form: FormData, question: str, detail: str | None = None
) -> Response:
    fields = [(key, str(value)) for key, value in form.multi_items() if key != CSRF_FIELD]
    context = {"question": question, "detail": detail, "fields": fields, "page": None}
    return ui_of(request).render(request, "confirm.html", context)


async def bulk(request: Request, form: FormData) -> Response:
    """Retry, cancel or discard the selected jobs."""
    ui = ui_of(request)
    name = form.get("action", "")
    if name not in ("retry", "cancel", "discard"):
        raise BadRequest(f"action must be retry, cancel or discard, not {shown(name)}")
    ids = job_ids(form.getlist("ids"))[:MAX_BULK]
    back = path_for(request, "jobs")
    if not ids:
        return _redirect(request, form, back, "Nothing selected.")
    if form.get("confirm") != "yes":
        return _confirm(request, form, f"{name.capitalize()} {len(ids)} selected job(s)?")
    action, done = JOB_ACTIONS[name]
    async with ui.connection() as conn:
        applied = 0
        for one in ids:
            applied += 1 if await action(conn, one) else 0
    skipped = f"; {len(ids) - applied} did not apply" if applied < len(ids) else ""
    return _redirect(request, form, back, f"{applied} job(s) {done}{skipped}.")


async def matching(request: Request, form: FormData) -> Response:
    """Retry or discard every failed job matching the jobs page's filters."""
    ui = ui_of(request)
    name = form.get("action", "")
    if name not in ("retry", "discard"):
        raise BadRequest(f"action must be retry or discard, not {shown(name)}")
    where = job_filter(form)
    if where.state is not JobState.FAILED:
        raise BadRequest("only failed jobs can be retried or discarded by filter (state=failed)")
    back = path_for(request, "jobs", query=where.query_string())
    async with ui.connection() as conn:
        ids = await reads.matching_ids(conn, where, MAX_BULK)
        if form.get("confirm") != "yes":
            more = " (the first 10,000; press again for the rest)" if len(ids) == MAX_BULK else ""
            question = f"{name.capitalize()} {len(ids)} failed job(s) matching the filter{more}?"
            return _confirm(request, form, question)
        if name == "retry":
            count = len(await admin.retry_failed(conn, ids=ids))
        else:
            count = await admin.discard_failed(conn, ids=ids)
    verb = "queued to run again" if name == "retry" else "discarded"
    return _redirect(request, form, back, f"{count} failed job(s) {verb}.")


async def _on_name(
    request: Request,
    form: FormData,
    action: str,
    field: str,
    run: Callable[[psycopg.AsyncConnection[Any], str], Awaitable[Any]],
    say: Callable[[str, Any], str],
    page: str,
) -> Response:
    """An action on one named thing (a queue, a periodic job): check the form, run it,
    go back to ``page`` saying what happened."""
    _same_action(form, action)
    name = required(form, field)
    async with ui_of(request).connection() as conn:
        result = await run(conn, name)
    return _redirect(request, form, path_for(request, page), say(name, result))


async def pause_queue(request: Request, form: FormData) -> Response:
    async def pause(conn: psycopg.AsyncConnection[Any], queue: str) -> None:
        await admin.pause_queue(conn, queue, paused_by="awa ui")

    def say(queue: str, _: None) -> str:
        return f"Queue {queue} paused: workers finish what runs and claim no more."

    return await _on_name(request, form, "pause", "queue", pause, say, "overview")


async def resume_queue(request: Request, form: FormData) -> Response:
    def say(queue: str, resumed: bool) -> str:
        return f"Queue {queue} resumed." if resumed else f"Queue {queue} was not paused."

    return await _on_name(request, form, "resume", "queue", admin.resume_queue, say, "overview")


_REMOVE = object()
"""A limit field of the override form saying ``none``: remove the configured limit."""
_REMOVABLE_FIELDS = ("rate", "global_max_running", "key_concurrency")


def _override_number(form: FormData, field: str, parse: Callable[[str], Any]) -> Any:
    text = form.get(field)
    if not isinstance(text, str) or not text.strip():
        return None
    if text.strip().lower() == "none" and field in _REMOVABLE_FIELDS:
        return _REMOVE
    try:
        return parse(text.strip())
    except ValueError:
        kind = "an integer" if parse is int else "a number"
        raise ValidationError(f"{field} must be {kind}, got {shown(text)}") from None


def _override_settings(form: FormData) -> dict[str, Any]:
    """The settings an override form gives (its empty fields leave theirs as they are)."""
    given: dict[str, Any] = {
        name: _override_number(form, name, parse)
        for name, parse in (
            ("global_max_running", int),
            ("key_concurrency", int),
            ("claim_batch_size", int),
            ("poll_interval", float),
            ("deadline_duration", float),
        )
    }
    rate = _override_number(form, "rate", float)
    burst = _override_number(form, "burst", int)
    if burst is not None and rate in (None, _REMOVE):
        raise ValidationError("rate_limit: give a rate with the burst")
    given["rate_limit"] = rate if rate in (None, _REMOVE) else (rate, burst or 0)
    paused = form.get("paused")
    if paused not in (None, "", "true", "false"):
        raise BadRequest(f"paused must be true, false or empty, not {shown(paused)}")
    given["paused"] = {"true": True, "false": False}.get(str(paused))
    return {
        name: None if value is _REMOVE else value
        for name, value in given.items()
        if value is not None
    }


def _changed_by(form: FormData) -> str:
    by = form.get("by")
    return by if isinstance(by, str) and by.strip() else "awa ui"


async def set_overrides(request: Request, form: FormData) -> Response:
    async def apply(conn: psycopg.AsyncConnection[Any], queue: str) -> admin.QueueOverrides:
        settings = _override_settings(form)
        return await admin.set_queue_overrides(conn, queue, settings, changed_by=_changed_by(form))

    def say(queue: str, result: admin.QueueOverrides) -> str:
        return f"Queue {queue} overridden; its workers apply it within seconds."

    return await _on_name(request, form, "set", "queue", apply, say, "overrides")


async def clear_overrides(request: Request, form: FormData) -> Response:
    async def clear(conn: psycopg.AsyncConnection[Any], queue: str) -> admin.QueueOverrides:
        return await admin.clear_queue_overrides(conn, queue, changed_by=_changed_by(form))

    def say(queue: str, _: admin.QueueOverrides) -> str:
        return f"Queue {queue}: overrides cleared; its workers return to their own settings."

    return await _on_name(request, form, "clear", "queue", clear, say, "overrides")


async def set_depth_limit(request: Request, form: FormData) -> Response:
    async def apply(conn: psycopg.AsyncConnection[Any], queue: str) -> None:
        max_depth = _override_number(form, "max_depth", int)
        if max_depth is None:
            raise ValidationError("max_depth: give the number of jobs the queue may hold")
        policy = check_policy(form.get("policy") or "signal")
        await admin.set_queue_depth_limit(conn, queue, max_depth, policy=policy)

    def say(queue: str, _: None) -> str:
        return f"Queue {queue}: depth limit set; producers see it within a second."

    return await _on_name(request, form, "set", "queue", apply, say, "overrides")


async def clear_depth_limit(request: Request, form: FormData) -> Response:
    def say(queue: str, cleared: bool) -> str:
        return f"Queue {queue}: depth limit removed." if cleared else f"Queue {queue} had none."

    clear = admin.clear_queue_depth_limit
    return await _on_name(request, form, "clear", "queue", clear, say, "overrides")


async def trigger_schedule(request: Request, form: FormData) -> Response:
    def say(name: str, row: Any) -> str:
        return f"Schedule {name} fired: job {row.id}." if row else f"No schedule named {name}."

    return await _on_name(
        request, form, "trigger", "name", admin.trigger_cron_job, say, "schedules"
    )


async def cancel_workflow(request: Request, form: FormData) -> Response:
    _same_action(form, "cancel")
    given = required(form, "workflow")
    try:
        wanted = workflow_id(given)
    except ValidationError:
        raise BadRequest(f"workflow must be a workflow's id (a UUID), not {shown(given)}") from None
    async with ui_of(request).connection() as conn:
        count = await run_async(conn, cancel_workflow_statement(wanted))
    back = path_for(request, "workflow", workflow_id=wanted)
    return _redirect(request, form, back, f"{count} unfinished job(s) of the workflow cancelled.")


def routes() -> list[Route]:
    post = ["POST"]
    return [
        Route("/jobs/bulk", _guarded(bulk), methods=post, name="jobs_bulk"),
        Route("/jobs/matching", _guarded(matching), methods=post, name="jobs_matching"),
        Route("/jobs/{job_id}/{action}", _guarded(job_action), methods=post, name="job_do"),
        Route("/workflows/cancel", _guarded(cancel_workflow), methods=post, name="workflow_cancel"),
        Route("/queues/pause", _guarded(pause_queue), methods=post, name="queue_pause"),
        Route("/queues/resume", _guarded(resume_queue), methods=post, name="queue_resume"),
        Route("/overrides/set", _guarded(set_overrides), methods=post, name="overrides_set"),
        Route("/overrides/clear", _guarded(clear_overrides), methods=post, name="overrides_clear"),
        Route("/depth-limits/set", _guarded(set_depth_limit), methods=post, name="depth_set"),
        Route("/depth-limits/clear", _guarded(clear_depth_limit), methods=post, name="depth_clear"),
        Route(
            "/schedules/trigger", _guarded(trigger_schedule), methods=post, name="schedule_trigger"
        ),
    ]
