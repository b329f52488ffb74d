"""Django task results from awa job rows, and the job that carries a Django task.

A task is one awa job of kind ``django_task`` whose args hold the task's import path, its
args and kwargs, and what the result reports about the task (backend, priority,
run_after). The row then answers for the result: its state is the status, its output the
return value, its errors the task's errors.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.module_loading import import_string

from awa.contrib.django import compat
from awa.model import JobRow, JobState

_READY = (JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE)
_RUNNING = (JobState.RUNNING, JobState.WAITING_EXTERNAL)
_FAILED = (JobState.FAILED, JobState.CANCELLED)

# The head of a stored error names the exception's class: "module.Name: message", or
# "Name: message" for builtins.
_ERROR_CLASS = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
_NO_CLASS = "awa.errors.AwaError"  # for errors awa wrote itself (a rescue, a cancellation)


def job_args(task: Any, args: Any, kwargs: Any, backend: str) -> dict[str, Any]:
    """The awa job args of one enqueue of ``task`` (TypeError: args that JSON cannot hold,
    as Django's own backends raise)."""
    run_after = task.run_after
    return {
        "task": task.module_path,
        "args": compat.normalize_json(list(args)),
        "kwargs": compat.normalize_json(dict(kwargs)),
        "backend": backend,
        "priority": task.priority,
        "run_after": run_after.isoformat() if run_after is not None else None,
    }


def load_task(args: dict[str, Any], queue: str) -> Any:
    """The Task a job runs, as it was enqueued. ImportError when its module or name cannot
    be imported here; TypeError when the path names something that is not a task."""
    path = args.get("task")
    if not isinstance(path, str):
        raise TypeError(f"the job's args name no task (task is {path!r})")
    try:
        found = import_string(path)
    except ImportError as error:
        raise ImportError(f"cannot import the task {path!r}: {error}") from error
    if not isinstance(found, compat.Task):
        raise TypeError(f"{path!r} is a {type(found).__name__}, not a task (use @task)")
    run_after = args.get("run_after")
    return dataclasses.replace(
        found,
        priority=args.get("priority", found.priority),
        queue_name=queue,
        run_after=dt.datetime.fromisoformat(run_after) if run_after else None,
        backend=args.get("backend", found.backend),
    )


def status(state: JobState) -> Any:
    """The TaskResultStatus of a job state: waiting to run (again) is READY, running or
    parked on a callback RUNNING, completed SUCCESSFUL, failed or cancelled FAILED."""
    if state in _READY:
        return compat.TaskResultStatus.READY
    if state in _RUNNING:
        return compat.TaskResultStatus.RUNNING
    if state in _FAILED:
        return compat.TaskResultStatus.FAILED
    return compat.SUCCESSFUL


def task_error(entry: dict[str, Any]) -> Any:
    """One entry of the job's errors as a TaskError: the exception's class path and the
    text awa stored (the exception's message and the end of its traceback)."""
    text = str(entry.get("error", ""))
    match = _ERROR_CLASS.match(text)
    path = match.group(1) if match else _NO_CLASS
    if "." not in path:
        path = f"builtins.{path}"
    return compat.TaskError(exception_class_path=path, traceback=text)


def _when(value: dt.datetime | None) -> dt.datetime | None:
    # Django without time zone support expects naive times in its TIME_ZONE.
    if value is None or settings.USE_TZ:
        return value
    naive: dt.datetime = timezone.make_naive(value)
    return naive


def task_result(task: Any, row: JobRow, args: dict[str, Any]) -> Any:
    """The TaskResult that ``row`` (a job of ``task``) stands for."""
    result = compat.TaskResult(
        task=task,
        id=str(row.id),
        status=status(row.state),
        enqueued_at=_when(row.created_at),
        started_at=_when(row.attempted_at),
        finished_at=_when(row.finalized_at) if row.state.is_terminal else None,
        last_attempted_at=_when(row.attempted_at),
        args=args.get("args", []),
        kwargs=args.get("kwargs", {}),
        backend=task.backend,
        errors=[task_error(entry) for entry in row.errors or []],
        # awa does not record which worker ran an attempt: one placeholder per attempt
        # keeps `attempts` (the list's length) right.
        worker_ids=[f"attempt-{n}" for n in range(1, row.attempt + 1)],
    )
    if row.state is JobState.COMPLETED:
        object.__setattr__(result, "_return_value", row.output)
    return result
