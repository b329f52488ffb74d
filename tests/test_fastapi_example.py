"""examples/fastapi_app.py: the worker starts in the application's lifespan, an endpoint's
insert commits with its own row (or rolls back with it), the UI is mounted under /awa."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from helpers_worker import wait_for
from jobs_helpers import Conn

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def example(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example module, imported fresh against this test's database."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("fastapi_app", None)
    yield importlib.import_module("fastapi_app")
    sys.modules.pop("fastapi_app", None)


async def test_the_lifespan_worker_runs_a_job_an_endpoint_inserted(
    example: ModuleType, conn: Conn
) -> None:
    app = example.app
    async with app.router.lifespan_context(app):
        assert example.client.runtime is not None  # the worker started with the app
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            created = (await http.post("/signups", json={"email": "ada@example.com"})).json()
            job = conn.execute(
                "SELECT kind, queue, max_attempts FROM awa.jobs WHERE id = %s",
                (created["job_id"],),
            ).fetchone()
            assert job == ("send_welcome", "email", 5)  # the task's queue and defaults

            async def welcomed() -> bool:
                answer = await http.get(f"/signups/{created['signup_id']}")
                return bool(answer.json()["welcomed"])

            await wait_for(welcomed, timeout=10)

            def completed() -> bool:
                # The handler's own transaction committed the welcome; the completion
                # commits a moment later, in the completer's batch.
                state = conn.execute(
                    "SELECT state FROM awa.jobs WHERE id = %s", (created["job_id"],)
                ).fetchone()
                return state == ("completed",)

            await wait_for(completed, timeout=10)

            refused = await http.post("/signups", json={"email": "bob@example.invalid"})
            assert refused.status_code == 422
            rows = conn.execute(
                "SELECT count(*) FROM example_signups WHERE email = 'bob@example.invalid'"
            ).fetchone()
            assert rows == (0,)
            jobs = conn.execute(
                "SELECT count(*) FROM awa.jobs WHERE args->>'email' = 'bob@example.invalid'"
            ).fetchone()
            assert jobs == (0,)  # rolled back with the signup

            ui = await http.get(f"/awa/jobs/{created['job_id']}")
            assert ui.status_code == 200
            assert "send_welcome" in ui.text
    assert example.client.runtime is None  # stopped with the app
    conn.execute("DROP TABLE example_signups")
