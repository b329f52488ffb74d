"""The operator UI's pages (GET): overview, jobs, one job, callbacks, schedules, failures."""

from __future__ import annotations

import http
from typing import Any

import psycopg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from awa import admin
from awa.errors import DatabaseError, ValidationError
from awa.model import JobState
from awa.storage.db import run_async
from awa.ui import reads, values
from awa.ui.context import ui_of
from awa.ui.links import path_for
from awa.ui.params import BadRequest, job_filter, shown
from awa.ui.params import job_id as parse_job_id
from awa.workflows.operations import WorkflowInfo, get_workflow_statement, workflow_id


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
    cursor = {
        "after": where.after_id,
        "after_run_at": where.after_run_at.isoformat() if where.after_run_at else None,
    }
    context = {
        "where": where,
        "here": path_for(request, "jobs", query=where.query_string(**cursor)),
        "page_of_jobs": page,
        "states": list(JobState),
        "counts": counts,
        "search_window": reads.SEARCH_WINDOW,
        "page": "jobs",
    }
    return ui.render(request, "jobs.html", context)


async def job(request: Request) -> Response:
    ui = ui_of(request)
    job_id = parse_job_id(request.path_params["job_id"])
    async with ui.connection() as conn:
        row = await admin.get_job(conn, job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id} (finished jobs leave after retention)")
        if not isinstance(row.metadata, dict):
            row.metadata = {"(stored metadata)": row.metadata}
        lineage = values.Lineage.of(row.metadata)
        trigger_row = None
        if lineage is not None and lineage.id is not None:
            trigger_row = await reads.job_brief(conn, lineage.id)
        follow_ups = await reads.follow_ups_of(conn, job_id)
        parents = await reads.parents_of(conn, job_id)
        children = await reads.children_of(conn, job_id) if row.has_dependents else []
    failed = values.attempts(row)
    context = {
        "job": row,
        "metadata": values.shown_metadata(row, lineage),
        "lineage": lineage,
        "trigger_row": trigger_row,
        "follow_ups": follow_ups,
        "parents": parents,
        "children": children,
        "workflow": values.WorkflowMark.of(row),
        "timeline": values.timeline(row, failed),
        "errors": list(reversed(failed)),
        "page": "jobs",
    }
    return ui.render(request, "job.html", context)


async def workflow(request: Request) -> Response:
    """A workflow (or batch) as an indented list: each job under the jobs it waits for."""
    ui = ui_of(request)
    given = request.path_params["workflow_id"]
    try:
        wanted = workflow_id(given)
    except ValidationError:
        raise BadRequest(f"workflow id must be a UUID, not {shown(given)}") from None
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
        row = await reads.progress(conn, parse_job_id(request.path_params["job_id"]))
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
        # A schedule that cannot fire comes with its error (and no next fire), never an
        # exception that would hide the others.
        rows = await admin.list_cron_jobs(conn)
    return ui.render(request, "schedules.html", {"schedules": rows, "page": "schedules"})


CHANGES_SHOWN = 50
"""Changes of queue overrides the overrides page lists, newest first."""


async def overrides(request: Request) -> Response:
    ui = ui_of(request)
    async with ui.connection() as conn:
        rows = await admin.list_queue_overrides(conn)
        changes = await admin.queue_override_log(conn, limit=CHANGES_SHOWN)
        limits = await admin.list_queue_depth_limits(conn)
    context = {"overrides": rows, "changes": changes, "limits": limits, "page": "overrides"}
    return ui.render(request, "overrides.html", context)


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
    status = error.status_code
    title = "Not found" if status == 404 else http.HTTPStatus(status).phrase
    return await _error_page(request, status, title, str(error.detail))


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
        # Job ids are checked by the page (a clear 400 for 5,000 digits or one past bigint).
        Route("/jobs/{job_id}", job, name="job"),
        Route("/jobs/{job_id}/progress", job_progress, name="job_progress"),
        Route("/workflows/{workflow_id}", workflow, name="workflow"),
        Route("/callbacks", callbacks, name="callbacks"),
        Route("/schedules", schedules, name="schedules"),
        Route("/overrides", overrides, name="overrides"),
        Route("/failed", failed, name="failed"),
    ]
