"""The blocking Client offers every producer and operator method of AsyncClient, with the same
parameters; the methods only the asyncio client has are listed here with the reason."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import awa

URL = "postgresql://nobody@127.0.0.1:1/none"  # clients connect lazily: never reached

_HOOKS = "lifecycle hooks and follow-ups run where the worker commits outcomes (asyncio)"
_FOLLOW_UPS = {
    f"on_{outcome}_enqueue{form}": _HOOKS
    for outcome in ("completed", "cancelled", "retried", "exhausted", "waiting_for_callback")
    for form in ("", "_with")
} | {"on_rescued_enqueue": _HOOKS, "on_rescued_enqueue_with": _HOOKS}

ASYNCIO_ONLY = {
    "start": "the worker runtime is asyncio-only",
    "shutdown": "the worker runtime is asyncio-only",
    "run": "the worker runtime is asyncio-only",
    "runtime": "the worker runtime is asyncio-only",
    "periodic": "a declaration the worker stores when it starts",
    "queue_descriptor": "a declaration the worker stores when it starts",
    "job_kind_descriptor": "a declaration the worker stores when it starts",
    "on_event": _HOOKS,
    "on_event_kind": _HOOKS,
    **_FOLLOW_UPS,
}


def public(cls: type[Any]) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def parameters(client: object, name: str) -> Any:
    """Each parameter's name, kind and default (annotations may name the same type
    differently), or "property"."""
    if isinstance(inspect.getattr_static(type(client), name), property):
        return "property"
    signature = inspect.signature(getattr(client, name))
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_the_blocking_client_has_every_method_but_the_workers() -> None:
    asyncio_names, blocking_names = public(awa.AsyncClient), public(awa.Client)
    assert asyncio_names - blocking_names == set(ASYNCIO_ONLY)
    assert blocking_names - asyncio_names == set()


def test_shared_methods_take_the_same_parameters() -> None:
    asyncio_client, blocking_client = awa.AsyncClient(URL), awa.Client(URL)
    shared = public(awa.AsyncClient) & public(awa.Client)
    assert len(shared) > 60
    differ = {
        name: (parameters(asyncio_client, name), parameters(blocking_client, name))
        for name in sorted(shared)
        if parameters(asyncio_client, name) != parameters(blocking_client, name)
    }
    assert differ == {}


def test_asyncio_methods_are_coroutine_functions_and_blocking_ones_are_not() -> None:
    asyncio_client, blocking_client = awa.AsyncClient(URL), awa.Client(URL)
    for name in ("list_dlq", "get_job", "insert_many", "wait", "health_check", "migrate"):
        assert inspect.iscoroutinefunction(getattr(asyncio_client, name)), name
        assert not inspect.iscoroutinefunction(getattr(blocking_client, name)), name
        assert getattr(blocking_client, name).__doc__, name


@dataclasses.dataclass
class Report:
    day: int


def test_the_blocking_client_routes_by_its_tasks_and_their_defaults(database_url: str) -> None:
    with awa.Client(database_url) as client:
        client.migrate()

        @client.task(Report, queue="reports", priority=1)
        def report(job: awa.Job[Report]) -> None:  # pragma: no cover - never run here
            pass

        row = client.insert(Report(1))
        assert (row.queue, row.priority) == ("reports", 1)
        [many] = client.insert_many([Report(2)])
        assert (many.queue, many.priority) == ("reports", 1)
