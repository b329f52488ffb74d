"""Hostile input through the integrations: the Django backend (settings.AWA, the task
backend's OPTIONS, enqueue, get_result, ``manage.py check`` and ``awa_worker``) and the
FastAPI/Starlette helpers (``lifespan``, ``running``, ``mount``). Each bad value is refused
with the documented error naming the setting or argument, and nothing is stored.

Django runs in subprocesses (its settings configure once per process): the table
``DJANGO_CASES`` goes to the ``hostile`` scenario of procs/django_scenario.py as JSON, one
row per (surface, value); a new setting or argument gets its cases by adding rows."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from starlette.applications import Starlette

import awa
from awa.contrib.fastapi import lifespan, mount, running
from helpers_django import django_env, manage, scenario
from helpers_hostile import FLAGS, SECONDS, assert_names, snapshot
from jobs_helpers import Conn, count_jobs

IMPROPER = "ImproperlyConfigured"

# (case id, surface, value, error class, fragments of the message)
DJANGO_CASES: list[tuple[str, str, Any, str, tuple[str, ...]]] = [
    *(
        (
            f"shutdown-timeout-{case}",
            "awa_settings",
            {"SHUTDOWN_TIMEOUT": value},
            IMPROPER,
            ("SHUTDOWN_TIMEOUT",),
        )
        for case, value in {
            "nan": math.nan,
            "inf": math.inf,
            "negative": -1,
            "beyond-100-years": 1e300,
            "str": "30",
            "bool": True,
        }.items()
    ),
    *(
        (f"task-modules-{case}", "awa_settings", {"TASK_MODULES": [value]}, IMPROPER, fragments)
        for case, value, fragments in [
            ("slash", "a/b", ("TASK_MODULES", "'a/b'", "not a module name")),
            ("dotdot", "..jobs", ("TASK_MODULES", "not a module name")),
            ("nul", "a\x00b", ("TASK_MODULES", "not a module name")),
            ("surrogate", "jobs\ud800", ("TASK_MODULES", "not a module name")),
            ("control", "jobs\n", ("TASK_MODULES", "not a module name")),
            ("empty", "", ("TASK_MODULES", "not a module name")),
            ("10000-chars", "x" * 10_000, ("TASK_MODULES", "not a module name")),
            ("int", 5, ("TASK_MODULES", "not a module name")),
        ]
    ),
    (
        "runtime-heartbeat-nan",
        "awa_settings",
        {"RUNTIME": {"heartbeat_interval": math.nan}},
        IMPROPER,
        ("RUNTIME", "heartbeat_interval"),
    ),
    (
        "queues-max-workers-beyond-int",
        "awa_settings",
        {"QUEUES": {"default": 2**31}},
        IMPROPER,
        ("QUEUES", "max_workers"),
    ),
    (
        "queues-rate-beyond-int",
        "awa_settings",
        {"QUEUES": {"default": {"rate_limit": [5, 2**31]}}},
        IMPROPER,
        ("QUEUES", "burst"),
    ),
    ("queues-name-nul", "awa_settings", {"QUEUES": {"a\x00": 1}}, IMPROPER, ("QUEUES", "NUL")),
    *(
        (
            f"deadline-duration-{case}",
            "backend_options",
            {"DEADLINE_DURATION": value},
            IMPROPER,
            ("DEADLINE_DURATION",),
        )
        for case, value in {
            "nan": math.nan,
            "inf": math.inf,
            "negative": -1,
            "beyond-100-years": 1e300,
            "str": "60",
            "bool": True,
        }.items()
    ),
    *(
        (
            f"max-attempts-{case}",
            "backend_options",
            {"MAX_ATTEMPTS": value},
            IMPROPER,
            ("MAX_ATTEMPTS", "1 to 1000"),
        )
        for case, value in {
            "zero": 0,
            "1001": 1001,
            "beyond-bigint": 2**63,
            "nan": math.nan,
            "str": "3",
            "bool": True,
        }.items()
    ),
    *(
        (f"queue-name-{case}", "queue_name", value, "ValidationError", ("queue", *fragments))
        for case, value, fragments in [
            ("nul", "a\x00b", ("NUL",)),
            ("surrogate", "q\ud800", ("surrogate",)),
            ("201-chars", "q" * 201, ("201", "200")),
        ]
    ),
    ("args-nan", "args", math.nan, "ValidationError", ("args", "NaN")),
    ("args-nul", "args", "a\x00b", "ValidationError", ("args", "NUL")),
    *(
        (f"result-id-{case}", "get_result", value, "TaskResultDoesNotExist", ())
        for case, value in {
            "beyond-bigint": str(2**63),
            "5000-digits": "9" * 5000,
            "negative": "-1",
            "zero": "0",
            "nul": "1\x00",
            "surrogate": "1\ud800",
            "path": "../1",
        }.items()
    ),
]


@pytest.fixture(scope="module")
def django_results(session_database: str) -> dict[str, Any]:
    """Every Django case, run in one subprocess (their order does not matter: each is
    refused before it stores anything)."""
    table = [
        {"id": case, "surface": surface, "value": value}
        for case, surface, value, _, _ in DJANGO_CASES
    ]
    return scenario("hostile", django_env(session_database), json.dumps(table))


@pytest.mark.parametrize(
    ("case", "error", "fragments"),
    [
        pytest.param(case, error, fragments, id=case)
        for case, _, _, error, fragments in DJANGO_CASES
    ],
)
def test_django_refuses_bad_settings_and_arguments(
    django_results: dict[str, Any], case: str, error: str, fragments: tuple[str, ...]
) -> None:
    found = django_results[case]
    assert found is not None, f"{case}: accepted"
    assert found["class"] == error, found
    for fragment in fragments:
        assert fragment in found["message"], (fragment, found["message"][:300])
    if error != "TaskResultDoesNotExist":  # its message is the id asked for, as in Django
        assert len(found["message"]) < 1000
    if error == "ValidationError":
        assert found["value_error"]
    assert django_results["jobs_after"] == django_results["jobs_before"]


@pytest.mark.parametrize(
    ("modules", "fragments"),
    [
        (["django_project.no_such_jobs"], ["'django_project.no_such_jobs'", "no module named"]),
        (["nowhere_pkg.jobs"], ["'nowhere_pkg.jobs'", "nowhere_pkg"]),
        (
            ["django_project.awa_jobs", "missing_one", "missing_two"],
            ["'missing_one'", "'missing_two'"],
        ),
    ],
    ids=["missing-module", "missing-package", "two-missing"],
)
def test_manage_check_names_each_task_module_that_cannot_be_imported(
    database_url: str, conn: Conn, modules: list[str], fragments: list[str]
) -> None:
    before = snapshot(conn)
    done = manage(django_env(database_url, AWA={"TASK_MODULES": modules}), "check")
    assert done.returncode != 0
    assert "awa.E002" in done.stderr
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr
    assert done.stderr.count("awa.E002") == len(modules) - modules.count("django_project.awa_jobs")
    assert snapshot(conn) == before


def test_manage_check_passes_with_importable_task_modules(database_url: str) -> None:
    """The control: the project's own TASK_MODULES pass (and are not imported by check)."""
    done = manage(django_env(database_url), "check")
    assert done.returncode == 0, done.stderr
    assert "awa.E00" not in done.stderr


