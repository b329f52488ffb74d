"""The operator UI's pages (GET): overview, jobs, one job, callbacks, schedules, failures."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import psycopg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from awa import admin
from awa.db import run_async
from awa.errors import DatabaseError, ValidationError
from awa.insert import LINEAGE
from awa.model import JobRow, JobState
from awa.ui import reads
from awa.ui.context import ui_of
from awa.workflows import WORKFLOW, WorkflowInfo, get_workflow_statement, workflow_id


class BadRequest(ValidationError):
    """A query parameter the UI cannot use; the page says which and why."""


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name, "").strip()
    if "\x00" in value:
        raise BadRequest(f"{name}: NUL bytes are not allowed")
    if len(value) > 1000:
        raise BadRequest(f"{name}: at most 1000 characters")
    return value or None


def _int(params: Mapping[str, str], name: str) -> int | None:
    value = _text(params, name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {value!r}") from None


def job_filter(params: Mapping[str, str]) -> reads.JobFilter:
    """The jobs page's filters from its query string (or a bulk form's fields); BadRequest
    names a wrong one."""
    state_text = _text(params, "state")
    state = None
    if state_text is not None:
        try:
            state = JobState(state_text)
        except ValueError:
            names = ", ".join(member.value for member in JobState)
            raise BadRequest(f"state must be one of {names}, not {state_text!r}") from None
    sort = _text(params, "sort") or "id"
    if sort not in ("id", "run_at"):
        raise BadRequest(f"sort must be id or run_at, not {sort!r}")
    after_id = _int(params, "after")
    after_run_at = None
    if sort == "run_at" and after_id is not None:
        stamp = _text(params, "after_run_at")
        try:
            after_run_at = dt.datetime.fromisoformat(stamp or "")
        except ValueError:
            raise BadRequest("after_run_at must be an ISO timestamp with the after id") from None
    return reads.JobFilter(
        state=state,
        kind=_text(params, "kind"),
        queue=_text(params, "queue"),
        tag=_text(params, "tag"),
        text=_text(params, "q"),
        sort=sort,
        after_id=after_id,
        after_run_at=after_run_at,
    )


async def overview(request: Request) -> Response:
    ui = ui_of(request)
    async with ui.connection() as conn:
        summary = await reads.overview(conn)
    context = {"overview": summary, "states": reads.SHOWN_STATES, "page": "overview"}
    return ui.render(request, "overview.html", context)


async def jobs(request: Request) -> Response:
    ui = ui_of(request)
    where = job_filter(request.query_params)
    async with ui.connection() as conn:
        page = await reads.jobs_page(conn, where)
        counts = await reads.state_totals(conn)
    context = {
        "where": where,
        "page_of_jobs": page,
        "states": list(JobState),
        "counts": counts,
        "search_window": reads.SEARCH_WINDOW,
        "page": "jobs",
    }
    return ui.render(request, "jobs.html", context)


def timeline(job: JobRow) -> list[tuple[dt.datetime, str]]:
    """The job's moments, oldest first: creation, each failed attempt, the last claim..."""
    moments: list[tuple[dt.datetime, str]] = [(job.created_at, "created")]
    for entry in job.errors:
        at = entry.get("at")
        if isinstance(at, str):
            try:
                stamp = dt.datetime.fromisoformat(at)
            except ValueError:
                continue
            moments.append((stamp, f"attempt {entry.get('attempt', '?')} failed"))
    if job.attempted_at is not None:
        moments.append((job.attempted_at, f"attempt {job.attempt} started"))
    if job.heartbeat_at is not None:
        moments.append((job.heartbeat_at, "last heartbeat"))
    if job.state in (JobState.SCHEDULED, JobState.RETRYABLE, JobState.AVAILABLE):
        moments.append((job.run_at, "runs at" if job.state is not JobState.AVAILABLE else "due"))
    if job.deadline_at is not None:
        moments.append((job.deadline_at, "attempt deadline"))
    if job.callback_timeout_at is not None:
        moments.append((job.callback_timeout_at, "callback times out"))
    if job.finalized_at is not None:
        moments.append((job.finalized_at, job.state.value))
    return sorted(moments, key=lambda moment: moment[0])


