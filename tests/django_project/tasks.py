"""Django tasks the tests enqueue (the decorator comes from django.tasks or the backport)."""

from __future__ import annotations

import asyncio
import os
import time

from django.db import connection

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="reports")
def report(name: str, *, pages: int = 1) -> dict[str, object]:
    return {"name": name, "pages": pages}


@task
async def multiply(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a * b


@task(takes_context=True)
def attempt_number(context: object) -> int:
    return context.attempt  # type: ignore[attr-defined]


@task
def database_name() -> str:
    # Django's ORM connection works in the worker's thread.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        return str(cursor.fetchone()[0])


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task
def not_json() -> object:
    return object()


@task
def hold(release: str) -> str:
    """Run until the test creates the file ``release`` (within a minute)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.01)
    return "done"