def test_awa_worker_names_a_missing_task_module(database_url: str, conn: Conn) -> None:
    env = django_env(database_url, AWA={"TASK_MODULES": ["django_project.no_such_jobs"]})
    done = manage(env, "awa_worker")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "TASK_MODULES" in done.stderr
    assert "'django_project.no_such_jobs'" in done.stderr
    assert count_jobs(conn) == 0
    assert conn.execute("SELECT count(*) FROM awa.runtimes").fetchone() == (0,)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e300"])
def test_awa_worker_refuses_a_bad_shutdown_timeout(database_url: str, value: str) -> None:
    done = manage(django_env(database_url), "awa_worker", "--shutdown-timeout", value)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "--shutdown-timeout" in done.stderr


# FastAPI and Starlette -----------------------------------------------------------------------


PREFIXES: dict[str, Any] = {
    "root": "/",
    "empty": "",
    "dotdot": "/../x",
    "dot": "/./awa",
    "double-slash": "/a//b",
    "nul": "/a\x00",
    "space": "/a b",
    "percent": "/a%2fb",
    "query": "/a?b",
    "control": "/a\nb",
    "surrogate": "/a\ud800",
    "10000-chars": "/" + "x" * 10_000,
    "int": 5,
}


@pytest.mark.parametrize("prefix", list(PREFIXES.values()), ids=list(PREFIXES))
async def test_mount_refuses_a_prefix_that_is_not_a_plain_path(
    client: awa.AsyncClient, prefix: Any
) -> None:
    app = Starlette()
    routes = list(app.routes)
    with pytest.raises(awa.ValidationError) as caught:
        mount(app, client, prefix=prefix, allow_unsigned_callbacks=True)
    assert isinstance(caught.value, ValueError)
    assert_names(caught.value, "prefix")
    assert app.routes == routes  # nothing mounted


@pytest.mark.parametrize("prefix", ["/awa", "awa/", "/ops/awa-ui", "/v1.2/~ops"])
async def test_mount_takes_plain_prefixes(client: awa.AsyncClient, prefix: str) -> None:
    app = Starlette()
    mount(app, client, prefix=prefix)
    assert [route.path for route in app.routes] == ["/" + prefix.strip("/")]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        *(("shutdown_timeout", value) for value in SECONDS.values()),
        *(("worker", value) for value in FLAGS.values()),
        *(("migrate", value) for value in FLAGS.values()),
    ],
)
async def test_lifespan_refuses_bad_arguments_before_the_app_starts(
    client: awa.AsyncClient, conn: Conn, argument: str, value: Any
) -> None:
    before = snapshot(conn)
    with pytest.raises(awa.ValidationError) as caught:
        lifespan(client, {"default": 1}, **{argument: value})
    assert_names(caught.value, argument)
    with pytest.raises(awa.ValidationError) as caught:
        async with running(client, {"default": 1}, **{argument: value}):
            pass
    assert_names(caught.value, argument)
    assert client.runtime is None
    assert snapshot(conn) == before


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"ui": "yes"}, "ui"),
        ({"read_only": 1}, "read_only"),
        ({"allow_unsigned_callbacks": "no"}, "allow_unsigned_callbacks"),
    ],
)
async def test_mount_refuses_flags_that_are_not_bools(
    client: awa.AsyncClient, options: dict[str, Any], argument: str
) -> None:
    app = Starlette()
    with pytest.raises(awa.ValidationError) as caught:
        mount(app, client, **options)
    assert_names(caught.value, argument)
    assert app.routes == []


def test_lifespan_needs_an_async_client(sync_client: awa.Client) -> None:
    with pytest.raises(awa.ValidationError, match="AsyncClient"):
        lifespan(sync_client)  # type: ignore[arg-type]