async def job(request: Request) -> Response:
    ui = ui_of(request)
    job_id: int = request.path_params["job_id"]
    async with ui.connection() as conn:
        row = await admin.get_job(conn, job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id} (finished jobs leave after retention)")
        lineage = row.metadata.get(LINEAGE) if isinstance(row.metadata, dict) else None
        trigger: dict[str, Any] | None = None
        if isinstance(lineage, dict) and isinstance(lineage.get("id"), int):
            trigger = {"lineage": lineage, "row": await reads.job_brief(conn, lineage["id"])}
        follow_ups = await reads.follow_ups_of(conn, job_id)
        parents = await reads.parents_of(conn, job_id)
        children = await reads.children_of(conn, job_id) if row.has_dependents else []
    metadata = {key: value for key, value in row.metadata.items() if key != LINEAGE}
    workflow = row.metadata.get(WORKFLOW) if isinstance(row.metadata, dict) else None
    context = {
        "job": row,
        "metadata": metadata,
        "trigger": trigger,
        "follow_ups": follow_ups,
        "parents": parents,
        "children": children,
        "workflow": workflow if isinstance(workflow, dict) else None,
        "timeline": timeline(row),
        "errors": list(reversed(row.errors)),
        "page": "jobs",
    }
    return ui.render(request, "job.html", context)


async def workflow(request: Request) -> Response:
    """A workflow (or batch) as an indented list: each job under the jobs it waits for."""
    ui = ui_of(request)
    try:
        wanted = workflow_id(request.path_params["workflow_id"])
    except ValidationError as error:
        raise BadRequest(str(error)) from None
    async with ui.connection() as conn:
        jobs = await run_async(conn, get_workflow_statement(wanted))
    if not jobs:
        raise HTTPException(404, f"no workflow {wanted} (or its jobs left after retention)")
    info = WorkflowInfo(wanted, jobs)
    depth: dict[int, int] = {}
    for entry in info.jobs:  # parents come first: they were inserted earlier
        depth[entry.job.id] = 1 + max((depth.get(p, -1) for p in entry.depends_on), default=-1)
    context = {"info": info, "depth": depth, "page": "jobs"}
    return ui.render(request, "workflow.html", context)


async def job_progress(request: Request) -> Response:
    """The live part of a job page (its state and progress), for the page's refresh."""
    ui = ui_of(request)
    async with ui.connection() as conn:
        row = await reads.progress(conn, request.path_params["job_id"])
    if row is None:
        return JSONResponse({"error": "no such job"}, status_code=404)
    heartbeat = row["heartbeat_at"]
    return JSONResponse(
        {
            "state": row["state"],
            "attempt": row["attempt"],
            "progress": row["progress"],
            "heartbeat_at": heartbeat.isoformat() if heartbeat else None,
        }
    )


async def callbacks(request: Request) -> Response:
    ui = ui_of(request)
    async with ui.connection() as conn:
        rows = await reads.callbacks(conn)
    return ui.render(request, "callbacks.html", {"callbacks": rows, "page": "callbacks"})


async def schedules(request: Request) -> Response:
    ui = ui_of(request)
    async with ui.connection() as conn:
        rows = await admin.list_cron_jobs(conn)
    return ui.render(request, "schedules.html", {"schedules": rows, "page": "schedules"})


async def failed(request: Request) -> Response:
    ui = ui_of(request)
    async with ui.connection() as conn:
        groups = await reads.failed_groups(conn)
    return ui.render(request, "failed.html", {"groups": groups, "page": "failed"})


async def _error_page(request: Request, status: int, title: str, detail: str) -> Response:
    ui = ui_of(request)
    context = {"title": title, "detail": detail, "page": None}
    return ui.render(request, "error.html", context, status=status)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return await _error_page(request, error.status_code, "Not found", str(error.detail))


async def _bad_request(request: Request, error: Exception) -> Response:
    return await _error_page(request, 400, "Bad request", str(error))


async def _database_error(request: Request, error: Exception) -> Response:
    if isinstance(error, psycopg.errors.QueryCanceled) or isinstance(
        error.__cause__, psycopg.errors.QueryCanceled
    ):
        detail = (
            "The query took longer than the UI allows (5 s). Narrow it down: filter by state, "
            "kind or queue before searching the arguments."
        )
        return await _error_page(request, 504, "Too slow", detail)
    return await _error_page(request, 503, "Database unavailable", str(error))


ERROR_HANDLERS: dict[Any, Any] = {
    HTTPException: _http_error,
    ValidationError: _bad_request,
    DatabaseError: _database_error,
    psycopg.Error: _database_error,
}


def routes() -> list[Route]:
    return [
        Route("/", overview, name="overview"),
        Route("/jobs", jobs, name="jobs"),
        Route("/jobs/{job_id:int}", job, name="job"),
        Route("/jobs/{job_id:int}/progress", job_progress, name="job_progress"),
        Route("/workflows/{workflow_id}", workflow, name="workflow"),
        Route("/callbacks", callbacks, name="callbacks"),
        Route("/schedules", schedules, name="schedules"),
        Route("/failed", failed, name="failed"),
    ]
