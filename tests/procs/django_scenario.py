"""Django task scenarios for tests/test_django.py, one per run of this script.

Run with DJANGO_SETTINGS_MODULE=django_project.settings, tests/ on PYTHONPATH and
AWA_TEST_DB set: ``python django_scenario.py NAME [JSON]``. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import django

django.setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from awa import bridge  # noqa: E402
from awa.contrib.django import AwaTaskBackend, compat, conf  # noqa: E402
from django_project import tasks  # noqa: E402
from django_project.awa_jobs import Ping  # noqa: E402

DEADLINE = 30.0


class Rollback(Exception):
    pass


def finished(result: Any) -> Any:
    """Poll the result until it is finished (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        result.refresh()
        if result.is_finished:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"result {result.id} still {result.status} after {DEADLINE}s")
        time.sleep(0.02)


def describe(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": result.id,
        "status": str(result.status),
        "task": result.task.module_path,
        "priority": result.task.priority,
        "queue_name": result.task.queue_name,
        "run_after": result.task.run_after.isoformat() if result.task.run_after else None,
        "backend": result.backend,
        "args": result.args,
        "kwargs": result.kwargs,
        "attempts": result.attempts,
        "enqueued": result.enqueued_at is not None,
        "started": result.started_at is not None,
        "finished": result.finished_at is not None,
        "errors": [
            {"class": error.exception_class_path, "traceback": error.traceback}
            for error in result.errors
        ],
    }
    if str(result.status) == "SUCCESSFUL":
        out["return_value"] = result.return_value
    return out


def error_of(call: Callable[[], Any]) -> dict[str, str] | None:
    try:
        call()
    except Exception as error:
        return {"class": type(error).__name__, "message": str(error)}
    return None


def rollback() -> dict[str, Any]:
    try:
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            inside = compat.task_backends["default"].get_result(result.id).status
            raise Rollback
    except Rollback:
        pass
    after = error_of(lambda: tasks.add.get_result(result.id))
    return {"id": result.id, "status": str(result.status), "inside": str(inside), "after": after}


def commit() -> dict[str, Any]:
    with transaction.atomic():
        added = tasks.add.enqueue(2, 3)
        report = tasks.report.enqueue("q3", pages=4)
    awaited = asyncio.run(tasks.add.aenqueue(5, 8))
    multiplied = tasks.multiply.enqueue(6, 7)
    attempt = tasks.attempt_number.enqueue()
    database = tasks.database_name.enqueue()
    ping = bridge.insert_job_sync(connection, Ping("hello"), queue="default")
    results = {
        "add": added,
        "report": report,
        "aenqueue": awaited,
        "async_task": multiplied,
        "context": attempt,
        "orm": database,
    }
    out = {name: describe(finished(result)) for name, result in results.items()}
    fetched = asyncio.run(tasks.add.aget_result(added.id))
    out["aget_result"] = describe(fetched)
    out["mismatch"] = error_of(lambda: tasks.multiply.get_result(added.id))
    out["ping_id"] = ping.id
    return out


def failures() -> dict[str, Any]:
    failing = tasks.fail.enqueue("boom")
    unstorable = tasks.not_json.enqueue()
    missing = bridge.insert_job_sync(
        connection,
        {"task": "django_project.gone.nowhere", "args": [], "kwargs": {}},
        kind="django_task",
        queue="default",
        max_attempts=1,
    )
    out = {"fail": describe(finished(failing)), "not_json": describe(finished(unstorable))}
    out["missing_id"] = missing.id
    return out


