"""The operator UI's actions (POST): each checks the CSRF token, acts through ``awa.admin``
(rows only: no hooks, no follow-ups, like the CLI), leaves a flash message and redirects.
Bulk actions first answer with a confirmation page; they act when it is confirmed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from awa import admin
from awa.db import run_async
from awa.errors import AwaError
from awa.model import JobState
from awa.ui import reads
from awa.ui.context import ui_of
from awa.ui.pages import BadRequest, job_filter
from awa.ui.security import CSRF_FIELD, csrf_valid, flash
from awa.workflows import cancel_workflow_statement

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


def _back(request: Request, form: FormData, default: str) -> str:
    """Where to go after the action: the form's ``next`` when it is a path of this UI."""
    target = form.get("next")
    root = request.scope.get("root_path") or ""
    if isinstance(target, str) and target.startswith(root + "/") and not target.startswith("//"):
        return target
    return default


def _redirect(request: Request, form: FormData, default: str, message: str) -> Response:
    response = RedirectResponse(_back(request, form, default), status_code=303)
    flash(request, response, message)
    return response


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


def _guarded(
    handler: Callable[[Request, FormData], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
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
            default = str(request.url_for("overview"))
            return _redirect(request, form, default, f"Not done: {error}")

    return endpoint


async def job_action(request: Request, form: FormData) -> Response:
    ui = ui_of(request)
    job_id: int = request.path_params["job_id"]
    name: str = request.path_params["action"]
    if name not in JOB_ACTIONS:
        return PlainTextResponse(f"unknown action {name!r}", status_code=404)
    action, done = JOB_ACTIONS[name]
    async with ui.connection() as conn:
        result = await action(conn, job_id)
    message = f"Job {job_id} {done}." if result else f"Job {job_id}: {NOT_APPLICABLE[name]}."
    return _redirect(request, form, str(request.url_for("job", job_id=job_id)), message)


def _ids(form: FormData) -> list[int]:
    ids = []
    for value in form.getlist("ids"):
        try:
            ids.append(int(str(value)))
        except ValueError:
            raise BadRequest(f"ids: {value!r} is not a job id") from None
    return ids[:MAX_BULK]


def _confirm(
    request: Request, form: FormData, question: str, detail: str | None = None
) -> Response:
    fields = [(key, str(value)) for key, value in form.multi_items() if key != CSRF_FIELD]
    context = {"question": question, "detail": detail, "fields": fields, "page": None}
    return ui_of(request).render(request, "confirm.html", context)


async def bulk(request: Request, form: FormData) -> Response:
    """Retry, cancel or discard the selected jobs."""
    ui = ui_of(request)
    name = str(form.get("action", ""))
    if name not in ("retry", "cancel", "discard"):
        raise BadRequest(f"action must be retry, cancel or discard, not {name!r}")
    ids = _ids(form)
    back = str(request.url_for("jobs"))
    if not ids:
        return _redirect(request, form, back, "Nothing selected.")
    if form.get("confirm") != "yes":
        return _confirm(request, form, f"{name.capitalize()} {len(ids)} selected job(s)?")
    action, done = JOB_ACTIONS[name]
    async with ui.connection() as conn:
        applied = 0
        for job_id in ids:
            applied += 1 if await action(conn, job_id) else 0
    skipped = f"; {len(ids) - applied} did not apply" if applied < len(ids) else ""
    return _redirect(request, form, back, f"{applied} job(s) {done}{skipped}.")


async def matching(request: Request, form: FormData) -> Response:
    """Retry or discard every failed job matching the jobs page's filters."""
    ui = ui_of(request)
    name = str(form.get("action", ""))
    if name not in ("retry", "discard"):
        raise BadRequest(f"action must be retry or discard, not {name!r}")
    where = job_filter({key: str(value) for key, value in form.items()})
    if where.state is not JobState.FAILED:
        raise BadRequest("only failed jobs can be retried or discarded by filter (state=failed)")
    back = str(request.url_for("jobs").include_query_params(**where.query_string()))
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


async def queue_action(request: Request, form: FormData) -> Response:
    ui = ui_of(request)
    queue: str = request.path_params["queue"]
    action = request.path_params["action"]
    if action not in ("pause", "resume"):
        return PlainTextResponse(f"unknown action {action!r}", status_code=404)
    back = str(request.url_for("overview"))
    async with ui.connection() as conn:
        if action == "pause":
            await admin.pause_queue(conn, queue, paused_by="awa ui")
            message = f"Queue {queue} paused: workers finish what runs and claim no more."
        elif await admin.resume_queue(conn, queue):
            message = f"Queue {queue} resumed."
        else:
            message = f"Queue {queue} was not paused."
    return _redirect(request, form, back, message)


async def trigger_schedule(request: Request, form: FormData) -> Response:
    ui = ui_of(request)
    name: str = request.path_params["name"]
    async with ui.connection() as conn:
        row = await admin.trigger_cron_job(conn, name)
    message = f"Schedule {name} fired: job {row.id}." if row else f"No schedule named {name}."
    return _redirect(request, form, str(request.url_for("schedules")), message)


async def cancel_workflow(request: Request, form: FormData) -> Response:
    ui = ui_of(request)
    wanted = request.path_params["workflow_id"]
    async with ui.connection() as conn:
        count = await run_async(conn, cancel_workflow_statement(wanted))
    back = str(request.url_for("workflow", workflow_id=wanted))
    return _redirect(request, form, back, f"{count} unfinished job(s) of the workflow cancelled.")


def routes() -> list[Route]:
    post = ["POST"]
    return [
        Route("/jobs/{job_id:int}/{action}", _guarded(job_action), methods=post, name="job_do"),
        Route("/jobs/bulk", _guarded(bulk), methods=post, name="jobs_bulk"),
        Route(
            "/workflows/{workflow_id}/cancel",
            _guarded(cancel_workflow),
            methods=post,
            name="workflow_cancel",
        ),
        Route("/jobs/matching", _guarded(matching), methods=post, name="jobs_matching"),
        # Queue and schedule names may hold any character, "/" too: they come last.
        Route(
            "/queues/{action}/{queue:path}", _guarded(queue_action), methods=post, name="queue_do"
        ),
        Route(
            "/schedules/trigger/{name:path}",
            _guarded(trigger_schedule),
            methods=post,
            name="schedule_trigger",
        ),
    ]
