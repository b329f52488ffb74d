"""awa.contrib.fastapi: the lifespan runs (or does not run) a worker with a Starlette or
FastAPI application, nests the application's own lifespan, and ``mount`` serves the callback
receiver and the UI under one prefix."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator

import fastapi
import httpx
import pytest
from starlette.applications import Starlette

import awa
from awa.contrib.fastapi import lifespan, mount
from jobs_helpers import Conn, must_job_row, set_state


@dataclasses.dataclass
class Ping:
    n: int


async def test_a_starlette_lifespan_with_the_app_s_own_inside(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    seen: list[str] = []

    @client.task(Ping)
    async def ping(job: awa.Job[Ping]) -> None:
        return None

    @contextlib.asynccontextmanager
    async def own(app: Starlette) -> AsyncIterator[None]:
        seen.append(f"enter, worker running: {client.runtime is not None}")
        yield
        seen.append(f"exit, worker running: {client.runtime is not None}")

    app = Starlette(lifespan=lifespan(client, {"default": 2}, inner=own))
    async with app.router.lifespan_context(app):
        assert client.runtime is not None
    assert seen == ["enter, worker running: True", "exit, worker running: True"]
    assert client.runtime is None


async def test_a_producer_only_lifespan(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    app = Starlette(lifespan=lifespan(client, worker=False))
    async with app.router.lifespan_context(app):
        assert client.runtime is None
        job = await client.insert(Ping(1))
        assert job.state is awa.JobState.AVAILABLE


async def test_mount_serves_callbacks_and_the_ui_under_one_prefix(
    client: awa.AsyncClient, conn: Conn
) -> None:
    app = fastapi.FastAPI()
    mount(app, client, prefix="/ops/awa", allow_unsigned_callbacks=True)
    job = await client.insert(Ping(1))
    callback_id = str(uuid.uuid4())
    set_state(conn, job.id, "waiting_external", callback_id=callback_id, attempt=1)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        answer = await http.post(f"/ops/awa/callbacks/{callback_id}/complete", json={})
        assert answer.status_code == 200, answer.text
        assert must_job_row(conn, job.id)["state"] == "completed"
        page = await http.get(f"/ops/awa/jobs/{job.id}")
        assert page.status_code == 200
        assert 'href="/ops/awa/jobs"' in page.text
    with pytest.raises(ValueError, match="needs a prefix"):
        mount(app, client, prefix="/")


async def test_without_a_callback_secret_no_receiver_is_mounted(client: awa.AsyncClient) -> None:
    app = fastapi.FastAPI()
    mount(app, client, prefix="/awa", read_only=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        refused = await http.post(f"/awa/callbacks/{uuid.uuid4()}/complete", json={})
        assert refused.status_code == 403  # the read-only UI refuses every POST