def options() -> dict[str, Any]:
    later = dt.datetime(2100, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    enqueued = {
        "urgent": tasks.add.using(priority=100).enqueue(1, 1),
        "raised": tasks.add.using(priority=1).enqueue(1, 1),
        "default": tasks.add.enqueue(1, 1),
        "lowered": tasks.add.using(priority=-50).enqueue(1, 1),
        "lowest": tasks.add.using(priority=-51).enqueue(1, 1),
        "deferred": tasks.add.using(run_after=later, queue_name="reports").enqueue(1, 1),
        "report": tasks.report.enqueue("x"),
        "retrying": tasks.add.using(backend="retrying", queue_name="anywhere").enqueue(1, 1),
    }
    out = {name: result.id for name, result in enqueued.items()}
    out["fetched"] = describe(tasks.add.get_result(enqueued["deferred"].id))
    return out


def invalid() -> dict[str, Any]:
    plain = bridge.insert_job_sync(connection, Ping("not a task"), queue="default")
    backend = compat.task_backends["default"]
    return {
        "flags": {
            name: getattr(backend, name)
            for name in (
                "supports_defer",
                "supports_async_task",
                "supports_get_result",
                "supports_priority",
            )
        },
        "unknown_queue": error_of(lambda: tasks.add.using(queue_name="nope")),
        "priority_range": error_of(lambda: tasks.add.using(priority=101)),
        "naive_run_after": error_of(lambda: tasks.add.using(run_after=dt.datetime(2100, 1, 1))),
        "not_json_args": error_of(lambda: tasks.add.enqueue(object(), 1)),
        "unknown_id": error_of(lambda: backend.get_result("987654321")),
        "bad_id": error_of(lambda: backend.get_result("not-an-id")),
        "other_kind": error_of(lambda: backend.get_result(str(plain.id))),
        "invalid_task_class": compat.InvalidTask.__name__,
    }


BAD_AWA: dict[str, Any] = {
    "not_a_dict": ["default"],
    "unknown_key": {"QUEUS": {"default": 1}},
    "both": {"DATABASE": "default", "URL": "postgresql://localhost/x"},
    "unknown_alias": {"DATABASE": "other"},
    "not_postgres": {"DATABASE": "lite"},
    "bad_url": {"URL": "mysql://localhost/x"},
    "queues_type": {"QUEUES": "default"},
    "queues_option": {"QUEUES": {"default": {"max_worker": 2}}},
    "runtime_key": {"RUNTIME": {"heartbeat": 1}},
    "weighted_without_queues": {"RUNTIME": {"global_max_workers": 4}},
    "timeout": {"SHUTDOWN_TIMEOUT": -1},
    "modules": {"TASK_MODULES": "django_project.awa_jobs"},
    "migrate_flag": {"MIGRATE": "yes"},
}


def bad_settings() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in BAD_AWA.items():
        with override_settings(AWA=value):
            out[name] = error_of(conf.load)
    for name, params in {
        "option_key": {"OPTIONS": {"MAX_ATTEMPT": 3}},
        "max_attempts": {"OPTIONS": {"MAX_ATTEMPTS": 0}},
        "deadline": {"OPTIONS": {"DEADLINE_DURATION": "soon"}},
    }.items():
        out[name] = error_of(lambda params=params: AwaTaskBackend("default", params))
    out["improperly_configured"] = ImproperlyConfigured.__name__
    return out


def _hostile_call(surface: str, value: Any) -> Any:
    if surface == "awa_settings":
        with override_settings(AWA=value):
            return conf.load()
    if surface == "backend_options":
        return AwaTaskBackend("hostile", {"OPTIONS": value})
    if surface == "queue_name":
        return tasks.add.using(backend="retrying", queue_name=value).enqueue(1, 1)
    if surface == "args":
        return tasks.add.enqueue(value, 1)
    if surface == "get_result":
        return compat.task_backends["default"].get_result(value)
    raise AssertionError(f"unknown surface {surface!r}")


def hostile() -> dict[str, Any]:
    """Each case of the JSON table in argv[2] ({"id", "surface", "value"}): the error it
    raised (class, message, whether a ValueError), and the jobs counted before and after."""
    table = json.loads(sys.argv[2])
    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM awa.jobs")
        out["jobs_before"] = cursor.fetchone()[0]
    for case in table:
        try:
            _hostile_call(case["surface"], case["value"])
        except Exception as error:
            out[case["id"]] = {
                "class": type(error).__name__,
                "message": str(error)[:2000],
                "value_error": isinstance(error, ValueError),
            }
        else:
            out[case["id"]] = None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM awa.jobs")
        out["jobs_after"] = cursor.fetchone()[0]
    return out


def separate_database() -> dict[str, Any]:
    try:
        with transaction.atomic():
            result = tasks.add.enqueue(20, 22)
            raise Rollback
    except Rollback:
        pass
    return {"result": describe(finished(result))}


def hold() -> dict[str, Any]:
    return {"id": tasks.hold.enqueue(os.environ["AWA_TEST_RELEASE"]).id}


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "rollback": rollback,
    "commit": commit,
    "failures": failures,
    "options": options,
    "invalid": invalid,
    "bad_settings": bad_settings,
    "separate_database": separate_database,
    "hold": hold,
    "hostile": hostile,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](), default=str))
